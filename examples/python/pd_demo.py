#!/usr/bin/env python3
"""Disaggregated prefill/decode from Python with kvd.

Two kvd daemons (kvd processes, or embedded kvd cores with --embedded), a prefill engine and a
decode engine, each with a paged KV cache in vLLM's layout built on kvd's shared host memory.
The prefill engine "computes" each layer (random K/V for the prompt's tokens), saves it with
save_layer, and finishes the request; the decode engine loads it (push: announced up front, so
the layers stream while the prefill runs) and waits layer by layer; every element is checked.

    python3 examples/python/pd_demo.py [--requests 8] [--mode push|pull] [--embedded]
"""

import argparse
import os
import sys
import tempfile
import time

try:
    import kvd
except ImportError:  # in the repository: the in-tree package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "python"))
    import kvd

try:
    import torch
except ImportError:
    print("SKIP: the demo needs torch (Debian: python3-torch)")
    sys.exit(77)

from kvd import testing as kt
from kvd.daemon import KvdProcess

LAYERS, HEADS, HEAD_DIM, BLOCK, BLOCKS = 8, 8, 64, 16, 256


class Engine:
    def __init__(self, connector, order):
        self.c = connector
        self.raw = kvd.allocate_host_kv_cache(
            kt.kv_nbytes(order, LAYERS, BLOCKS, HEADS, BLOCK, HEAD_DIM, 2))
        self.views, _ = kt.vllm_kv_caches(self.raw, order, LAYERS, BLOCKS, HEADS, BLOCK,
                                          HEAD_DIM)
        (self.region,) = connector.register_kv_caches(self.views)
        self.next_block = 0

    def allocate(self, tokens):
        n = (tokens + BLOCK - 1) // BLOCK
        if self.next_block + n > BLOCKS:
            self.next_block = 0
        blocks = torch.arange(self.next_block, self.next_block + n)
        self.next_block += n
        return blocks

    def tokens(self, layer, blocks, tokens):
        t = torch.arange(tokens)
        return self.views[f"layers.{layer}"][blocks[t // BLOCK], :, t % BLOCK]


def run(prefill_address, p_conn, d_conn, requests, tokens, mode, timeout):
    prefill, decode = Engine(p_conn, "LBNHC"), Engine(d_conn, "BLHNC")
    print(f"prefill cache: {prefill.region}")
    print(f"decode cache:  {decode.region}")
    g = torch.Generator().manual_seed(0)
    moved = 0
    start = time.monotonic()
    for i in range(requests):
        rid = f"demo-{i}"
        src, dst = prefill.allocate(tokens), decode.allocate(tokens)
        if mode == "push":  # the router knows the prefill node before the prefill ends
            decode.c.start_load(rid, kvd.TransferParams(peer_address=prefill_address,
                                                        request_id=rid), dst, tokens=tokens,
                                mode="push")
        for layer in range(LAYERS):  # the prefill's forward pass
            kv = torch.randn(tokens, HEADS, 2 * HEAD_DIM, generator=g).half()
            t = torch.arange(tokens)
            prefill.views[f"layers.{layer}"][src[t // BLOCK], :, t % BLOCK] = kv
            prefill.c.save_layer(rid, layer, src)
        params = prefill.c.request_finished(rid).to_dict()  # what a router hands over
        if mode == "pull":
            decode.c.start_load(rid, kvd.TransferParams.from_dict(params), dst, tokens=tokens,
                                mode="pull")
        for layer in range(LAYERS):
            decode.c.wait_layer(rid, layer)
            if not torch.equal(decode.tokens(layer, dst, tokens).view(torch.int16),
                               prefill.tokens(layer, src, tokens).view(torch.int16)):
                print(f"FAIL: request {rid} layer {layer} differs")
                return 1
        moved += tokens * LAYERS * HEADS * 2 * HEAD_DIM * 2
    elapsed = time.monotonic() - start
    deadline = time.monotonic() + timeout
    released = set()
    while len(released) < requests and time.monotonic() < deadline:
        released.update(prefill.c.get_finished()[0])
        time.sleep(0.005)
    if len(released) < requests:
        print(f"FAIL: the prefill side released {len(released)} of {requests} requests")
        return 1
    print(f"{requests} requests x {tokens} tokens, {mode}: {moved / 1e6:.1f} MB moved and "
          f"verified in {elapsed:.3f} s; every request released on the prefill side")
    st = d_conn.status()
    print(f"decode kvd: transfers_done {st.get('transfers_done')}, bytes_received "
          f"{st.get('bytes_received')}, transport {st.get('transport')}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--mode", choices=["push", "pull"], default="push")
    ap.add_argument("--embedded", action="store_true", help="embedded kvd cores, no processes")
    ap.add_argument("--timeout", type=float, default=20.0)
    a = ap.parse_args()
    if a.embedded:
        with kvd.Daemon(name="prefill-node", transport="local") as p, \
                kvd.Daemon(name="decode-node", transport="local") as d, \
                kvd.Connector(daemon=p, instance="prefill", timeout=a.timeout) as pc, \
                kvd.Connector(daemon=d, instance="decode", timeout=a.timeout) as dc:
            return run(p.address, pc, dc, a.requests, a.tokens, a.mode, a.timeout)
    with tempfile.TemporaryDirectory(prefix="kvd-demo-") as tmp, \
            KvdProcess("prefill-node", os.path.join(tmp, "p.sock")) as p, \
            KvdProcess("decode-node", os.path.join(tmp, "d.sock")) as d:
        print(f"kvd processes: prefill pid {p.pid} at {p.address}, decode pid {d.pid} at "
              f"{d.address} ({p.transport})")
        with kvd.Connector(socket=p.socket, instance="prefill", timeout=a.timeout) as pc, \
                kvd.Connector(socket=d.socket, instance="decode", timeout=a.timeout) as dc:
            return run(p.address, pc, dc, a.requests, a.tokens, a.mode, a.timeout)


if __name__ == "__main__":
    sys.exit(main())
