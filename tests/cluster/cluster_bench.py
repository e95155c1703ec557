#!/usr/bin/env python3
"""Figures of kvd across a network hop, for benchmarks/cluster.md (not a ctest test).

Two hosts in network namespaces (kvcluster.py), UCX over tcp on one veth, in one run:
  1. `kvbench pd --prewrite`: a wave of 4 requests x 128 MiB = 512 MiB, prefill host -> decode
     host, every byte verified; median of --rounds runs.
  2. `ucx_perftest -t ucp_put_bw` and `-t ucp_am_bw` over the same veth with the same UCX
     settings and kvd's run size (one layer of one request: 8 MiB), and plain TCP (two Python
     processes, 1 GiB): the ceilings.
  3. With --faults: link down mid-wave -> every decode request failed, and SIGKILL of the
     prefill kvd -> every decode request failed (kvd --heartbeat-ms 200: 5 missed = 1 s).

usage: cluster_bench.py --build BUILD_DIR [--rounds 3] [--faults]
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvcluster import Cluster, kvbench_pd  # noqa: E402
import pd_cluster_test as pdt  # noqa: E402

WAVE = ["--requests", "8", "--window", "4", "--tokens", "2048", "--layers", "16", "--heads", "8",
        "--head-dim", "128", "--prewrite", "--timeout-ms", "60000"]
RUN_BYTES = 2048 * 8 * 512  # one layer of one request on LBNHC: one contiguous run


def perftest(c, size, iters, test="ucp_put_bw"):
    """ucx_perftest bandwidth host 1 -> host 2 over eth0: (GB/s, its Final line). UCX prints
    MB/s of 2^20 bytes; the overall figure (whole run) is taken."""
    env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="eth0", UCX_WARN_UNUSED_ENV_VARS="n")
    tool = shutil.which("ucx_perftest")
    server = c.spawn([tool, "-p", "13337"], host=1, env=env, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    r = subprocess.run(c.ns(0) + [tool, c.address(1), "-p", "13337", "-t", test, "-s",
                                  str(size), "-n", str(iters), "-w", "5"],
                       env=env, capture_output=True, text=True, timeout=300)
    server.wait(timeout=30)
    # Final line: "Final:  iters  latency(3 cols)  bandwidth(avg, overall) MB/s  msgrate(2)".
    for line in r.stdout.splitlines():
        if line.strip().startswith("Final:"):
            cols = line.split()
            return float(cols[-3]) * 1048576 / 1e9, line.strip()
    raise RuntimeError(f"ucx_perftest printed no result: {r.stdout[-1000:]} {r.stderr[-1000:]}")


RECV = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5201)); s.listen(1); c, _ = s.accept(); buf = bytearray(1 << 20); n = 0
while True:
    k = c.recv_into(buf)
    if not k: break
    n += k
print(n)
"""
SEND = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5201)); buf = b"x" * (4 << 20); total = 1 << 30
t = time.monotonic(); sent = 0
while sent < total: c.sendall(buf); sent += len(buf)
c.shutdown(socket.SHUT_WR); c.recv(1); print(total / (time.monotonic() - t) / 1e9)
"""


def tcp_ceiling(c):
    """Plain TCP over the same veth: 1 GiB from host 1 to host 2 by two Python processes (GB/s)."""
    server = c.spawn([sys.executable, "-c", RECV, c.address(1)], host=1, stdout=subprocess.PIPE)
    time.sleep(0.5)
    r = subprocess.run(c.ns(0) + [sys.executable, "-c", SEND, c.address(1)], capture_output=True,
                       text=True, timeout=300)
    server.wait(timeout=30)
    return float(r.stdout.strip())


def fault_times(build, rounds):
    out = {"link_down_ms": [], "sigkill_ms": []}
    for _ in range(rounds):
        for kind in ("link_down_ms", "sigkill_ms"):
            with Cluster(2, build) as c:
                p = c.start_kvd(0, "prefill", args=pdt.FAULT_KVD_ARGS)
                d = c.start_kvd(1, "decode", args=pdt.FAULT_KVD_ARGS)
                failed_before = pdt.counters(build, d)["transfers_failed"]
                bench = pdt.start_slow_wave(build, c, p, d)
                if kind == "link_down_ms":
                    c.link(0, up=False)
                else:
                    p.kill()
                t0 = time.monotonic()
                ok = pdt.wait_until(
                    lambda: (s := pdt.counters(build, d)) and
                    s["transfers_failed"] >= failed_before + 8 and s["transfers_in_flight"] == 0,
                    10, step=0.01)
                if ok:
                    out[kind].append((time.monotonic() - t0) * 1000)
                bench.kill()
                bench.wait(timeout=10)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--faults", action="store_true")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    with Cluster(2, build) as c:
        p = c.start_kvd(0, "prefill")
        d = c.start_kvd(1, "decode")
        runs = []
        for _ in range(a.rounds):
            r = kvbench_pd(build, p, d, WAVE, timeout=600)
            assert r["exit"] == 0 and r["verified"] == r["requests"], r
            runs.append(r)
            print(f"kvbench pd: {r['bytes'] / 2**20:.0f} MiB in {r['seconds']:.3f} s = "
                  f"{r['gbps']:.3f} GB/s, runs/request {r['runs_per_request']}", flush=True)
        gbps = statistics.median(r["gbps"] for r in runs)
        for test in ("ucp_put_bw", "ucp_am_bw"):
            ceiling, line = perftest(c, RUN_BYTES, 200, test)
            print(f"ucx_perftest {test} {RUN_BYTES} B: {ceiling:.3f} GB/s ({line}); "
                  f"kvd = {gbps / ceiling:.2f} of it")
        tcp = statistics.median(tcp_ceiling(c) for _ in range(a.rounds))
        print(f"plain TCP (python sendall, 4 MiB writes, 1 GiB) median {tcp:.3f} GB/s; "
              f"kvd = {gbps / tcp:.2f} of it")
    if a.faults:
        t = fault_times(build, a.rounds)
        for k, v in t.items():
            print(f"{k}: {', '.join(f'{x:.0f}' for x in v)} (median "
                  f"{statistics.median(v) if v else float('nan'):.0f})")


if __name__ == "__main__":
    main()
