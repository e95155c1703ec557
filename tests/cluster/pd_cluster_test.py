#!/usr/bin/env python3
"""kvd across real network hops: two hosts in network namespaces, UCX over tcp on a veth.

Every case moves K/V with `kvbench pd` (the engine simulator: every byte verified, guard blocks
checked to stay zero) against a prefill kvd on host 1 and a decode kvd on host 2. Cases:

  pd         push, pull, and TP 1 -> 2 with a layout change, between the hosts
  tp_hosts   TP 1 -> 2 with the decode ranks on two hosts (three hosts in all)
  netem      5 ms delay and 1 % loss on the prefill host's link: every request completes, exact
  slow_link  that link limited to 16 Mbit/s: every request completes, no heartbeat is missed
  slow_host  a third host with 50 ms delay fed by the same prefill kvd does not slow 1 -> 2
  link_down  the link taken down mid-run for 7 s: requests fail within the lease, nothing is
             written outside their blocks; the link back up, new requests succeed, nothing
             restarted
  link_flap  the same with the link back up as soon as the requests failed (~1 s)
  restart    the prefill kvd SIGKILLed mid-run: the decode side fails the old requests in bounded
             time; the prefill kvd restarted on another port serves the next requests

usage: pd_cluster_test.py CASE --build BUILD_DIR   (exit 0 pass, 1 fail, 77 skip)
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvcluster  # noqa: E402
from kvcluster import Cluster, kvbench_pd, kvd_status, parse_pd  # noqa: E402

# Short heartbeats and leases so faults end requests in a few seconds, not the 30 s defaults:
# 5 missed heartbeats of 200 ms declare a peer dead; a request lives at most 4 s.
FAULT_KVD_ARGS = ["--heartbeat-ms", "200", "--lease-ms", "4000", "--drain-ms", "1000"]
LEASE_S = 4.0
# A small, quick run: 8 requests x 256 tokens x 8 layers x 8 heads x 512 B = 8 MiB per request.
SMALL = ["--requests", "16", "--window", "8", "--tokens", "256", "--layers", "8"]
# One wave whose prefill takes ~2.4 s (16 layers of a 150 ms forward pass): long enough to cut it.
SLOW_WAVE = ["--requests", "8", "--window", "8", "--tokens", "256", "--layers", "16",
             "--layer-us", "150000", "--timeout-ms", "8000"]


def expect_all_verified(result, what):
    n = result["requests"]
    assert result["exit"] == 0, f"{what}: kvbench pd exited {result['exit']}: {result}"
    assert result["verified"] == n and result["failed"] == 0, f"{what}: {result}"
    assert result["guard_bytes_written"] == 0, f"{what}: bytes outside the blocks: {result}"
    assert result["transport"] == "ucx", f"{what}: transport {result['transport']}"


def report(name, result):
    print(f"  {name}: {result['verified']}/{result['requests']} verified, "
          f"{result['bytes'] / 1048576:.1f} MiB in {result['seconds']:.3f} s = "
          f"{result['gbps']:.3f} GB/s, p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms",
          flush=True)


def wait_until(predicate, timeout, step=0.05):
    """Polls predicate() until it returns a true value or `timeout` seconds pass (then None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = predicate()
        if v:
            return v
        time.sleep(step)
    return None


def counters(build, kvd):
    s = kvd_status(build, kvd)
    return s if s is not None else {}


def case_pd(build):
    with Cluster(2, build) as c:
        p = c.start_kvd(0, "prefill")
        d = c.start_kvd(1, "decode")
        assert p.listen.startswith(c.address(0) + ":"), p.listen
        # TP 1 -> 2 (both decode ranks behind the decode host's kvd: a decode instance's ranks
        # share one kvd, which gathers them) with a layout and block size change on the way.
        # That conversion makes 16384 runs of 512 B per request, ~14 us each over UCX tcp on the
        # 2-core VM (benchmarks/cluster.md): 8 requests, not 16, keep the case near 2 s.
        tp = ["--requests", "8", "--window", "8", "--tokens", "256", "--layers", "8"]
        cases = {"push": SMALL + ["--mode", "push"], "pull": SMALL + ["--mode", "pull"],
                 "TP1->2 BLHNC bs32": tp + ["--decode-tp", "2", "--decode-order", "BLHNC",
                                            "--decode-block-size", "32"]}
        for mode, args in cases.items():
            rx = c.rx_bytes(1)
            r = kvbench_pd(build, p, d, args)
            expect_all_verified(r, mode)
            report(mode, r)
            # The K/V crossed the decode host's veth (UCX tcp), not a same-host shortcut.
            crossed = c.rx_bytes(1) - rx
            assert crossed >= r["bytes"], f"{mode}: {crossed} bytes reached eth0, {r['bytes']} moved"
        # The bytes crossed the veth: the decode kvd dialed the prefill host's address.
        peers = counters(build, d).get("peers", [])
        assert any(x["address"].startswith(c.address(0)) for x in peers), peers


def case_tp_hosts(build):
    """TP 1 -> 2 with the decode ranks on two hosts: decode rank 0 behind the kvd of host 2,
    rank 1 behind the kvd of host 3. Each decode kvd asks the prefill kvd for its own rank's
    share of every request (WantRequest.tp_size); the source streams each share to its own
    host, and releases a request once both confirmed."""
    with Cluster(3, build) as c:
        p = c.start_kvd(0, "prefill")
        d0 = c.start_kvd(1, "decode-0")
        d1 = c.start_kvd(2, "decode-1")
        tp = ["--requests", "8", "--window", "8", "--tokens", "256", "--layers", "8",
              "--decode-tp", "2"]
        cases = {"push": tp + ["--mode", "push"], "pull": tp + ["--mode", "pull"],
                 "push BLHNC bs32": tp + ["--decode-order", "BLHNC", "--decode-block-size", "32"]}
        for mode, args in cases.items():
            rx = [c.rx_bytes(1), c.rx_bytes(2)]
            r = kvbench_pd(build, p, [d0, d1], args + ["--tag", mode.replace(" ", "-")])
            expect_all_verified(r, f"TP 1->2 across hosts, {mode}")
            report(f"TP 1->2 on hosts 2+3, {mode}", r)
            # Each rank's half of the heads crossed its own host's veth.
            for host, before in ((1, rx[0]), (2, rx[1])):
                crossed = c.rx_bytes(host) - before
                assert crossed >= r["bytes"] // 2, \
                    f"{mode}: host {host + 1} received {crossed} bytes of {r['bytes']} / 2"
        for d in (d0, d1):
            peers = counters(build, d).get("peers", [])
            assert any(x["address"].startswith(c.address(0)) for x in peers), (d.name, peers)
        # The prefill kvd released every request: nothing held, nothing failed.
        s = counters(build, p)
        assert s["transfers_in_flight"] == 0 and s["transfers_failed"] == 0, s

        # One decode host dies mid-wave: the source fails the requests and tells the other
        # decode kvd, whose loads end at once, not at their 30 s lease.
        failed_before = counters(build, d0)["transfers_failed"]
        before = counters(build, d1).get("bytes_received", 0)
        bench = kvbench_pd(build, p, [d0, d1], SLOW_WAVE + ["--decode-tp", "2", "--tag", "kill"],
                           background=True)
        c.children.append(bench)
        assert wait_until(lambda: counters(build, d1).get("bytes_received", 0) > before, 15), \
            "no bytes reached decode-1 in 15 s"
        d1.kill()
        killed = time.monotonic()
        failed = wait_until(
            lambda: (s := counters(build, d0)) and s["transfers_failed"] >= failed_before + 8
            and s["transfers_in_flight"] == 0, 10)
        fail_s = time.monotonic() - killed
        assert failed, f"decode-0 still has requests in flight {fail_s:.1f} s after decode-1 died"
        r = finish(bench, 60)
        assert r["failed"] == r["requests"] and r["guard_bytes_written"] == 0, r
        print(f"  decode-1 SIGKILLed -> decode-0's share failed in {fail_s * 1000:.0f} ms "
              "(told by the source; lease 30 s)")
        assert fail_s < 5, f"decode-0's loads failed {fail_s:.1f} s after decode-1 died"


# 1 MiB requests: TCP with 10 ms RTT and 1 % loss moves a few MB/s (Mathis: ~1.8 MB/s per
# connection), and a wave must end well inside kvd's 30 s lease. 8 MiB in all: ~5 s.
SLOW = ["--requests", "8", "--window", "4", "--tokens", "64", "--layers", "4",
        "--timeout-ms", "60000"]


def case_netem(build):
    with Cluster(2, build) as c:
        c.netem(0, "delay 5ms loss 1%")  # both directions of the prefill host's link
        p = c.start_kvd(0, "prefill")
        d = c.start_kvd(1, "decode")
        r = kvbench_pd(build, p, d, SLOW, timeout=240)
        expect_all_verified(r, "netem delay 5ms loss 1%")
        report("netem 5ms 1%", r)


def case_slow_host(build):
    """One slow host does not slow the other two: a prefill kvd on host 1 feeds a decode kvd on
    host 2 and one on host 3, whose link has 50 ms of delay each way (netem). The transfers
    1 -> 2 keep at least half the throughput they had alone while 1 -> 3 runs beside them, and
    every byte of both arrives. Needs netem: skips on kernels without sch_netem."""
    with Cluster(3, build) as c:
        c.netem(2, "delay 50ms")  # first: skip before anything starts where netem is missing
        p = c.start_kvd(0, "prefill")
        fast = c.start_kvd(1, "decode-fast")
        slow = c.start_kvd(2, "decode-slow")
        # Warm both peer sessions, then the fast pair alone: the figure to hold.
        for d, tag in ((fast, "warm-fast"), (slow, "warm-slow")):
            expect_all_verified(kvbench_pd(build, p, d, SMALL + ["--tag", tag], timeout=120), tag)
        alone = kvbench_pd(build, p, fast, SMALL + ["--tag", "alone"])
        expect_all_verified(alone, "1 -> 2 alone")
        report("1 -> 2 alone", alone)
        # 1 -> 3 in the background for longer than the fast run takes; 1 -> 2 beside it.
        before = counters(build, slow).get("bytes_received", 0)
        bench = kvbench_pd(build, p, slow, SMALL + ["--requests", "64", "--tag", "slow",
                                                     "--timeout-ms", "60000"], background=True)
        c.children.append(bench)
        assert wait_until(lambda: counters(build, slow).get("bytes_received", 0) > before, 30), \
            "no bytes reached the slow host in 30 s"
        beside = kvbench_pd(build, p, fast, SMALL + ["--tag", "beside"])
        still_running = bench.poll() is None
        behind = finish(bench, 180)
        expect_all_verified(beside, "1 -> 2 beside the slow host")
        expect_all_verified(behind, "1 -> 3, the slow host")
        report("1 -> 2 beside 1 -> 3", beside)
        report("1 -> 3 (50 ms)", behind)
        assert still_running, "the slow host's run ended before the fast one: no overlap measured"
        assert behind["p50_ms"] >= 50, f"the 50 ms delay did not apply to host 3: {behind}"
        ratio = beside["gbps"] / alone["gbps"]
        print(f"  1 -> 2 beside the slow host: {ratio:.2f} of its throughput alone")
        assert ratio >= 0.5, f"the slow host slowed 1 -> 2 to {ratio:.2f} of its throughput"


def case_slow_link(build):
    """The prefill host's link limited to 16 Mbit/s both ways (tbf, which kernels without netem
    have): the bulk data saturates it, yet the control connection's heartbeats (200 ms, 5 missed
    declare a peer dead) still get through, and every request completes exact."""
    with Cluster(2, build) as c:
        c.rate_limit(0, "16mbit")
        args = FAULT_KVD_ARGS + ["--lease-ms", "30000"]
        p = c.start_kvd(0, "prefill", args=args + ["--metrics-listen", f"{c.address(0)}:9464"])
        d = c.start_kvd(1, "decode", args=args + ["--metrics-listen", f"{c.address(1)}:9464"])
        r = kvbench_pd(build, p, d, SLOW, timeout=240)
        expect_all_verified(r, "16 Mbit/s link")
        report("16 Mbit/s", r)
        assert r["gbps"] < 0.003, f"the rate limit did not apply: {r['gbps']} GB/s"
        for host in (0, 1):
            missed = metric(c, host, "kvd_heartbeat_timeouts_total")
            assert missed == 0, f"host {host + 1}: {missed} peers lost on a slow, live link"


def start_slow_wave(build, c, p, d):
    """Starts SLOW_WAVE in the background; returns it once the decode kvd received bytes of it."""
    before = counters(build, d).get("bytes_received", 0)
    bench = kvbench_pd(build, p, d, SLOW_WAVE, background=True)
    c.children.append(bench)
    moving = wait_until(lambda: counters(build, d).get("bytes_received", 0) > before, 15)
    assert moving, "no bytes reached the decode kvd in 15 s"
    return bench


def finish(bench, timeout):
    out, err = bench.communicate(timeout=timeout)
    return parse_pd(bench.returncode, out, err)


def idle(build, *kvds):
    return all(counters(build, k).get("transfers_in_flight", 1) == 0 for k in kvds)


def metric(c, host, name, **labels):
    """Sum of the samples of `name` with `labels` on host's kvd /metrics (port 9464 there)."""
    r = kvcluster.run(c.ns(host) + ["curl", "-sS", "--max-time", "5",
                                    f"http://{c.address(host)}:9464/metrics"])
    total = 0.0
    for line in r.stdout.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def case_link_down(build, down_s=7.0):
    with Cluster(2, build) as c:
        # /metrics on each host's own address: every namespace has its own port space.
        p = c.start_kvd(0, "prefill",
                        args=FAULT_KVD_ARGS + ["--metrics-listen", f"{c.address(0)}:9464"])
        d = c.start_kvd(1, "decode",
                        args=FAULT_KVD_ARGS + ["--metrics-listen", f"{c.address(1)}:9464"])
        expect_all_verified(kvbench_pd(build, p, d, SMALL), "before the fault")
        failed_before = counters(build, d)["transfers_failed"]

        bench = start_slow_wave(build, c, p, d)
        c.link(0, up=False)
        down = time.monotonic()
        # Every request of the wave fails on the decode side: heartbeats stop, the peer is
        # declared dead after 5 x 200 ms, at the latest the lease ends.
        failed = wait_until(
            lambda: (s := counters(build, d)) and s["transfers_failed"] >= failed_before + 8
            and s["transfers_in_flight"] == 0, LEASE_S + 4)
        fail_s = time.monotonic() - down
        assert failed, f"decode kvd still has requests in flight {fail_s:.1f} s after link down"
        assert fail_s <= LEASE_S + 1, f"requests failed {fail_s:.2f} s after link down"
        r = finish(bench, 60)
        print(f"  link down -> every decode request failed: {fail_s * 1000:.0f} ms; kvbench: "
              f"{r['failed']} failed, {r['verified']} verified")
        assert r["failed"] > 0 and r["failed"] + r["verified"] == r["requests"], r
        assert r["guard_bytes_written"] == 0, f"bytes written outside the blocks: {r}"
        # The metrics tell an operator what happened: heartbeats missed, failures by peer.
        assert metric(c, 1, "kvd_heartbeat_timeouts_total") >= 1
        assert metric(c, 1, "kvd_transfers_total", peer="prefill", role="destination",
                      outcome="failed") >= 8
        assert metric(c, 1, "kvd_transfers_total", peer="prefill", role="destination",
                      outcome="done") >= 16

        # Down for DOWN_S in all: a flap shorter than the UCX backend's endpoint close (5 s) is
        # the link_flap case.
        time.sleep(max(0.0, down_s - (time.monotonic() - down)))
        c.link(0, up=True)
        # Whatever the prefill side still held ends within its lease; then the same daemons,
        # never restarted, serve new requests (the same request ids again).
        assert wait_until(lambda: idle(build, p, d), LEASE_S + 4), "requests left after the lease"
        after_link_up(build, p, d)


def after_link_up(build, p, d):
    """New requests over the link that came back, by the same two kvds, under the same request
    ids as the failed ones: a late completion of a failed request's batch must not end them
    (SourceRequest::generation)."""
    after = kvbench_pd(build, p, d, SMALL + ["--timeout-ms", "8000"])
    assert p.alive() and d.alive(), (
        f"a kvd died after the link came back: prefill exit {p.proc.returncode}, "
        f"decode exit {d.proc.returncode} (see its log above)")
    expect_all_verified(after, "after the link came back")
    report("after link up", after)


def case_link_flap(build):
    """The link down only until the requests failed (~1 s), then straight back up."""
    case_link_down(build, down_s=0.0)


def case_restart(build):
    with Cluster(2, build) as c:
        p = c.start_kvd(0, "prefill", args=FAULT_KVD_ARGS)
        d = c.start_kvd(1, "decode", args=FAULT_KVD_ARGS)
        expect_all_verified(kvbench_pd(build, p, d, SMALL), "before the kill")
        failed_before = counters(build, d)["transfers_failed"]

        bench = start_slow_wave(build, c, p, d)
        p.kill()  # SIGKILL: no drain, no goodbye
        killed = time.monotonic()
        failed = wait_until(
            lambda: (s := counters(build, d)) and s["transfers_failed"] >= failed_before + 8
            and s["transfers_in_flight"] == 0, LEASE_S + 4)
        fail_s = time.monotonic() - killed
        assert failed, f"decode kvd still has requests in flight {fail_s:.1f} s after the kill"
        assert fail_s <= LEASE_S + 1, f"requests failed {fail_s:.2f} s after the kill"
        r = finish(bench, 60)
        print(f"  SIGKILL -> every decode request failed: {fail_s * 1000:.0f} ms; kvbench: "
              f"{r['failed']} failed, {r['verified']} verified")
        assert r["exit"] != 0 and r["failed"] > 0, r
        assert r["guard_bytes_written"] == 0, f"bytes written outside the blocks: {r}"

        # The same daemon name on another port: the decode kvd, untouched, reaches it.
        p2 = c.start_kvd(0, "prefill", args=FAULT_KVD_ARGS, label="prefill.2")
        if p2.port == p.port:  # port 0 picked the old one again: ask for the next
            p2.stop()
            p2 = c.start_kvd(0, "prefill", port=p.port + 1, args=FAULT_KVD_ARGS, label="prefill.3")
        assert p2.port != p.port
        after = kvbench_pd(build, p2, d, SMALL)
        expect_all_verified(after, "after the restart")
        assert d.alive(), "the decode kvd died"
        print(f"  restarted prefill on port {p2.port} (was {p.port})")
        report("after restart", after)


CASES = {"pd": case_pd, "netem": case_netem, "slow_link": case_slow_link,
         "slow_host": case_slow_host, "tp_hosts": case_tp_hosts,
         "link_down": case_link_down,
         "link_flap": case_link_flap, "restart": case_restart}

if __name__ == "__main__":
    sys.exit(kvcluster.main(CASES, sys.argv))
