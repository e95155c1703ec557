"""Shared part of the peer harnesses (nixl_bench.py, mooncake_bench.py): the request shape of
`kvbench pd --memory cuda --block-ids random [--decode-tp N]`, the caches and their byte pattern,
the worker processes and the driver that times a peer on them.

Shape: Llama-3-8B by default (32 layers, 8 KV heads, head dim 128, bf16: C = K|V = 512 bytes per
head-token), 4096 tokens per request, block 16, so 256 blocks per request.
  LBNHC: one page per (layer, block) = 16 tokens x 8 heads x 512 B = 64 KiB; a request is
         32 x 256 = 8192 descriptors of 64 KiB (512 MiB).
  BLHNC: one page per block holding every layer = 2 MiB; a request is 256 descriptors.
Block ids are a seeded shuffle of the wave's blocks, drawn independently for the source and the
destination (as kvbench's --block-ids random), so no two pages of a request are adjacent on
both sides and a peer cannot merge descriptors. A few guard blocks past the wave's are never
addressed and are checked to stay poisoned.
TP 1 -> N (--decode-tp N, N > 1): N decode ranks, each its own process and cache on GPU 1 with
its H/N heads in the same order (geometry.py: which source bytes go to which rank, and the
descriptors: one per contiguous run, merged where contiguous on both sides). Every decode rank
uses the request's one list of decode block ids (kvbench's). A request moves every layer of
every block to every rank: at the default shape and TP 1 -> 2, LBNHC is 262,144 descriptors of
2 KiB per request (131,072 per rank), BLHNC 16,384 of 32 KiB (8192 per rank); the wave's bytes
are the TP 1 wave's.

Processes: worker 0 owns the source cache (GPU 0, the prefill side), worker 1 + r the cache of
decode rank r (GPU 1, the decode side); all see both GPUs. WRITE is initiated by worker 0 (push
into every rank), READ by each decode worker (each pulls its own heads, concurrently). The driver
(this process) speaks one JSON line per command with each worker over its stdin/stdout; a
worker's own stdout (and everything a peer library prints there) is moved to stderr, which the
driver saves as the worker's log.

Timing, per op: every request of the wave (--window requests) is prepared once (descriptors
built, and whatever the peer's API prepares ahead); one iteration posts all of them and polls
until the last completes, on the initiator's host clock. The first iteration on fresh handles is
reported apart as "cold" (it pays the peer's first mapping of the remote memory); then --warmup
iterations, then --iters timed ones: GB/s = wave bytes / iteration time, median and the
aggregate (bytes over summed time, kvbench's definition). With several initiators (READ at
TP 1 -> N) each iteration is started on every initiator at one agreed CLOCK_MONOTONIC instant
and timed from the earliest start to the latest completion. When the cold iteration took over
2 s, the warm-up is skipped and 2 iterations are timed; with --budget-s the timed (and warm-up)
iterations are further cut to what fits the ops' share of the budget, down to none (the op then
reports its cold iteration only). The destination is poisoned before the cold iteration and
again before the timed ones, and every byte of every request (and the guard pages) is checked
after each, on every decode rank: a peer that skipped or misplaced a byte fails the run.

Ceiling (every TP): one request's bytes (512 MiB at the default shape; at TP 1 -> N the sum over
the ranks, the same bytes) GPU 0 -> GPU 1 in one torch copy_, as kvbench pd's cudaMemcpyPeerAsync
ceiling of one request in one piece.
"""

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import geometry

KEY = 1000003  # page content: int32 word i of page p holds (p * KEY + i) & 0x7fffffff


class Shape:
    """One cache's shape: the prefill cache (every head) or, with `heads`, a decode rank's."""

    def __init__(self, a, heads=None):
        heads = a.heads if heads is None else heads
        self.layers, self.heads, self.head_dim = a.layers, heads, a.head_dim
        self.block, self.tokens, self.order, self.window = a.block_size, a.tokens, a.order, a.window
        self.guard = a.guard_blocks
        self.seed = a.seed
        head_token = 2 * a.head_dim * 2  # K|V, bf16
        self.layer_page = a.block_size * heads * head_token
        self.blocks_per_req = (a.tokens + a.block_size - 1) // a.block_size
        self.used_blocks = self.blocks_per_req * a.window
        self.nblocks = self.used_blocks + a.guard_blocks
        if a.order == "LBNHC":
            self.page = self.layer_page
            self.npages = a.layers * self.nblocks
        elif a.order == "BLHNC":
            self.page = self.layer_page * a.layers
            self.npages = self.nblocks
        else:
            raise ValueError("order must be LBNHC or BLHNC")
        self.layout = geometry.Layout(a.order, a.layers, self.nblocks, a.block_size, heads,
                                      head_token)
        assert self.layout.page == self.page
        self.cache_bytes = self.page * self.npages
        self.req_bytes = self.layer_page * a.layers * self.blocks_per_req

    def request_pages(self, side):
        """Page ids of each request, in descriptor order; side 0 = source, 1 = destination."""
        perm = np.random.default_rng(self.seed + side).permutation(self.used_blocks)
        out = []
        for r in range(self.window):
            blocks = perm[r * self.blocks_per_req:(r + 1) * self.blocks_per_req].astype(np.int64)
            if self.order == "LBNHC":
                pids = (np.arange(self.layers, dtype=np.int64)[:, None] * self.nblocks
                        + blocks[None, :]).reshape(-1)
            else:
                pids = blocks
            out.append(pids)
        return out


class Cache:
    """One side's KV cache: GPU memory through torch (device >= 0) or host memory (device < 0,
    numpy; the CPU-only rehearsal of the harness logic)."""

    def __init__(self, shape, device):
        self.shape, self.device = shape, device
        words = shape.page // 4
        if device >= 0:
            import torch
            self.torch = torch
            torch.cuda.set_device(device)
            self.buf = torch.empty(shape.cache_bytes, dtype=torch.uint8, device=f"cuda:{device}")
            self.ints = self.buf.view(torch.int32).view(shape.npages, words)
            self.addr = self.buf.data_ptr()
        else:
            self.torch = None
            self.buf = np.empty(shape.cache_bytes, dtype=np.uint8)
            self.ints = self.buf.view(np.int32).reshape(shape.npages, words)
            self.addr = self.buf.ctypes.data
        self.words = words

    def _idx(self, pids):
        if self.torch:
            return self.torch.as_tensor(pids, device=self.buf.device)
        return np.asarray(pids)

    def expected(self, pids, words=None):
        """What pages `pids` hold: word i of page p is (p * KEY + i) & 0x7fffffff. With `words`
        (geometry.word_map, one source word index per word of this cache's page), what a
        destination page fed from source pages `pids` holds."""
        if self.torch:
            t = self.torch
            p = t.as_tensor(pids, dtype=t.int64, device=self.buf.device)
            i = (t.arange(self.words, dtype=t.int64, device=self.buf.device) if words is None
                 else t.as_tensor(words, dtype=t.int64, device=self.buf.device))
            return ((p[:, None] * KEY + i[None, :]) & 0x7FFFFFFF).to(t.int32)
        i = np.arange(self.words, dtype=np.int64) if words is None else np.asarray(words)
        return ((np.asarray(pids, dtype=np.int64)[:, None] * KEY + i[None, :])
                & 0x7FFFFFFF).astype(np.int32)

    def chunk(self):
        return max(1, (64 << 20) // self.shape.page)

    def fill_pattern(self):
        c = self.chunk()
        for s in range(0, self.shape.npages, c):
            pids = np.arange(s, min(s + c, self.shape.npages))
            self.ints[s:s + len(pids)] = self.expected(pids)
        self.sync()

    def poison(self):
        if self.torch:
            self.ints.fill_(-1)
        else:
            self.ints.fill(-1)
        self.sync()

    def sync(self):
        if self.torch:
            self.torch.cuda.synchronize(self.device)

    def verify(self, src_reqs, dst_reqs, words=None):
        """Every destination page of every request holds its source page (its words as `words`
        maps them, see expected); every other page is still poisoned. Returns (pages checked,
        bad pages)."""
        src = np.concatenate(src_reqs)
        dst = np.concatenate(dst_reqs)
        bad = checked = 0
        c = self.chunk()
        for s in range(0, len(dst), c):
            got = self.ints[self._idx(dst[s:s + c])]
            exp = self.expected(src[s:s + c], words)
            bad += int((got != exp).any(1).sum())
            checked += len(dst[s:s + c])
        rest = np.setdiff1d(np.arange(self.shape.npages), dst)
        for s in range(0, len(rest), c):
            got = self.ints[self._idx(rest[s:s + c])]
            bad += int((got != -1).any(1).sum())
            checked += len(rest[s:s + c])
        return checked, bad


def worker_device(wid, memory):
    """The GPU of worker `wid`: 0 for the source (worker 0), 1 for every decode rank; -1 (host
    memory) in the CPU-only rehearsal."""
    if memory != "cuda":
        return -1
    return 0 if wid == 0 else 1


def nixl_rows(addr, lens, dev):
    """(addr, len, dev) rows, int64: NIXL's Nx3 descriptor form."""
    out = np.empty((len(addr), 3), dtype=np.int64)
    out[:, 0] = addr
    out[:, 1] = lens
    out[:, 2] = dev
    return out


def shapes(args):
    """(source shape, decode-rank shape) of a run."""
    if args.decode_tp < 1 or args.heads % args.decode_tp:
        raise ValueError(f"{args.heads} heads do not split over decode TP {args.decode_tp}")
    return Shape(args), Shape(args, heads=args.heads // args.decode_tp)


# ----------------------------------------------------------------------------------- worker


def worker_main(peer_cls, wid, args):
    """Worker `wid`: 0 the source, 1 + r decode rank r. Its peer gets, per op, a plan: one
    transfer per request and remote worker, in posting order (request by request, each to every
    rank it feeds): (remote worker, local addresses, remote addresses, lengths), the last three
    int64 arrays of one entry per run (geometry.py)."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the peer library prints goes to the log, not the protocol pipe
    src_shape, dst_shape = shapes(args)
    shape = src_shape if wid == 0 else dst_shape
    device = worker_device(wid, args.memory)
    cache = Cache(shape, device)
    if wid == 0:
        cache.fill_pattern()
    else:
        cache.poison()
    peer = peer_cls(wid, shape, cache, device, args)
    src_reqs, dst_reqs = src_shape.request_pages(0), dst_shape.request_pages(1)
    ranks = range(args.decode_tp) if wid == 0 else [wid - 1]
    sl, dl = src_shape.layout, dst_shape.layout
    templates = {r: geometry.page_template(sl, dl, r) for r in ranks}
    words = (geometry.word_map(sl, dl, wid - 1) if wid > 0 and args.decode_tp > 1 else None)
    remote_base = {}

    def plan():
        out = []
        for sp, dp in zip(src_reqs, dst_reqs):
            for r in ranks:
                other = r + 1 if wid == 0 else 0
                so, do, ln = geometry.request_runs(sl, dl, r, sp, dp, templates[r])
                mine, theirs = (so, do) if wid == 0 else (do, so)
                out.append((other, cache.addr + mine, remote_base[other] + theirs, ln))
        return out

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["cmd"]
        try:
            if op == "init":
                res = {"meta": base64.b64encode(peer.init()).decode(), "base": cache.addr}
            elif op == "connect":
                peer.connect(cmd["peer"], base64.b64decode(cmd["meta"]))
                remote_base[cmd["peer"]] = cmd["base"]
                res = {}
            elif op == "prep":
                p = plan()
                t0 = time.perf_counter()
                peer.prep(cmd["op"], p)
                res = {"prep_s": time.perf_counter() - t0}
            elif op == "run":
                if "go" in cmd:  # several initiators: start together (CLOCK_MONOTONIC is shared)
                    while time.monotonic() < cmd["go"]:
                        pass
                times, spans = [], []
                for _ in range(cmd["iters"]):
                    t0 = time.monotonic()
                    peer.run_wave(cmd["op"])
                    t1 = time.monotonic()
                    times.append(t1 - t0)
                    spans.append((t0, t1))
                res = {"times": times, "spans": spans, "transport": peer.transport(cmd["op"])}
            elif op == "poison":
                cache.poison()
                res = {}
            elif op == "verify":
                t0 = time.perf_counter()
                checked, bad = cache.verify(src_reqs, dst_reqs, words)
                res = {"checked": checked, "bad": bad, "verify_s": time.perf_counter() - t0}
            elif op == "ceiling":
                res = {"times": ceiling(cache, shape, args.ceiling_iters)}
            elif op == "quit":
                peer.close()
                proto.write(json.dumps({"ok": True}) + "\n")
                return
            else:
                raise ValueError(op)
            res["ok"] = True
        except Exception as e:  # reported to the driver, which fails the run
            import traceback
            traceback.print_exc()
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        proto.write(json.dumps(res) + "\n")


def ceiling(cache, shape, iters):
    """One request's bytes GPU 0 -> GPU 1 in one piece (torch copy_ between devices: the copy
    engine, as kvbench's cudaMemcpyPeerAsync ceiling), median of `iters` after 2 warm-ups."""
    torch = cache.torch
    if torch is None:
        return []
    src = cache.buf[:shape.req_bytes]
    dst = torch.empty(shape.req_bytes, dtype=torch.uint8, device="cuda:1")
    times = []
    for i in range(iters + 2):
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    if not torch.equal(dst[:4096].cpu(), src[:4096].cpu()):
        raise RuntimeError("ceiling copy wrong")
    return times


# ----------------------------------------------------------------------------------- driver


class Worker:
    def __init__(self, script, rank, argv, logdir, name):
        self.log_path = os.path.join(logdir, f"{name}.worker{rank}.log")
        self.log = open(self.log_path, "w")
        self.p = subprocess.Popen([sys.executable, script, "--worker", str(rank)] + argv,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.log, text=True, bufsize=1)

    def send(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()

    def recv(self):
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"worker died; see {self.log_path}")
        res = json.loads(line)
        if not res.get("ok"):
            raise RuntimeError(f"worker: {res.get('error')}; see {self.log_path}")
        return res

    def call(self, **cmd):
        self.send(**cmd)
        return self.recv()


def call_all(workers, **cmd):
    """The same command to every worker at once (they run it concurrently); their replies."""
    for x in workers:
        x.send(**cmd)
    return [x.recv() for x in workers]


def run_waves(inits, op, iters):
    """`iters` iterations of `op` on the initiators: (seconds per iteration, transport). One
    initiator runs them back to back; several start each iteration together and it lasts from
    the earliest start to the latest completion."""
    if len(inits) == 1:
        r = inits[0].call(cmd="run", op=op, iters=iters)
        return r["times"], r["transport"]
    times, transport = [], ""
    for _ in range(iters):
        rs = call_all(inits, cmd="run", op=op, iters=1, go=time.monotonic() + 0.02)
        times.append(max(r["spans"][0][1] for r in rs) - min(r["spans"][0][0] for r in rs))
        transport = rs[0]["transport"]
    return times, transport


def gbps(nbytes, t):
    return nbytes / t / 1e9


RESERVE_S = {"cuda": 8, "host": 2}  # of --budget-s, kept for the ceiling and closing the peers


def run_ops(args, w, ops, wave, t_start, result):
    """Times and verifies each op into result["ops"]; returns the first error ("" if none): a
    worker's error ends the ops, and those done so far stay reported."""
    dec = w[1:]
    for k, op in enumerate(ops):
        try:
            inits = [w[0]] if op == "WRITE" else dec
            prep = call_all(inits, cmd="prep", op=op)
            call_all(dec, cmd="poison")
            cold, cold_transport = run_waves(inits, op, 1)
            v1 = call_all(dec, cmd="verify")
            warmup, iters = args.warmup, args.iters
            if cold[0] > 2.0:  # a slow path (e.g. a TCP fallback): keep the call short
                warmup, iters = 0, min(iters, 2)
            if args.budget_s > 0:  # what fits this op's share of the budget left
                left = args.budget_s - (time.monotonic() - t_start) - RESERVE_S[args.memory]
                share = left / (len(ops) - k)
                fit = max(0, int((share - max(v["verify_s"] for v in v1)) / cold[0]))
                iters = min(iters, fit)
                warmup = min(warmup, fit - iters)
            t, transport, v2 = [], "", []
            if iters:
                call_all(dec, cmd="poison")
                if warmup:
                    run_waves(inits, op, warmup)
                t, transport = run_waves(inits, op, iters)
                v2 = call_all(dec, cmd="verify")
            bad = [a["bad"] + (v2[i]["bad"] if v2 else 0) for i, a in enumerate(v1)]
            r = {"prep_s": max(p["prep_s"] for p in prep), "cold_gbps": gbps(wave, cold[0]),
                 "iters": len(t), "warmup": warmup if iters else 0,
                 "transport": transport or cold_transport,
                 "verified_pages": sum(v["checked"] for v in v1 + v2), "bad_pages": sum(bad),
                 "bad_pages_by_rank": bad}
            if t:
                r.update({"median_gbps": gbps(wave, statistics.median(t)),
                          "aggregate_gbps": gbps(wave * len(t), sum(t)),
                          "min_gbps": gbps(wave, max(t)), "max_gbps": gbps(wave, min(t))})
            result["ops"][op] = r
        except RuntimeError as e:
            return f"{op}: {e}"
    return ""


def driver_main(peer_name, script, args, argv, grep_transport):
    t_start = time.monotonic()
    shape, dshape = shapes(args)
    tp = args.decode_tp
    os.makedirs(args.logdir, exist_ok=True)
    tag = f"{peer_name}-{args.order}-w{args.window}" + (f"-tp{tp}" if tp > 1 else "")
    src0, dst0 = shape.request_pages(0)[0], dshape.request_pages(1)[0]
    runs = [geometry.request_runs(shape.layout, dshape.layout, r, src0, dst0) for r in range(tp)]
    result = {"peer": peer_name, "order": args.order, "window": args.window, "decode_tp": tp,
              "memory": args.memory, "descs_per_request": sum(len(x[2]) for x in runs),
              "runs_per_rank": [len(x[2]) for x in runs],
              "run_bytes": sorted({int(n) for x in runs for n in x[2]}),
              "page_bytes": shape.page, "request_bytes": shape.req_bytes, "argv": argv,
              "ops": {}}
    w = [Worker(script, r, argv, args.logdir, tag) for r in range(tp + 1)]
    try:
        info = [x.call(cmd="init") for x in w]
        for r in range(1, tp + 1):
            w[0].call(cmd="connect", peer=r, meta=info[r]["meta"], base=info[r]["base"])
            w[r].call(cmd="connect", peer=0, meta=info[0]["meta"], base=info[0]["base"])
        wave = shape.req_bytes * shape.window
        ops = args.ops.split(",")
        error = run_ops(args, w, ops, wave, t_start, result)
        if error:  # the ops done so far are still reported
            result["error"] = error
        elif args.memory == "cuda":
            c = w[0].call(cmd="ceiling")["times"]
            result["ceiling_gbps"] = gbps(shape.req_bytes, statistics.median(c))
        if not error:
            for x in w:
                x.call(cmd="quit")
    finally:
        for x in w:  # after an error the workers still read commands: end their input
            try:
                x.p.stdin.close()
            except OSError:
                pass
        for x in w:
            try:
                x.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                x.p.kill()
            x.log.close()
    result["transport_log"] = grep_transport([x.log_path for x in w])
    ok = (not result.get("error") and bool(result["ops"])
          and all(r["bad_pages"] == 0 for r in result["ops"].values()))
    result["verified"] = ok
    result["wall_s"] = time.monotonic() - t_start
    print_result(result)
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(json.dumps(result) + "\n")
    return 0 if ok else 1


def g(x):
    """GB/s to print: one decimal, three below 1 GB/s (slow paths stay readable)."""
    return f"{x:.1f}" if x >= 1 else f"{x:.3f}"


def print_result(r):
    ceil = r.get("ceiling_gbps")
    tp = r.get("decode_tp", 1)
    if tp > 1:
        what = (f"{r['descs_per_request']} descriptors per request ({tp} ranks x "
                f"{'/'.join(map(str, r['runs_per_rank']))} runs of "
                f"{'/'.join(map(str, r['run_bytes']))} B)")
    else:
        what = f"{r['descs_per_request']} descriptors of {r['page_bytes']} B per request"
    print(f"== {r['peer']} {f'TP 1->{tp} ' if tp > 1 else ''}{r['order']} window {r['window']} "
          f"({r['memory']}): {what}, {r['request_bytes'] >> 20} MiB")
    for op, x in r["ops"].items():
        tail = (f"cold {g(x['cold_gbps'])}  prep {x['prep_s'] * 1e3:.0f} ms  "
                f"pages verified {x['verified_pages']} bad {x['bad_pages']}  via {x['transport']}")
        if not x["iters"]:
            print(f"  {op:5s} timed: none (out of budget)  {tail}")
            continue
        ratio = f" ratio {x['aggregate_gbps'] / ceil:.3f}" if ceil else ""
        print(f"  {op:5s} aggregate {g(x['aggregate_gbps']):>8s} GB/s  median "
              f"{g(x['median_gbps']):>8s}  [{g(x['min_gbps'])}..{g(x['max_gbps'])}] over "
              f"{x['iters']}{ratio}  {tail}")
    if ceil:
        print(f"  ceiling (one {r['request_bytes'] >> 20} MiB copy GPU0->GPU1, torch copy_): "
              f"{ceil:.1f} GB/s")
    if r.get("error"):
        print(f"  error: {r['error']}")
    for line in r["transport_log"]:
        print(f"  log: {line}")
    print(f"  verified: {'OK' if r['verified'] else 'FAILED'}  ({r['wall_s']:.0f} s)")


def parse(argv, extra=None):
    p = argparse.ArgumentParser()
    p.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--memory", choices=["cuda", "host"], default="cuda")
    p.add_argument("--order", choices=["LBNHC", "BLHNC"], default="LBNHC")
    p.add_argument("--ops", default="WRITE,READ")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--window", type=int, default=32, help="requests in flight per iteration")
    p.add_argument("--decode-tp", type=int, default=1, help="decode ranks (processes on GPU 1)")
    p.add_argument("--guard-blocks", type=int, default=16)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--ceiling-iters", type=int, default=10)
    p.add_argument("--logdir", default="/tmp/peer-logs")
    p.add_argument("--json-out", default="")
    p.add_argument("--budget-s", type=float, default=0,
                   help="seconds this run may take: timed iterations are cut to fit (0: no limit)")
    if extra:
        extra(p)
    a = p.parse_args(argv)
    return a


def main(peer_name, peer_cls, script, grep_transport, extra=None):
    argv = sys.argv[1:]
    a = parse(argv, extra)
    if a.worker >= 0:
        worker_main(peer_cls, a.worker, a)
        return 0
    return driver_main(peer_name, script, a, argv, grep_transport)


def grep_lines(paths, needles, limit=8):
    out = []
    for p in paths:
        try:
            with open(p, errors="replace") as f:
                for line in f:
                    if any(n in line for n in needles):
                        s = f"{os.path.basename(p)}: {line.strip()[:200]}"
                        if s not in out:
                            out.append(s)
                        if len(out) >= limit:
                            return out
        except OSError:
            pass
    return out
