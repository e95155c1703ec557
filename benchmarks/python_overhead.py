#!/usr/bin/env python3
"""Python-side cost of kvd's hot calls (BENCHMARKS.md, benchmarks/python.md).

Two embedded kvd cores (the `local` transport) in this process, a prefill and a decode engine
with host caches. Per step, the prefill engine saves every layer of 64 requests of 256 blocks
each (one save_layer per request and layer, block ids as int64 arrays) and finishes them; the
decode engine starts the 64 loads with one start_loads and waits for every layer. Timed:

  save_layer    kvd.Connector.save_layer, per call
  save raw      the same C call through ctypes with its arguments prepared (the floor a Python
                binding pays: ctypes' own call cost plus the C API's work)
  start_loads   kvd.Connector.start_loads of 64 loads, per call
  loads raw     kv_start_loads through ctypes with the load table prepared

  ... python     the binding with the C function replaced by a Python stub returning 0: the
                Python work alone (argument conversion, struct packing), without ctypes' call

The difference binding - raw is what the Python layer adds per call; "python" measures it
without the noise of kvd's round trip (two cores shared with the kvd threads).

    python3 benchmarks/python_overhead.py [--steps 20] [--requests 64] [--blocks 256]
"""

import argparse
import ctypes
import os
import platform
import statistics
import sys
import time

try:
    import kvd
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import kvd

import numpy as np

from kvd import _lib
from kvd import testing as kt


def engine(daemon, name, layers, blocks):
    c = kvd.Connector(daemon=daemon, instance=name, timeout=30)
    raw = kvd.allocate_host_kv_cache(kt.kv_nbytes("LBNHC", layers, blocks, 1, 16, 2, 2))
    views, _ = kt.vllm_kv_caches(raw, "LBNHC", layers, blocks, 1, 16, 2)
    c.register_kv_caches(views)
    return c, raw, views


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def report(name, samples_us):
    print(f"  {name:<13} median {statistics.median(samples_us):8.2f} us   p90 "
          f"{pct(samples_us, 0.9):8.2f} us   ({len(samples_us)} calls)")
    return statistics.median(samples_us)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--blocks", type=int, default=256, help="block ids per request")
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()
    lib = _lib.load()
    total_blocks = a.requests * a.blocks
    p = kvd.Daemon(name="bench-p", transport="local")
    d = kvd.Daemon(name="bench-d", transport="local")
    pc, _, _ = engine(p, "prefill", a.layers, total_blocks)
    dc, _, _ = engine(d, "decode", a.layers, total_blocks)
    ids = [np.arange(j * a.blocks, (j + 1) * a.blocks, dtype=np.int64) for j in range(a.requests)]
    tokens = a.blocks * 16
    save, save_raw, loads, loads_raw = [], [], [], []
    clock = time.perf_counter_ns
    for step in range(a.steps):
        raw_step = step % 2 == 1  # alternate the binding and the raw ctypes calls
        names = [f"s{step}-r{j}" for j in range(a.requests)]
        enc = [n.encode() for n in names]
        for layer in range(a.layers):
            for j in range(a.requests):
                if raw_step:
                    err = _lib.KvErrorStruct()
                    ptr, n = ids[j].ctypes.data, len(ids[j])
                    t0 = clock()
                    rc = lib.kv_save_layer(pc._h, enc[j], layer, ptr, n, None, err)
                    save_raw.append((clock() - t0) / 1e3)
                    assert rc == 0, err.message
                else:
                    t0 = clock()
                    pc.save_layer(names[j], layer, ids[j])
                    save.append((clock() - t0) / 1e3)
        for n in names:
            pc.request_finished(n)
        batch = [(n, kvd.TransferParams(peer_address=p.address, request_id=n), ids[j], tokens,
                  "pull") for j, n in enumerate(names)]
        if raw_step:
            structs = [b[1].to_c(tokens, "pull") for b in batch]
            arr = (_lib.KvLoadStruct * len(batch))()
            for i, (n, _, bl, _, _) in enumerate(batch):
                arr[i].request, arr[i].params = enc[i], ctypes.pointer(structs[i])
                arr[i].block_ids, arr[i].count = bl.ctypes.data, len(bl)
            results = (_lib.KvErrorStruct * len(batch))()
            err = _lib.KvErrorStruct()
            t0 = clock()
            rc = lib.kv_start_loads(dc._h, arr, len(batch), results, err)
            loads_raw.append((clock() - t0) / 1e3)
            assert rc == 0 and all(r.code == 0 for r in results), err.message
        else:
            t0 = clock()
            out = dc.start_loads(batch)
            loads.append((clock() - t0) / 1e3)
            assert out == [None] * len(batch), out
        for n in names:
            for layer in range(a.layers):
                dc.wait_layer(n, layer)
        deadline = time.monotonic() + 30
        sent = set()
        while len(sent) < len(names) and time.monotonic() < deadline:
            sent.update(pc.get_finished()[0])
            dc.get_finished()
        assert len(sent) == len(names), "the prefill side did not release the step's requests"
    # The Python work alone: the C calls stubbed out (kvd is not involved).
    stub_save, stub_loads = [], []
    real_save, real_loads = lib.kv_save_layer, lib.kv_start_loads
    lib.kv_save_layer = lambda *args: 0
    lib.kv_start_loads = lambda *args: 0
    try:
        batch = [(f"stub-{j}", kvd.TransferParams(peer_address=p.address, request_id=f"stub-{j}"),
                  ids[j], tokens, "pull") for j in range(a.requests)]
        for _ in range(a.steps * a.layers):
            for j in range(a.requests):
                t0 = clock()
                pc.save_layer(batch[j][0], 0, ids[j])
                stub_save.append((clock() - t0) / 1e3)
        for _ in range(a.steps * 5):
            t0 = clock()
            dc.start_loads(batch)
            stub_loads.append((clock() - t0) / 1e3)
    finally:
        lib.kv_save_layer, lib.kv_start_loads = real_save, real_loads
    print(f"kvd {kvd.version()} ({kvd.library_path()}), Python {platform.python_version()}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs")
    print(f"{a.requests} requests x {a.blocks} block ids, {a.layers} layers, {a.steps} steps "
          "(binding and raw alternate)")
    s = report("save_layer", save)
    sr = report("save raw", save_raw)
    l = report("start_loads", loads)
    lr = report("loads raw", loads_raw)
    ps = report("save python", stub_save)
    pl = report("loads python", stub_loads)
    print(f"  Python work per call (stubbed C): save_layer {ps:.2f} us, start_loads {pl:.2f} us "
          f"for {a.requests} loads ({pl / a.requests:.2f} us per load)")
    print(f"  binding - raw (medians, noisy): save_layer {s - sr:.2f} us, start_loads "
          f"{l - lr:.2f} us")
    dc.close()
    pc.close()
    d.stop()
    p.stop()


if __name__ == "__main__":
    main()
