"""KvdConnector driven in vLLM's call order by stand-in engines (standins.py) with CPU torch
caches through kvd: embedded kvd cores (kvd.Daemon, transport local) and two build/bin/kvd
processes, all holding a peer secret, so that kvd requires transfer tokens (SECURITY.md). The
prefill engine writes K/V, the decode engine loads it; every element is checked with torch
indexing and both engines end with every block free. Every wait is bounded."""

import os
import secrets
import tempfile
import time

import pytest
import torch

import kvd
import kvd.vllm as kv
from kvd.daemon import KvdProcess

from standins import Engine, Group, Request, RequestStatus, check_loaded

TIMEOUT = 20.0


def write_secret(folder) -> str:
    """A peer secret file (--auth-secret-file): 32 random bytes, mode 0600."""
    path = os.path.join(str(folder), "peer.secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32))
    return path


@pytest.fixture
def daemons(tmp_path):
    """Embedded kvds with a peer secret: transfer tokens are required."""
    secret = write_secret(tmp_path)
    p = kvd.Daemon(name="prefill-node", transport="local", auth_secret_file=secret)
    d = kvd.Daemon(name="decode-node", transport="local", auth_secret_file=secret)
    kv.register_embedded_daemon("p", p)
    kv.register_embedded_daemon("d", d)
    yield p, d
    kv.register_embedded_daemon("p", None)
    kv.register_embedded_daemon("d", None)
    p.stop()
    d.stop()


def _prompt(seed, n):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 32000, (n,), generator=g).tolist()


def drive(engines, until, what, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not until():
        for e in engines:
            e.step()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.001)


def wants_held(daemon) -> int:
    """Peers' Wants the kvd (an embedded kvd.Daemon or a KvdProcess) holds until their request's
    transfer token is known."""
    if isinstance(daemon, KvdProcess):
        probe = kvd.Connector(socket=daemon.socket, instance="probe")
    else:
        probe = kvd.Connector(daemon=daemon, instance="probe")
    with probe:
        return int(probe.status().get("wants_held", 0))


def run_pd(prefill, decode, requests=3, prompt_len=40, decode_tokens=3, seed=1,
           on_loaded=None, decode_first=None):
    """P/D through the proxy's flow: prefill with do_remote_decode and max_tokens 1, its
    kv_transfer_params to the decode engine; each decode request is checked once it runs.
    decode_first (the prefill kvd): the decode engine alone steps until the prefill kvd holds
    every decode Want, which so comes before the prefill workers finish the requests in kvd
    with their transfer tokens (vLLM hands the params out a scheduler step earlier)."""
    reqs = [Request(f"req-{seed}-{i}", _prompt(seed * 100 + i, prompt_len), max_tokens=1,
                    kv_transfer_params={"do_remote_decode": True})
            for i in range(requests)]
    for r in reqs:
        prefill.add_request(r)
    drive([prefill], lambda: all(r.request_id in prefill.outputs for r in reqs),
          "the prefill to finish")
    dreqs = []
    for r in reqs:
        params = prefill.outputs[r.request_id]
        assert params is not None and params["do_remote_prefill"] is True
        for k in ("remote_engine_id", "remote_request_id", "remote_block_ids", "remote_host",
                  "remote_port", "tp_size", "remote_num_tokens", "transfer_mode",
                  "kvd_peer_address", "kvd_layout", "kvd_protocol"):
            assert k in params, k
        assert params["remote_num_tokens"] == prompt_len
        assert len(params["kvd_transfer_token"]) == 32  # 128 bits, hex
        dreqs.append(Request(f"d-{r.request_id}", r.prompt_token_ids, max_tokens=decode_tokens,
                             kv_transfer_params=dict(params)))
        decode.add_request(dreqs[-1])
    if decode_first is not None:
        drive([decode], lambda: wants_held(decode_first) == len(reqs),
              "the decode's Wants to wait in the prefill kvd")
    checked = set()

    def progress():
        for r in decode.running:
            if r.request_id not in checked:
                check_loaded(decode, r, prompt_len, r.kv_transfer_params.get("kvd_skip_tokens"))
                if on_loaded:
                    on_loaded(r)
                checked.add(r.request_id)
        return not prefill.busy() and not decode.busy()
    drive([prefill, decode], progress, "both engines to finish")
    assert checked == {r.request_id for r in dreqs}
    for r in dreqs:
        assert r.status == RequestStatus.FINISHED_LENGTH_CAPPED
    prefill.assert_empty()
    decode.assert_empty()
    return reqs, dreqs


def engines(p_extra, d_extra, p_groups, d_groups, p_tp=1, d_tp=1, **kw):
    prefill = Engine("prefill", "kv_producer", p_extra, p_groups, tp=p_tp, **kw)
    try:
        decode = Engine("decode", "kv_consumer", d_extra, d_groups, tp=d_tp, **kw)
    except BaseException:
        prefill.shutdown()
        raise
    return prefill, decode


CASES = {
    "push": ([Group()], [Group()], 1, 1, "push"),
    "pull": ([Group()], [Group(order="BLNHC")], 1, 1, "pull"),
    "tp1_to_tp2": ([Group()], [Group(order="LBHNC")], 1, 2, "push"),
    "tp2_to_tp1": ([Group(order="LBHNC")], [Group(order="BLNHC")], 2, 1, "pull"),
    "block16_to_block32": ([Group()], [Group(block_size=32)], 1, 1, "push"),
    "full_and_sliding_window": ([Group(), Group(kind="swa")],
                                [Group(order="BLHNC"),
                                 Group(kind="swa", order="BLHNC", block_size=32)], 1, 1, "push"),
    "mla_tp1_to_tp2": ([Group(kind="mla", heads=1, head_dim=36)],
                       [Group(kind="mla", heads=1, head_dim=36)], 1, 2, "pull"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pd_embedded(daemons, case):
    pg, dg, ptp, dtp, mode = CASES[case]
    prefill, decode = engines({"kvd_embedded": "p", "mode": mode},
                              {"kvd_embedded": "d", "mode": mode}, pg, dg, ptp, dtp)
    try:
        run_pd(prefill, decode)
        assert sum(w.stats["loads"] for w in decode.workers) == 3 * dtp
        assert all(w.stats["load_failures"] == 0 for w in decode.workers)
    finally:
        prefill.shutdown()
        decode.shutdown()


def test_pd_with_spinning_worker_connectors(daemons):
    """kvd_busy_poll: the workers' connectors spin on kvd's socket and in their waits; requests
    move and verify as they do sleeping, and the schedulers' connectors stay asleep."""
    prefill, decode = engines({"kvd_embedded": "p", "kvd_busy_poll": "true"},
                              {"kvd_embedded": "d", "kvd_busy_poll": True, "mode": "pull"},
                              [Group()], [Group(order="BLNHC")])
    try:
        assert prefill.workers[0].kvd_config.busy_poll and decode.workers[0].kvd_config.busy_poll
        run_pd(prefill, decode)
        assert sum(w.stats["loads"] for w in decode.workers) == 3
        assert all(w.stats["load_failures"] == 0 for w in decode.workers)
    finally:
        prefill.shutdown()
        decode.shutdown()


def test_sliding_window_moves_its_tail(daemons):
    """A 600-token prompt with a 32-token sliding-window group: that group moves only from
    token 512 on (whole 256-token units before the window), the full group everything."""
    groups = [Group(), Group(kind="swa", window=32)]
    prefill, decode = engines({"kvd_embedded": "p"}, {"kvd_embedded": "d"}, groups,
                              [Group(order="BLHNC"), Group(kind="swa", order="BLHNC",
                                                             window=32, block_size=32)],
                              blocks=100)
    def untouched(r):  # the decode side's blocks before the window were never written
        ids = decode.blocks[r.request_id][1][:512 // 32]
        for name in groups[1].names(1):
            assert not decode.ranks[0][1][name][ids].view(torch.int16).any()
        untouched.calls += 1
    untouched.calls = 0
    try:
        _, dreqs = run_pd(prefill, decode, requests=1, prompt_len=600, on_loaded=untouched)
        assert dreqs[0].kv_transfer_params["kvd_skip_tokens"] == [0, 512]
        assert untouched.calls == 1
    finally:
        prefill.shutdown()
        decode.shutdown()


@pytest.fixture
def processes():
    """Two kvd processes with a peer secret (--transfer-token auto: required)."""
    with tempfile.TemporaryDirectory(prefix="kvd-vllm-") as tmp:
        args = ["--lease-ms", "10000", "--heartbeat-ms", "200",
                "--auth-secret-file", write_secret(tmp)]
        p = KvdProcess("prefill", os.path.join(tmp, "p.sock"), args=args)
        try:
            d = KvdProcess("decode", os.path.join(tmp, "d.sock"), args=args)
        except BaseException:
            p.kill()
            raise
        try:
            yield p, d
        finally:
            p.kill()
            d.kill()


def test_pd_two_kvd_processes(processes):
    p, d = processes
    prefill, decode = engines({"kvd_socket": p.socket}, {"kvd_socket": d.socket},
                              [Group()], [Group(order="BLHNC")], 1, 2)
    try:
        run_pd(prefill, decode, requests=4)
    finally:
        prefill.shutdown()
        decode.shutdown()


def test_decode_want_before_the_prefill_workers_finish(processes):
    """The decode's Wants reach the prefill kvd before the prefill workers finished the
    requests there (they do so one scheduler step after vLLM handed out the params): kvd holds
    them until the workers bring the scheduler's transfer token, then serves them."""
    p, d = processes
    prefill, decode = engines({"kvd_socket": p.socket}, {"kvd_socket": d.socket},
                              [Group()], [Group(order="BLHNC")], 2, 1)
    try:
        run_pd(prefill, decode, requests=2, decode_first=p)
        assert wants_held(p) == 0
    finally:
        prefill.shutdown()
        decode.shutdown()


@pytest.mark.parametrize("token,early", [("wrong", False), ("wrong", True), ("missing", False)])
def test_wrong_or_missing_token_is_refused(daemons, capfd, caplog, token, early):
    """kv_transfer_params whose kvd_transfer_token was altered or dropped: the prefill kvd
    refuses the decode's Want (at once, or once the token is known where the Want came first),
    the decode request fails, the decode worker's log and both kvds' say why, and nothing of the
    prefill's K/V lands. The untouched params then load as usual and both engines end empty."""
    p, _ = daemons
    prefill, decode = engines({"kvd_embedded": "p"}, {"kvd_embedded": "d"}, [Group()],
                              [Group()])
    try:
        r = Request("victim", _prompt(21, 40), kv_transfer_params={"do_remote_decode": True})
        prefill.add_request(r)
        drive([prefill], lambda: "victim" in prefill.outputs, "the prefill")
        params = prefill.outputs["victim"]
        bad = dict(params, kvd_transfer_token=secrets.token_hex(16) if token == "wrong" else "")
        thief = Request("d-thief", r.prompt_token_ids, max_tokens=2, kv_transfer_params=bad)
        decode.add_request(thief)
        if early:  # the Want waits for the token in the prefill kvd
            drive([decode], lambda: wants_held(p) == 1, "the Want to wait")
        with caplog.at_level("ERROR", logger="kvd.vllm"):
            drive([prefill, decode], lambda: thief.status == RequestStatus.FINISHED_ERROR,
                  "the Want to be refused")
        assert decode.errors == {"d-thief": "load failed"}
        why = ("the transfer token does not match" if token == "wrong" else
               "the Want carries no transfer token")
        assert f"kvd: load of d-thief failed: group 0: invalid_argument: peer prefill-node: " \
            f"request victim: {why}" in caplog.text, caplog.text
        logged = capfd.readouterr().out  # the embedded kvds log to stdout
        assert f"kvd decode-node: load of victim failed: invalid_argument: peer prefill-node: " \
            f"request victim: {why}" in logged, logged
        ids = decode.blocks.get("d-thief") or []
        assert not ids  # freed, and never written:
        assert not any(v.view(torch.int16).any() for v in decode.ranks[0][1].values())

        honest = Request("d-honest", r.prompt_token_ids, max_tokens=2,
                         kv_transfer_params=dict(params))
        decode.add_request(honest)
        drive([prefill, decode], lambda: not prefill.busy() and not decode.busy(),
              "the honest load")
        assert honest.status == RequestStatus.FINISHED_LENGTH_CAPPED
        assert sum(w.stats["load_failures"] for w in decode.workers) == 1
        prefill.assert_empty()
        decode.assert_empty()
    finally:
        prefill.shutdown()
        decode.shutdown()


def test_pd_without_a_secret_still_checks_tokens():
    """kvd without a secret (loopback only, --transfer-token optional): the connector's tokens
    are still presented and checked; a wrong one is refused."""
    with kvd.Daemon(name="p0", transport="local") as p, \
            kvd.Daemon(name="d0", transport="local") as d:
        kv.register_embedded_daemon("p0", p)
        kv.register_embedded_daemon("d0", d)
        prefill, decode = engines({"kvd_embedded": "p0"}, {"kvd_embedded": "d0"}, [Group()],
                                  [Group()])
        try:
            run_pd(prefill, decode, requests=2, decode_first=p)
            r = Request("victim", _prompt(22, 40), kv_transfer_params={"do_remote_decode": True})
            prefill.add_request(r)
            drive([prefill], lambda: "victim" in prefill.outputs, "the prefill")
            bad = dict(prefill.outputs["victim"], kvd_transfer_token=secrets.token_hex(16))
            thief = Request("d-thief", r.prompt_token_ids, max_tokens=2, kv_transfer_params=bad)
            decode.add_request(thief)
            drive([prefill, decode], lambda: thief.status == RequestStatus.FINISHED_ERROR,
                  "the Want to be refused")
        finally:
            prefill.shutdown()
            decode.shutdown()
            kv.register_embedded_daemon("p0", None)
            kv.register_embedded_daemon("d0", None)


def test_prefill_kvd_killed_mid_request(processes):
    """The prefill kvd dies after the prefill finished and before the decode loaded: the decode
    engine gets the blocks back through get_block_ids_with_load_errors in the step that reports
    the request finished, fails it (kv_load_failure_policy "fail") and frees every block; the
    prefill engine frees its held blocks too; nothing hangs."""
    p, d = processes
    prefill, decode = engines({"kvd_socket": p.socket, "mode": "pull"},
                              {"kvd_socket": d.socket, "mode": "pull"}, [Group()], [Group()])
    try:
        r = Request("doomed", _prompt(5, 40), kv_transfer_params={"do_remote_decode": True})
        prefill.add_request(r)
        drive([prefill], lambda: "doomed" in prefill.outputs, "the prefill")
        p.kill()
        dr = Request("d-doomed", r.prompt_token_ids, max_tokens=3,
                     kv_transfer_params=dict(prefill.outputs["doomed"]))
        decode.add_request(dr)
        start = time.monotonic()
        drive([prefill, decode], lambda: not prefill.busy() and not decode.busy(),
              "the failure to surface")
        assert time.monotonic() - start < 15
        assert dr.status == RequestStatus.FINISHED_ERROR
        assert decode.errors == {"d-doomed": "load failed"}
        assert sum(w.stats["load_failures"] for w in decode.workers) == 1
        prefill.assert_empty()
        decode.assert_empty()
    finally:
        prefill.shutdown()
        decode.shutdown()


def test_aborted_requests(daemons):
    """A prefill request aborted after its prompt was saved, and a decode request aborted while
    its load may be in flight: blocks freed on both sides, no params for the aborted prefill."""
    prefill, decode = engines({"kvd_embedded": "p"}, {"kvd_embedded": "d"}, [Group()],
                              [Group()])
    try:
        a = Request("aborted-p", _prompt(9, 40), max_tokens=4,
                    kv_transfer_params={"do_remote_decode": True})
        b = Request("ok-p", _prompt(10, 40), kv_transfer_params={"do_remote_decode": True})
        prefill.add_request(a)
        prefill.add_request(b)
        prefill.step()  # both prompts computed and saved; b finished, a still running
        prefill.abort("aborted-p")
        assert prefill.outputs["aborted-p"] is None
        drive([prefill], lambda: "ok-p" in prefill.outputs, "the prefill")
        dr = Request("d-ok", b.prompt_token_ids, max_tokens=3,
                     kv_transfer_params=dict(prefill.outputs["ok-p"]))
        decode.add_request(dr)
        decode.step()  # the load starts
        decode.abort("d-ok")
        drive([prefill, decode], lambda: not prefill.busy() and not decode.busy(),
              "the aborted requests to settle")
        prefill.assert_empty()
        decode.assert_empty()
    finally:
        prefill.shutdown()
        decode.shutdown()


def test_offload_hit_after_engine_restart():
    """A finished request's full blocks go to kvd's pool; a new engine on the same kvd (a
    restart) finds the prefix there, loads it layer by layer, and computes only the rest."""
    with kvd.Daemon(name="node", transport="local", offload_bytes=8 << 20) as node:
        kv.register_embedded_daemon("node", node)
        prompt = _prompt(42, 56)
        first = Engine("first", "kv_both", {"kvd_embedded": "node", "offload": True}, [Group()])
        try:
            first.add_request(Request("a", prompt))
            drive([first], lambda: not first.busy(), "the store")
            first.assert_empty()
            assert sum(w.stats["stores"] for w in first.workers) == 1
        finally:
            first.shutdown()
        second = Engine("second", "kv_both", {"kvd_embedded": "node", "offload": True},
                        [Group()])
        try:
            r = Request("b", prompt, max_tokens=2)
            n, load_async = second.connector.get_num_new_matched_tokens(r, 0)
            assert (n, load_async) == (48, False)  # 3 of 3 full blocks, one token recomputed
            second.add_request(r)
            so = second.step()
            assert so.has_sync_kv_loads
            check_loaded(second, r, 56)
            assert sum(w.stats["offload_loads"] for w in second.workers) == 1
            drive([second], lambda: not second.busy(), "the second engine")
            second.assert_empty()
        finally:
            second.shutdown()
            kv.register_embedded_daemon("node", None)


def test_incompatible_layout_fails_the_request(daemons, caplog):
    prefill, decode = engines({"kvd_embedded": "p"}, {"kvd_embedded": "d"}, [Group(heads=4)],
                              [Group(heads=2)])
    try:
        r = Request("mismatch", _prompt(3, 40), kv_transfer_params={"do_remote_decode": True})
        prefill.add_request(r)
        drive([prefill], lambda: "mismatch" in prefill.outputs, "the prefill")
        dr = Request("d-mismatch", r.prompt_token_ids, max_tokens=2,
                     kv_transfer_params=dict(prefill.outputs["mismatch"]))
        decode.add_request(dr)
        with caplog.at_level("ERROR", logger="kvd.vllm"):
            drive([decode], lambda: not decode.busy(), "the decode")
        assert dr.status == RequestStatus.FINISHED_ERROR
        assert "total_kv_heads 4 (prefill) != 2 (decode)" in caplog.text
        decode.assert_empty()
    finally:
        prefill.shutdown()
        decode.shutdown()


def test_bad_config_is_refused(tmp_path):
    base = {"kv_role": "kv_producer", "engine_id": "e"}
    with pytest.raises(kv.ConfigError, match="mode must be one of"):
        kv.parse_config({**base, "kv_connector_extra_config": {"kvd_embedded": "x",
                                                               "mode": "teleport"}})
    with pytest.raises(kv.ConfigError, match="no kvd socket at"):
        kv.parse_config({**base, "kv_connector_extra_config": {
            "kvd_socket": str(tmp_path / "missing.sock")}})
    with pytest.raises(kv.ConfigError, match="exactly one of kvd_socket"):
        kv.parse_config({**base, "kv_connector_extra_config": {}})
    with pytest.raises(kv.ConfigError, match="unknown key"):
        kv.parse_config({**base, "kv_connector_extra_config": {"kvd_embedded": "x",
                                                               "offlaod": True}})
    with pytest.raises(kv.ConfigError, match="kvd_busy_poll must be true or false"):
        kv.parse_config({**base, "kv_connector_extra_config": {"kvd_embedded": "x",
                                                               "kvd_busy_poll": "spin"}})
    assert not kv.parse_config({**base, "kv_connector_extra_config": {"kvd_embedded": "x"}}
                               ).busy_poll
    with pytest.raises(kv.ConfigError, match="kv_role"):
        kv.parse_config({"kv_connector_extra_config": {"kvd_embedded": "x"}})


def test_class_declarations_and_version_gate():
    assert kv.KvdConnector.get_required_kvcache_layout(None) is None
    assert kv.KvdConnector.requires_piecewise_for_cudagraph({"mode": "push"})
    assert not kv.KvdConnector.requires_piecewise_for_cudagraph({"mode": "pull"})
    from kvd.vllm._compat import check_version
    check_version("0.33.0")
    with pytest.raises(RuntimeError, match="needs vLLM >= 0.27.0"):
        check_version("0.20.1")


def test_lease_frees_prefill_blocks_without_a_decode(tmp_path):
    """Nobody loads a finished prefill request: the prefill kvd's lease ends, the worker
    reports the request sent and vLLM gets the blocks back."""
    with KvdProcess("short-lease", str(tmp_path / "p.sock"), args=["--lease-ms", "300"]) as p:
        prefill = Engine("prefill", "kv_producer", {"kvd_socket": p.socket}, [Group()])
        try:
            prefill.add_request(Request("orphan", _prompt(8, 40),
                                        kv_transfer_params={"do_remote_decode": True}))
            start = time.monotonic()
            drive([prefill], lambda: "orphan" in prefill.outputs and not prefill.busy(),
                  "the lease to end", timeout=10)
            assert time.monotonic() - start >= 0.2
            prefill.assert_empty()
        finally:
            prefill.shutdown()


def test_decode_abort_holds_blocks_while_a_write_may_land(tmp_path):
    """A decode request aborted while its load waits on a prefill that never saves (params
    naming a request the prefill kvd does not have yet: kvd waits for it): vLLM gets its blocks
    back only once kvd ended the load (here: the prefill kvd's 500 ms lease), never before."""
    with KvdProcess("p", str(tmp_path / "p.sock"), args=["--lease-ms", "500"]) as p, \
            KvdProcess("d", str(tmp_path / "d.sock")) as d:
        prefill, decode = engines({"kvd_socket": p.socket}, {"kvd_socket": d.socket},
                                  [Group()], [Group()])
        try:
            r = Request("real", _prompt(12, 40), kv_transfer_params={"do_remote_decode": True})
            prefill.add_request(r)
            drive([prefill], lambda: "real" in prefill.outputs, "the prefill")
            params = dict(prefill.outputs["real"], remote_request_id="never-saved")
            dr = Request("d-never", r.prompt_token_ids, max_tokens=2, kv_transfer_params=params)
            decode.add_request(dr)
            decode.step()  # the load starts and waits
            assert dr.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            decode.abort("d-never")
            decode.step()
            assert "d-never" in decode.held and decode.busy()  # blocks still held
            start = time.monotonic()
            drive([prefill, decode], lambda: not prefill.busy() and not decode.busy(),
                  "the load to end", timeout=10)
            assert time.monotonic() - start > 0.1
            prefill.assert_empty()
            decode.assert_empty()
        finally:
            prefill.shutdown()
            decode.shutdown()


def test_prefill_kvd_killed_while_the_load_waits(processes):
    """The decode's load is in flight (waiting on the prefill kvd for a request it has not
    saved) when the prefill kvd is SIGKILLed: the decode kvd notices (heartbeats), the load
    fails, the request's blocks come back as load errors and it finishes with an error."""
    p, d = processes
    prefill, decode = engines({"kvd_socket": p.socket}, {"kvd_socket": d.socket}, [Group()],
                              [Group()])
    try:
        r = Request("first", _prompt(13, 40), kv_transfer_params={"do_remote_decode": True})
        prefill.add_request(r)
        drive([prefill], lambda: "first" in prefill.outputs, "the prefill")
        params = dict(prefill.outputs["first"], remote_request_id="in-flight")
        dr = Request("d-in-flight", r.prompt_token_ids, max_tokens=2, kv_transfer_params=params)
        decode.add_request(dr)
        decode.step()
        decode.step()
        assert dr.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        p.kill()
        start = time.monotonic()
        drive([prefill, decode], lambda: not prefill.busy() and not decode.busy(),
              "the failure to surface", timeout=15)
        assert time.monotonic() - start < 15
        assert dr.status == RequestStatus.FINISHED_ERROR
        prefill.assert_empty()
        decode.assert_empty()
    finally:
        prefill.shutdown()
        decode.shutdown()


def test_stats(daemons):
    prefill, decode = engines({"kvd_embedded": "p"}, {"kvd_embedded": "d"}, [Group()],
                              [Group()])
    try:
        run_pd(prefill, decode, requests=2)
        s = decode.workers[0].get_kv_connector_stats()
        assert s.reduce()["loads"] == 2 and s.reduce()["load_failures"] == 0
        assert decode.workers[0].get_kv_connector_stats() is None  # nothing since
        p = prefill.workers[0].get_kv_connector_stats()
        agg = kv.KvdConnector.build_kv_connector_stats(p.data).aggregate(p)
        assert agg.reduce()["sends"] == 4
    finally:
        prefill.shutdown()
        decode.shutdown()
