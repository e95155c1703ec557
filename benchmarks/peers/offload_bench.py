#!/usr/bin/env python3
"""Offload peers on `kvbench offload`'s shape: GPU cache <-> pinned host pool, same bytes.

kvbench offload (GPU defaults): Llama-3-8B pages, 4096 blocks in the engine's cache, batches of
512 random engine blocks stored into a pool of 2 x 512 block slots, then loaded back into other
random blocks. LBNHC pages are one layer of one block (64 KiB: 32 x 512 = 16384 copies per
batch); BLNHC pages a whole block (2 MiB: 512 copies). A pool slot holds one block, its layers
back to back. This script moves the same batches with:

  nixl      NIXL (UCX backend) in one agent: GPU cache and host pool both registered, a
            loopback transfer (WRITE from the source's descriptors to the destination's) prepared
            once per direction and posted per iteration; UCX picks cuda_copy.
  batched   vLLM's own offload copy, re-implemented here (not vLLM's code): one
            cuMemcpyBatchAsync per batch over the pages (cuda.bindings), on one stream, the
            pointer lists built once. Labelled "vLLM method (re-implemented)".
  ceiling   one contiguous copy of the batch's bytes, GPU -> pinned host and back (torch copy_,
            i.e. one cudaMemcpyAsync), as kvbench offload's ceiling.

Each: median of --iters after 2 warm-ups, GB/s = batch bytes / time, on the host clock around
post .. completion; every store and every load verified byte for byte (the pool slots against
the cache's pages, the loaded pages against the slots), on the GPU after the timed runs.

usage: offload_bench.py [--layouts LBNHC,BLNHC] [--methods nixl,batched] [--json-out F]
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np

LAYERS, HEADS, HEAD_DIM, BS = 32, 8, 128, 16
LPAGE = BS * HEADS * 2 * HEAD_DIM * 2  # one layer of one block: 64 KiB
BPAGE = LPAGE * LAYERS  # a block: 2 MiB


def pages(layout, blocks, slots, cache, pool, nblocks):
    """(gpu address, host address, length) of every page of the batch, in copy order."""
    blocks = np.asarray(blocks, dtype=np.int64)
    slots = np.asarray(slots, dtype=np.int64)
    if layout == "LBNHC":
        l = np.arange(LAYERS, dtype=np.int64)[:, None]
        g = cache + (l * nblocks + blocks[None, :]) * LPAGE
        h = pool + slots[None, :] * BPAGE + l * LPAGE
        return g.reshape(-1), h.reshape(-1), LPAGE
    return cache + blocks * BPAGE, pool + slots * BPAGE, BPAGE


class Nixl:
    name = "NIXL loopback (UCX)"

    def __init__(self, cache_t, pool_t):
        from nixl_cu13._api import nixl_agent, nixl_agent_config
        self.a = nixl_agent("offload", nixl_agent_config(backends=["UCX"]))
        self.a.register_memory([(cache_t.data_ptr(), cache_t.numel(), 0, "")], "VRAM")
        self.a.register_memory([(pool_t.data_ptr(), pool_t.numel(), 0, "")], "DRAM")
        self.h = {}

    def prep(self, key, src, src_mem, dst, dst_mem, n):
        d = lambda addrs: np.stack([addrs, np.full(len(addrs), n), np.zeros(len(addrs))],
                                   1).astype(np.int64)
        ls = self.a.prep_xfer_dlist("NIXL_INIT_AGENT", d(src), src_mem)
        rs = self.a.prep_xfer_dlist(self.a.name, d(dst), dst_mem)
        idx = np.arange(len(src), dtype=np.int32)
        self.h[key] = self.a.make_prepped_xfer("WRITE", ls, idx, rs, idx)

    def run(self, key):
        h = self.h[key]
        st = self.a.transfer(h)
        deadline = time.monotonic() + 60
        while st == "PROC":
            st = self.a.check_xfer_state(h)
            if time.monotonic() > deadline:
                raise RuntimeError("NIXL transfer did not finish in 60 s")
        if st != "DONE":
            raise RuntimeError(f"NIXL transfer {st}")

    def transport(self, key):
        return self.a.query_xfer_backend(self.h[key])


class Batched:
    name = "vLLM method (re-implemented): one cuMemcpyBatchAsync per batch"

    def __init__(self, cache_t, pool_t):
        import torch
        from cuda.bindings import driver
        self.torch, self.drv = torch, driver
        self.stream = torch.cuda.Stream()
        attr = driver.CUmemcpyAttributes()
        attr.srcAccessOrder = driver.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
        self.attr = attr
        self.h = {}

    def prep(self, key, src, src_mem, dst, dst_mem, n):
        P = self.drv.CUdeviceptr
        self.h[key] = ([P(int(x)) for x in dst], [P(int(x)) for x in src], [int(n)] * len(src))

    def run(self, key):
        dsts, srcs, sizes = self.h[key]
        err = self.drv.cuMemcpyBatchAsync(dsts, srcs, sizes, len(sizes), [self.attr], [0], 1,
                                          self.drv.CUstream(self.stream.cuda_stream))
        err = err[0] if isinstance(err, tuple) else err
        if err != self.drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuMemcpyBatchAsync: {err}")
        self.stream.synchronize()

    def transport(self, key):
        return "copy engine"


def timed(fn, iters, warmup=2):
    for _ in range(warmup):
        fn()
    t = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return statistics.median(t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layouts", default="LBNHC,BLNHC")
    p.add_argument("--methods", default="nixl,batched")
    p.add_argument("--blocks", type=int, default=4096)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--json-out", default="")
    a = p.parse_args()
    import torch
    torch.cuda.set_device(0)
    nbytes = a.blocks * BPAGE
    cache = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    pool = torch.empty(2 * a.batch * BPAGE, dtype=torch.uint8, pin_memory=True)
    words = cache.view(torch.int32)
    words.copy_(torch.randint(-2**31, 2**31 - 1, (words.numel(),), dtype=torch.int32,
                              device="cuda:0"))
    keep = cache.clone()  # reference copy of every page, to verify loads against
    rng = np.random.default_rng(a.seed)
    perm = rng.permutation(a.blocks)
    sblocks, lblocks = perm[:a.batch], perm[a.batch:2 * a.batch]
    slots = np.arange(a.batch)
    batch_bytes = a.batch * BPAGE
    ca, pa = cache.data_ptr(), pool.data_ptr()
    results = []
    # the ceiling: one contiguous copy of the batch's bytes each way
    src, hst = cache[:batch_bytes], pool[:batch_bytes]
    d2h = timed(lambda: (hst.copy_(src, non_blocking=True), torch.cuda.synchronize()), a.iters)
    h2d = timed(lambda: (src.copy_(hst, non_blocking=True), torch.cuda.synchronize()), a.iters)
    cache.copy_(keep)
    ceil = {"store": batch_bytes / d2h / 1e9, "load": batch_bytes / h2d / 1e9}
    print(f"== offload, {a.batch} blocks of {BPAGE >> 20} MiB per batch ({batch_bytes >> 20} MiB), "
          f"{torch.cuda.get_device_name(0)}")
    print(f"  ceiling (one cudaMemcpyAsync, torch copy_): store {ceil['store']:.1f} GB/s, "
          f"load {ceil['load']:.1f} GB/s")
    for m in a.methods.split(","):
        try:
            eng = (Nixl if m == "nixl" else Batched)(cache, pool)
        except Exception as e:  # a missing peer is reported, not fatal to the others
            print(f"  {m}: unavailable: {type(e).__name__}: {e}")
            continue
        for layout in a.layouts.split(","):
            g, h, n = pages(layout, sblocks, slots, ca, pa, a.blocks)
            gl, hl, _ = pages(layout, lblocks, slots, ca, pa, a.blocks)
            eng.prep(("store", layout), g, "VRAM", h, "DRAM", n)
            eng.prep(("load", layout), hl, "DRAM", gl, "VRAM", n)
            r = {"method": eng.name, "layout": layout, "copies": len(g), "page": n,
                 "batch_bytes": batch_bytes, "ceiling": ceil}
            for op in ("store", "load"):
                if op == "store":
                    pool.fill_(0xA5)
                    cache.copy_(keep)  # an earlier layout's loads rewrote pages of this one
                else:
                    cache.copy_(keep)  # a skipped load would leave the old bytes: detected
                # the peers copy on their own streams: the restore must be done before they start
                torch.cuda.synchronize()
                t = timed(lambda: eng.run((op, layout)), a.iters, a.warmup)
                r[op] = batch_bytes / t / 1e9
                r[op + "_transport"] = eng.transport((op, layout))
            # verify every byte: the pool's slots hold the stored pages, the loaded pages the slots
            torch.cuda.synchronize()
            poolg = pool.to("cuda:0").view(2 * a.batch, LAYERS, LPAGE)[torch.as_tensor(slots)]
            sb, lb = torch.as_tensor(sblocks), torch.as_tensor(lblocks)
            if layout == "LBNHC":
                stored = keep.view(LAYERS, a.blocks, LPAGE)[:, sb].transpose(0, 1)
                loaded = cache.view(LAYERS, a.blocks, LPAGE)[:, lb].transpose(0, 1)
            else:
                stored = keep.view(a.blocks, LAYERS, LPAGE)[sb]
                loaded = cache.view(a.blocks, LAYERS, LPAGE)[lb]
            bad = int((stored != poolg).reshape(a.batch, -1).any(1).sum())
            bad += int((loaded != poolg).reshape(a.batch, -1).any(1).sum())
            del poolg, stored, loaded
            r["bad_pages"] = bad
            results.append(r)
            print(f"  {eng.name:58s} {layout}: {len(g):5d} copies of {n >> 10:4d} KiB  "
                  f"store {r['store']:6.1f} GB/s ({r['store'] / ceil['store']:.2f})  "
                  f"load {r['load']:6.1f} GB/s ({r['load'] / ceil['load']:.2f})  "
                  f"via {r['store_transport']}  verified: {'OK' if bad == 0 else f'{bad} BAD'}")
    if a.json_out:
        with open(a.json_out, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    return 0 if all(r["bad_pages"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
