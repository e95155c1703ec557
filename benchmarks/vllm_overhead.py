#!/usr/bin/env python3
"""Python overhead of kvd.vllm.KvdConnector per vLLM scheduler step and per layer hook, with 64
running requests (issue 22's targets: <= 1 ms per scheduler step, <= 20 us per save_kv_layer /
wait_for_layer_load call when there is nothing to wait for).

Uses the call-sequence harness's stand-in types (tests/python/vllm/standins.py) and an embedded
kvd core (transport local) with CPU caches; times wall clock with time.perf_counter over many
repetitions and prints the median per call.

    KVD_LIBRARY=build/lib/libkvconnector.so /usr/bin/python3 benchmarks/vllm_overhead.py
"""

import argparse
import logging
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "python"), str(REPO / "tests" / "python" / "vllm")]

import kvd  # noqa: E402
import kvd.vllm as kv  # noqa: E402
from standins import (CachedRequestData, Engine, Group, KVConnectorOutput,  # noqa: E402
                      KVCacheBlocks, NewRequestData, Request, SchedulerOutput)


def per_call(fn, reps):
    """Median seconds per call over `reps` batches of 50 calls."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        times.append((time.perf_counter() - t0) / 50)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    n = a.requests
    with kvd.Daemon(name="bench", transport="local") as d:
        kv.register_embedded_daemon("bench", d)
        group = Group(layers=a.layers, heads=8, head_dim=64, block_size=16)
        eng = Engine("bench", "kv_both", {"kvd_embedded": "bench"}, [group],
                     blocks=n * 4 + 8)
        sched, worker = eng.connector, eng.workers[0]
        names = group.names(0)
        reqs = [Request(f"r{i}", list(range(i, i + 48)), max_tokens=1 << 20,
                        kv_transfer_params={"do_remote_decode": True}) for i in range(n)]
        blocks = {r.request_id: [list(range(1 + 4 * i, 4 + 4 * i))] for i, r in enumerate(reqs)}
        results = {}

        # 1. A decode-phase scheduler step: 64 running requests, one token each, no transfer
        # work: build_connector_meta + update_connector_output.
        for r in reqs:
            sched.on_new_request(r)
        new = [NewRequestData(r.request_id, r.prompt_token_ids, tuple(blocks[r.request_id]),
                              48) for r in reqs]
        so0 = SchedulerOutput(new, CachedRequestData(), {r.request_id: 1 for r in reqs}, n,
                              set())
        sched.build_connector_meta(so0)  # the prompts are done: saves for all 64
        cached = CachedRequestData([r.request_id for r in reqs], set(), [None] * n, [49] * n)
        so = SchedulerOutput([], cached, {r.request_id: 1 for r in reqs}, n, set())
        out = KVConnectorOutput()

        def sched_step():
            sched.build_connector_meta(so)
            sched.update_connector_output(out)
        results["scheduler step (64 running, build_connector_meta + update_connector_output)"] = \
            per_call(sched_step, a.reps)

        # 2. Admission of 64 requests: get_num_new_matched_tokens + update_state_after_alloc.
        def admit():
            for r in reqs:
                sched.get_num_new_matched_tokens(r, 0)
                sched.update_state_after_alloc(r, KVCacheBlocks(blocks[r.request_id]), 0)
        results["admission of 64 requests (per request)"] = per_call(admit, a.reps) / n

        # 3. Worker hooks with nothing to do (decode steps): metadata with no saves or loads.
        empty = sched.build_connector_meta(so)
        worker.bind_connector_metadata(empty)
        worker.start_load_kv(None)
        results["wait_for_layer_load, nothing to wait for"] = \
            per_call(lambda: worker.wait_for_layer_load(names[0]), a.reps)
        results["save_kv_layer, nothing to save"] = \
            per_call(lambda: worker.save_kv_layer(names[0], None, None), a.reps)
        results["worker step with no work (start_load_kv + wait_for_save + get_finished + "
                "get_block_ids_with_load_errors)"] = per_call(
            lambda: (worker.start_load_kv(None), worker.wait_for_save(),
                     worker.get_finished(set()), worker.get_block_ids_with_load_errors()),
            a.reps)
        worker.clear_connector_metadata()

        # 4. save_kv_layer of a step whose 64 prompts all complete: one kvd save_layer per
        # request (the C API has no batched save).
        from kvd.vllm.metadata import KvdConnectorMetadata
        saves = KvdConnectorMetadata(saves={r.request_id: blocks[r.request_id] for r in reqs})
        worker.bind_connector_metadata(saves)
        t0 = time.perf_counter()
        for name in names:
            worker.save_kv_layer(name, None, None)
        results["save_kv_layer, 64 requests to save (per call)"] = \
            (time.perf_counter() - t0) / len(names)
        worker.clear_connector_metadata()

        # 5. start_load_kv of a decode step that starts 64 P/D loads (one kv_start_loads call;
        # the source kvd never saves them, so they wait, then fail when it stops).
        from kvd.vllm.metadata import LoadSpec
        src = kvd.Daemon(name="source", transport="local")
        params = {"kvd_peer_address": src.address, "kvd_peer_name": "source",
                  "kvd_protocol": kv.PROTOCOL_VERSION, "kvd_layout": worker._worker.fingerprint}
        logging.getLogger("kvd.vllm").setLevel(logging.CRITICAL)  # the loads fail at the end
        times = []
        for rep in range(5):
            loads = KvdConnectorMetadata(loads=[
                LoadSpec(f"load-{rep}-{i}", dict(params, remote_request_id=f"src-{rep}-{i}"),
                         blocks[r.request_id], 48) for i, r in enumerate(reqs)])
            worker.bind_connector_metadata(loads)
            t0 = time.perf_counter()
            worker.start_load_kv(None)
            times.append(time.perf_counter() - t0)
            worker.clear_connector_metadata()
        results["start_load_kv starting 64 loads (one kv_start_loads; median of 5)"] = \
            statistics.median(times)
        src.stop()
        eng.shutdown()
        kv.register_embedded_daemon("bench", None)
    print(f"kvd.vllm overhead, {n} requests, {a.layers} layers, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} cpus")
    for what, s in results.items():
        print(f"  {s * 1e6:10.2f} us  {what}")


if __name__ == "__main__":
    main()
