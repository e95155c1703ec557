#!/usr/bin/env python3
"""NIXL (nixl-cu13, UCX backend) on kvd's P/D request shape: GPU 0 -> GPU 1, WRITE (push) and
READ (pull), TP 1 or TP 1 -> N (--decode-tp N: the prefill agent pushes into every decode rank's
agent, or each decode rank's agent pulls its heads), every byte verified (common.py says how it
is timed and checked; geometry.py which runs a request moves).

NIXL's documented fast path, as vLLM's NixlConnector and nixlbench use it: one agent per process
with the UCX backend and its progress thread, the whole cache registered once as one VRAM region,
metadata exchanged out of band (here through the driver), and per request a local and a remote
descriptor list prepared once (prep_xfer_dlist) and a transfer handle made once
(make_prepped_xfer), one descriptor per contiguous run (TP 1: one per page; TP 1 -> 2 LBNHC:
131,072 of 2 KiB per request and rank); an iteration posts every handle (transfer) and polls
check_xfer_state.

Environment (set by device.sh): UCX_TLS=cuda_copy,cuda_ipc,sm,tcp,self (NIXL's UCX backend
needs a transport with active messages and peer-failure handling for its wireup, which among
these only tcp has: without it, creating the backend fails with "no active messages
transport"); UCX_MODULE_DIR points at the wheel's UCX modules; UCX_PROTO_INFO=y makes UCX print
the protocol it picked per lane into the worker logs, which the driver greps and prints, so a
data path that fell back to tcp is seen.

usage: nixl_bench.py [--memory cuda|host] [--order LBNHC|BLHNC] [--window N] [--ops WRITE,READ]
                     [--decode-tp N] [--budget-s S]
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class NixlPeer:
    def __init__(self, rank, shape, cache, device, args):
        from nixl_cu13._api import nixl_agent, nixl_agent_config
        self.rank, self.shape, self.cache, self.args = rank, shape, cache, args
        self.mem = "VRAM" if device >= 0 else "DRAM"
        self.dev = max(device, 0)
        self.agent = nixl_agent(f"kvpeer{rank}", nixl_agent_config(backends=["UCX"]))
        self.handles = {}
        self.dlists = []
        self.remote_names = {}

    def init(self):
        self.reg = self.agent.register_memory(
            [(self.cache.addr, self.shape.cache_bytes, self.dev, "")], self.mem)
        return self.agent.get_agent_metadata()

    def connect(self, peer, meta):
        self.remote_names[peer] = self.agent.add_remote_agent(meta)

    def prep(self, op, plan):
        """Per request and remote worker: a local and a remote descriptor list (one descriptor per
        run) and one transfer handle, made once."""
        hs = []
        for peer, loc_addr, rem_addr, lens in plan:
            peer_dev = max(common.worker_device(peer, self.args.memory), 0)
            loc = common.nixl_rows(loc_addr, lens, self.dev)
            rem = common.nixl_rows(rem_addr, lens, peer_dev)
            lh = self.agent.prep_xfer_dlist("NIXL_INIT_AGENT", loc, self.mem)
            rh = self.agent.prep_xfer_dlist(self.remote_names[peer], rem, self.mem)
            self.dlists += [lh, rh]
            idx = np.arange(len(lens), dtype=np.int32)
            hs.append(self.agent.make_prepped_xfer(op, lh, idx, rh, idx))
        self.handles[op] = hs

    def run_wave(self, op):
        hs = self.handles[op]
        pending = []
        for h in hs:
            st = self.agent.transfer(h)
            if st == "ERR":
                raise RuntimeError("transfer posted ERR")
            if st != "DONE":
                pending.append(h)
        deadline = time.monotonic() + 120
        while pending:
            nxt = []
            for h in pending:
                st = self.agent.check_xfer_state(h)
                if st == "ERR":
                    raise RuntimeError("transfer ended in ERR")
                if st != "DONE":
                    nxt.append(h)
            pending = nxt
            if time.monotonic() > deadline:
                raise RuntimeError("transfer did not complete in 120 s")

    def transport(self, op):
        return "NIXL " + self.agent.query_xfer_backend(self.handles[op][0])

    def close(self):
        for hs in self.handles.values():
            for h in hs:
                self.agent.release_xfer_handle(h)
        for d in self.dlists:
            self.agent.release_dlist_handle(d)
        self.agent.deregister_memory(self.reg)


def ucx_proto_tables(path, skip_self=True):
    """The remote-memory tables of UCX_PROTO_INFO=y output: one line per table, its title (who,
    which operation, which memory) and its rows (size range, method, lane)."""
    out, cur, rows, in_rows, seps = [], [], [], False, 0
    try:
        f = open(path, errors="replace")
    except OSError:
        return out
    with f:
        for line in f:
            if "|" not in line and "+--" not in line:
                continue
            body = line.split("]", 2)[-1].strip()
            if body.startswith("+--"):
                if in_rows and not rows and not seps:
                    seps = 1  # the rule under the header row
                    continue
                if in_rows and cur:
                    title = " / ".join(cur)
                    if "remote memory" in title and not (skip_self and " self " in title):
                        out.append(f"{title}: " + "; ".join(rows))
                    cur, rows, in_rows, seps = [], [], False, 0
                continue
            cells = [c.strip() for c in body.strip("|").split("|")]
            if cells[0] == "Range":
                in_rows = True
            elif in_rows:
                rows.append(" ".join(cells))
            elif len(cells) == 1:
                cur.append(cells[0])
    return out


def grep_transport(paths):
    out = []
    for p in paths:
        for t in ucx_proto_tables(p):
            s = f"{os.path.basename(p)}: {t}"
            if s not in out:
                out.append(s)
    return out + common.grep_lines(paths, ("no nvlink", "UCX  ERROR", "UCX  WARN"), limit=6)


if __name__ == "__main__":
    sys.exit(common.main("NIXL", NixlPeer, os.path.abspath(__file__), grep_transport))
