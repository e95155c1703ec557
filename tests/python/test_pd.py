"""P/D from Python through libkvconnector.so with CPU tensors: embedded kvd cores (the `local`
transport) for the layout and TP cases, two kvd processes (build/bin/kvd) for the process cases
and a prefill kvd SIGKILLed mid-run. Every element is compared with torch indexing."""

import os
import tempfile
import time

import pytest
import torch

import kvd
from kvd.daemon import KvdProcess

from pd_util import Shape, check_request, make_engine, run_pd, wait_for

CASES = {
    "plain_push": (Shape(), Shape(), 1, 1, "push"),
    "plain_pull": (Shape(), Shape(), 1, 1, "pull"),
    "tp1_to_2": (Shape(), Shape(), 1, 2, "push"),
    "tp2_to_1": (Shape(), Shape(), 2, 1, "pull"),
    "lbnhc_to_blhnc": (Shape(), Shape(order="BLHNC"), 1, 1, "push"),
    "block16_to_32": (Shape(), Shape(block_size=32, blocks=12), 1, 1, "push"),
    "mla_tp1_to_2": (Shape(mla=True), Shape(mla=True, order="BLNHC"), 1, 2, "pull"),
    "legacy_to_lbnhc": (Shape(legacy=True), Shape(), 1, 1, "push"),
    "padded_pages_with_config": (Shape(pad_bytes=64, with_config=True),
                                 Shape(order="BLNHC", pad_bytes=128, with_config=True), 1, 2,
                                 "push"),
    "everything": (Shape(order="LHBNC"), Shape(order="BHLNC", block_size=32, blocks=12), 2, 1,
                   "pull"),
}


@pytest.fixture
def daemons():
    p = kvd.Daemon(name="prefill-node", transport="local")
    d = kvd.Daemon(name="decode-node", transport="local")
    yield p, d
    p.stop()
    d.stop()


def write_secret(folder) -> str:
    """A peer secret file (--auth-secret-file): 32 random bytes, mode 0600."""
    path = os.path.join(str(folder), "peer.secret")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32))
    return path


@pytest.mark.parametrize("case", ["plain_push", "plain_pull", "tp1_to_2", "tp2_to_1"])
def test_engine_chosen_tokens_with_a_secret(tmp_path, case):
    """Transfer tokens required (a peer secret): the decode ranks load with a token the engines
    chose before any prefill rank saved (vLLM's scheduler mints it); the prefill kvd holds their
    Wants until the prefill ranks finish the requests with the same token, then serves them."""
    src_shape, dst_shape, ptp, dtp, mode = CASES[case]
    secret = write_secret(tmp_path)
    with kvd.Daemon(name="prefill-node", transport="local", auth_secret_file=secret) as p, \
            kvd.Daemon(name="decode-node", transport="local", auth_secret_file=secret) as d:
        prefill = [make_engine(kvd.Connector(daemon=p, instance="prefill", tp_rank=r,
                                             tp_size=ptp, timeout=10), src_shape, seed=11 + r)
                   for r in range(ptp)]
        decode = [make_engine(kvd.Connector(daemon=d, instance="decode", tp_rank=r,
                                            tp_size=dtp, timeout=10), dst_shape)
                  for r in range(dtp)]
        try:
            run_pd(prefill, decode, p.address, mode=mode, engine_tokens=True)
            # Without a token nothing is served (every decode rank asks: kvd waits for all).
            for e in decode:
                e.connector.start_load("nothing", kvd.TransferParams(peer_address=p.address),
                                       [0], tokens=16)
            with pytest.raises(kvd.KvdError, match="carries no transfer token"):
                decode[0].connector.wait_layer("nothing", 0)
        finally:
            for e in prefill + decode:
                e.connector.close()


@pytest.mark.parametrize("case", ["plain_push", "tp1_to_2", "tp2_to_1"])
def test_tokens_fixed_early_stream_with_a_secret(tmp_path, case):
    """Transfer tokens required (a peer secret), the token fixed when the prefill starts
    (set_transfer_token, as behind a router that mints it): in push mode every decode rank has
    layer 0 before any prefill rank saved layer 1; a token another rank fixed differently fails
    the request."""
    src_shape, dst_shape, ptp, dtp, mode = CASES[case]
    secret = write_secret(tmp_path)
    with kvd.Daemon(name="prefill-node", transport="local", auth_secret_file=secret) as p, \
            kvd.Daemon(name="decode-node", transport="local", auth_secret_file=secret) as d:
        prefill = [make_engine(kvd.Connector(daemon=p, instance="prefill", tp_rank=r,
                                             tp_size=ptp, timeout=10), src_shape, seed=11 + r)
                   for r in range(ptp)]
        decode = [make_engine(kvd.Connector(daemon=d, instance="decode", tp_rank=r,
                                            tp_size=dtp, timeout=10), dst_shape)
                  for r in range(dtp)]
        try:
            run_pd(prefill, decode, p.address, mode=mode, early_tokens=True)
            first = prefill[0].connector
            first.set_transfer_token("mismatch", "ab" * 16)
            first.save_layer("mismatch", 0, [0])
            first.set_transfer_token("mismatch", "cd" * 16)  # one-way: refused by kvd
            with pytest.raises(kvd.KvdError, match="different transfer tokens"):
                first.request_finished("mismatch")
            with pytest.raises(kvd.InvalidArgumentError):
                first.set_transfer_token("short", "ab" * 4)
        finally:
            for e in prefill + decode:
                e.connector.close()


@pytest.mark.parametrize("case", list(CASES))
def test_embedded(daemons, case):
    src_shape, dst_shape, ptp, dtp, mode = CASES[case]
    p, d = daemons
    prefill = [make_engine(kvd.Connector(daemon=p, instance="prefill", tp_rank=r, tp_size=ptp,
                                         timeout=10), src_shape, seed=11 + r) for r in range(ptp)]
    decode = [make_engine(kvd.Connector(daemon=d, instance="decode", tp_rank=r, tp_size=dtp,
                                        timeout=10), dst_shape) for r in range(dtp)]
    try:
        params = run_pd(prefill, decode, p.address, mode=mode)
        first = next(iter(params.values()))
        assert first.peer_address == p.address and first.request_id.startswith("req-")
        assert first.remote_block_ids  # the prefill side's block ids
    finally:
        for e in prefill + decode:
            e.connector.close()


def test_push_with_params_from_request_finished(daemons):
    p, d = daemons
    src = make_engine(kvd.Connector(daemon=p, instance="prefill"), Shape(), seed=3)
    dst = make_engine(kvd.Connector(daemon=d, instance="decode"), Shape())
    with src.connector, dst.connector:
        run_pd([src], [dst], p.address, mode="push", early_push=False)


def test_block_ids_as_lists_numpy_and_int32(daemons):
    import numpy as np
    p, d = daemons
    src = make_engine(kvd.Connector(daemon=p, instance="prefill"), Shape(), seed=5)
    dst = make_engine(kvd.Connector(daemon=d, instance="decode"), Shape())
    with src.connector, dst.connector:
        kinds = [[0, 1, 2], np.array([3, 4, 5]), torch.tensor([6, 7, 8], dtype=torch.int32),
                 np.array([9, 10, 11], dtype=np.int32)]
        for i, ids in enumerate(kinds):
            r = f"ids-{i}"
            dst.connector.start_load(r, kvd.TransferParams(peer_address=p.address, request_id=r),
                                     ids, tokens=48, mode="push")
            for layer in range(3):
                src.connector.save_layer(r, layer, ids)
            src.connector.request_finished(r)
            for layer in range(3):
                dst.connector.wait_layer(r, f"layers.{layer}")
            blocks = [int(b) for b in ids]
            check_request([src], [dst], blocks, blocks, 48)


def test_requests_finished_in_one_call_load_like_one_each(daemons):
    p, d = daemons
    src = make_engine(kvd.Connector(daemon=p, instance="prefill"), Shape(), seed=7)
    dst = make_engine(kvd.Connector(daemon=d, instance="decode"), Shape())
    with src.connector, dst.connector:
        blocks = {"bf-0": [0, 1, 2], "bf-1": [3, 4, 5]}
        for r, ids in blocks.items():
            for layer in range(3):
                src.connector.save_layer(r, layer, ids)
        token = "ab" * 16
        got = src.connector.requests_finished(["bf-0", ("bf-1", token), "never-saved",
                                               ("bf-x", "zz" * 16)])
        assert [type(g).__name__ for g in got] == ["TransferParams", "TransferParams",
                                                   "NotFoundError", "InvalidArgumentError"]
        assert got[0].request_id == "bf-0" and got[0].peer_name == "prefill-node"
        assert got[1].transfer_token == token
        assert "never-saved" in str(got[2])
        loads = [(r, got[i], ids, 48, "pull") for i, (r, ids) in enumerate(blocks.items())]
        assert dst.connector.start_loads(loads) == [None, None]
        for r in blocks:
            for layer in range(3):
                dst.connector.wait_layer(r, layer)
        for ids in blocks.values():
            check_request([src], [dst], ids, ids, 48)
        with pytest.raises(kvd.InvalidArgumentError, match="1 to 1024 requests"):
            src.connector.requests_finished([])
        for bad in [("bf-0", None, "extra"), 5]:
            with pytest.raises(kvd.InvalidArgumentError, match="pair"):
                src.connector.requests_finished([bad])


# ---- kvd processes -------------------------------------------------------------------------------

@pytest.fixture
def processes():
    with tempfile.TemporaryDirectory(prefix="kvd-py-") as tmp:
        p = KvdProcess("prefill", os.path.join(tmp, "p.sock"),
                       args=["--lease-ms", "10000", "--heartbeat-ms", "200"])
        try:
            d = KvdProcess("decode", os.path.join(tmp, "d.sock"),
                           args=["--lease-ms", "10000", "--heartbeat-ms", "200"])
        except BaseException:
            p.kill()
            raise
        try:
            yield p, d
        finally:
            p.kill()
            d.kill()


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_two_kvd_processes(processes, mode):
    p, d = processes
    src = make_engine(kvd.Connector(socket=p.socket, instance="prefill", timeout=10), Shape(),
                      seed=21)
    dst = [make_engine(kvd.Connector(socket=d.socket, instance="decode", tp_rank=r, tp_size=2,
                                     timeout=10), Shape(order="BLHNC")) for r in range(2)]
    try:
        run_pd([src], dst, p.address, mode=mode, requests=3)
        assert src.connector.status()
    finally:
        for e in [src] + dst:
            e.connector.close()


def test_prefill_kvd_killed_mid_run(processes):
    """The prefill kvd dies after the first layer: the decode side's waits end with an error in
    bounded time, its blocks come back from get_failed_blocks, and nothing outside the request's
    blocks is written."""
    p, d = processes
    shape = Shape(layers=4)
    src = make_engine(kvd.Connector(socket=p.socket, instance="prefill", timeout=5), shape,
                      seed=4)
    dst = make_engine(kvd.Connector(socket=d.socket, instance="decode", timeout=5), shape)
    try:
        blocks = [2, 5, 7]
        params = kvd.TransferParams(peer_address=p.address, request_id="doomed")
        dst.connector.start_load("doomed", params, blocks, tokens=48, mode="push")
        src.connector.save_layer("doomed", 0, [0, 1, 2])
        dst.connector.wait_layer("doomed", 0)
        p.kill()
        start = time.monotonic()
        with pytest.raises(kvd.KvdError):
            for layer in range(1, 4):
                dst.connector.wait_layer("doomed", layer)
        assert time.monotonic() - start < 15
        failed = set()
        wait_for(lambda: failed.update(dst.connector.get_failed_blocks()) or failed, 15,
                 "failed blocks")
        assert failed == set(blocks)
        mask = torch.ones(shape.blocks, dtype=torch.bool)
        mask[blocks] = False
        for v in dst.views.values():
            assert not v[mask].view(torch.int16).any()
    finally:
        src.connector.close()
        dst.connector.close()


def test_cross_layer_tensor_and_replicated_kv_heads(daemons):
    """The decode side registers one cross-layer tensor [B, L, H, N, C] (dims="BLHNC") at TP 2
    with one KV head replicated on both ranks (total_heads=1); the prefill side per-layer views
    at TP 1 of that one head."""
    p, d = daemons
    shape = Shape(heads=1, layers=2)
    src = make_engine(kvd.Connector(daemon=p, instance="prefill", timeout=10), shape, seed=8)
    dst = []
    for r in range(2):
        c = kvd.Connector(daemon=d, instance="decode", tp_rank=r, tp_size=2, timeout=10)
        raw = kvd.allocate_host_kv_cache(shape.blocks * 2 * 16 * 16 * 2)
        t = raw.view(torch.float16).view(shape.blocks, 2, 1, 16, 16)
        (region,) = c.register_kv_caches({"all": t}, dims="BLHNC", total_heads=1)
        # H = 1: BLHNC and BLNHC are one layout; kvd names size-1 axes innermost
        assert (region.layout.order, region.layout.total_heads) == ("BLNHC", 1)
        dst.append((c, t))
    try:
        tokens, blocks = 40, [5, 9, 2]
        for c, _ in dst:
            c.start_load("x", kvd.TransferParams(peer_address=p.address, request_id="x"),
                         blocks, tokens=tokens, mode="push")
        for layer in range(2):
            src.connector.save_layer("x", layer, [1, 0, 3])
        src.connector.request_finished("x")
        tt = torch.arange(tokens)
        for c, t in dst:
            for layer in range(2):
                c.wait_layer("x", f"all[{layer}]")
                got = t[torch.tensor(blocks)[tt // 16], layer, 0, tt % 16]
                want = src.token_view(layer, [1, 0, 3], tokens)[:, 0]
                assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    finally:
        src.connector.close()
        for c, _ in dst:
            c.close()
