#!/usr/bin/env python3
"""Mooncake Transfer Engine (mooncake-transfer-engine-cuda13) on kvd's P/D request shape: GPU 0
-> GPU 1, WRITE (push) and READ (pull), TP 1 or TP 1 -> N (--decode-tp N: the prefill engine
writes into every decode rank's engine, or each decode rank's engine reads its heads), every
byte verified (common.py says how it is timed and checked; geometry.py which runs a request
moves).

Mooncake's same-host GPU path is the nvlink_intra transport (legacy cudaIpc handles, one
cudaMemcpyBatchAsync per batch), installed when MC_INTRANODE_NVLINK=true in both processes;
without it the engine falls back to TCP. Each process runs one TransferEngine with P2PHANDSHAKE
metadata on 127.0.0.1 (no etcd), registers its whole cache once, and addresses the peer as the
segment "127.0.0.1:<rpc port>". Mooncake has no prepared requests: an iteration submits one
batch per request and remote engine (one entry per contiguous run) from arrays built once
(batch_transfer_async_{write,read}_arrays: 8-byte address and length arrays, no Python list per
call) and waits for all of them with
get_batch_transfer_status. The transport actually installed is read back from the engine's log
("Using Intra-Node NVLink transport" or "Using TCP transport"), which the driver prints.

On host memory (--memory host, the CPU-only rehearsal) the engine is initialised with tcp.

usage: mooncake_bench.py [--memory cuda|host] [--order LBNHC|BLHNC] [--window N] [--ops ...]
                         [--decode-tp N] [--budget-s S] [--max-batch N] [--max-inflight N]
"""

import collections
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class MooncakePeer:
    def __init__(self, rank, shape, cache, device, args):
        from mooncake.engine import TransferEngine
        self.rank, self.shape, self.cache, self.device, self.args = rank, shape, cache, device, args
        self.te = TransferEngine()
        proto = "nvlink_intra" if device >= 0 else "tcp"
        if self.te.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") != 0:
            raise RuntimeError("TransferEngine.initialize failed")
        self.reqs = {}
        self.targets = {}

    def init(self):
        loc = f"cuda:{self.device}" if self.device >= 0 else "cpu:0"
        if self.te.register_memory(self.cache.addr, self.shape.cache_bytes, loc) != 0:
            raise RuntimeError("register_memory failed")
        return f"127.0.0.1:{self.te.get_rpc_port()}".encode()

    def connect(self, peer, meta):
        self.targets[peer] = meta.decode()

    def prep(self, op, plan):
        """Per request and remote worker: (target, local addresses, remote addresses, lengths),
        one entry per run, as the uint64 arrays the engine takes; with --max-batch N, cut into
        batches of at most N entries."""
        out = []
        for peer, loc, rem, lens in plan:
            n = self.args.max_batch or len(lens)
            out += [(self.targets[peer], loc[i:i + n].astype(np.uint64),
                     rem[i:i + n].astype(np.uint64), lens[i:i + n].astype(np.uint64))
                    for i in range(0, len(lens), n)]
        self.reqs[op] = out

    def run_wave(self, op):
        """Submits every batch and waits for all. With --max-inflight N, first waits for the
        oldest batches whenever a submission would take the entries in flight past N."""
        submit = (self.te.batch_transfer_async_write_arrays if op == "WRITE"
                  else self.te.batch_transfer_async_read_arrays)
        cap = self.args.max_inflight
        inflight, entries = collections.deque(), 0
        for target, loc, rem, lens in self.reqs[op]:
            while cap and inflight and entries + len(lens) > cap:
                b, n = inflight.popleft()
                self.wait([b])
                entries -= n
            b = submit(target, loc, rem, lens)
            if b == 0 or b == -1:
                raise RuntimeError(f"batch submit failed ({b})")
            inflight.append((b, len(lens)))
            entries += len(lens)
        self.wait([b for b, _ in inflight])

    def wait(self, ids):
        if self.te.get_batch_transfer_status(ids) != 0:
            raise RuntimeError("batch failed or timed out")

    def transport(self, op):
        return "Mooncake TransferEngine (see log lines)"

    def close(self):
        self.te.unregister_memory(self.cache.addr)


def grep_transport(paths):
    return common.grep_lines(paths, ("Using ", "nvlink", "NVLink", "Nvlink", "transport",
                                     "Transport"), limit=12)


def extra_flags(p):
    p.add_argument("--max-batch", type=int, default=0,
                   help="entries per batch at most (0: one batch per request and rank)")
    p.add_argument("--max-inflight", type=int, default=0,
                   help="entries in flight at most (0: the whole wave at once)")


if __name__ == "__main__":
    sys.exit(common.main("Mooncake", MooncakePeer, os.path.abspath(__file__), grep_transport,
                         extra_flags))
