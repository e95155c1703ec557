"""Where a request's bytes lie in kvd's layouts, for the peer harnesses: the runs (contiguous
byte ranges, the descriptors a NIXL or Mooncake user would write) that move one request from the
prefill cache (TP 1, every KV head) into one decode rank's cache (TP N, its H/N heads), and which
source word each destination word must hold (for verification).

Layouts are kvd's dense orders over L (layer), B (block), N (token in a block), H (KV head) and C
(the K|V bytes of one head-token), as layout/kv_region.h lays them out and kvbench pd allocates
them: byte stride of each axis = the product of the sizes of the axes inside it. Decode rank r of
TP N holds the global heads [r·H/N, (r+1)·H/N) in the same order with H/N heads (vLLM's split,
KvRegion::global_head). A request uses the same block ids on every decode rank (one block table,
as vLLM's TP ranks share it).

A page is what one block id addresses in one piece: LBNHC one (layer, block), N x H x C; BLHNC one
block of every layer, L x H x N x C. Runs are found once per page (the template: the rank's
elements of a page, in the source's memory order, merged where contiguous on both sides) and
replicated per page of the request in descriptor order (LBNHC: layer-major, then the request's
blocks; BLHNC: the request's blocks); adjacent runs of consecutive pages are merged where
contiguous on both sides as well.

Llama-3-8B, 4096 tokens, block 16 (the default shape), runs per request and decode rank:
  TP 1      LBNHC: 8192 runs of 64 KiB (a whole page)    BLHNC: 256 runs of 2 MiB
  TP 1 -> 2 LBNHC: 131,072 runs of 2 KiB per rank (the rank's 4 heads of one token: its half of
            each token row is contiguous on both sides, the next token's is 2 KiB further on the
            decode side but 4 KiB further on the prefill side), 262,144 per request;
            BLHNC: 8192 runs of 32 KiB per rank (the rank's 4 heads x 16 tokens of one layer;
            the next layer is 32 KiB on in the decode page but 64 KiB on in the prefill page),
            16,384 per request.
With random block ids no run merges across pages (kvbench's shapes; checked by the counts above).
"""

import numpy as np

AXES = "LBNHC"


def strides(order, sizes):
    """Byte stride of each axis of a dense `order` (C innermost, stride 1)."""
    out, acc = {}, 1
    for ax in reversed(order):
        out[ax] = acc
        acc *= sizes[ax]
    return out


def page_axes(order):
    """The axes (without C) inside one page: after B when L is outside it (LBNHC), every axis but
    B when B is outermost (BLHNC)."""
    if order[0] == "B":
        return order[1:-1]
    return order[order.index("B") + 1:-1]


class Layout:
    def __init__(self, order, layers, nblocks, block, heads, content):
        if sorted(order) != sorted(AXES) or order[-1] != "C":
            raise ValueError(f"order {order}: a permutation of {AXES} ending in C")
        self.order, self.heads, self.content = order, heads, content
        self.sizes = {"L": layers, "B": nblocks, "N": block, "H": heads, "C": content}
        self.stride = strides(order, self.sizes)
        self.page = int(np.prod([self.sizes[a] for a in page_axes(order)])) * content


def page_template(src, dst, rank):
    """Runs of one page for decode rank `rank` (dst.heads heads each): int64 arrays (src_off,
    dst_off, length), offsets relative to the page's start on each side."""
    if src.heads % dst.heads:
        raise ValueError(f"{src.heads} heads do not split into ranks of {dst.heads}")
    axes = page_axes(src.order)
    if page_axes(dst.order) != axes:
        raise ValueError("both sides must use the same order")
    sizes = [dst.sizes[a] for a in axes]
    grid = np.meshgrid(*[np.arange(s, dtype=np.int64) for s in sizes], indexing="ij")
    so = np.zeros(grid[0].size, dtype=np.int64)
    do = np.zeros_like(so)
    for ax, idx in zip(axes, grid):
        idx = idx.reshape(-1)
        so += (idx + rank * dst.heads if ax == "H" else idx) * src.stride[ax]
        do += idx * dst.stride[ax]
    return merge(so, do, np.full(so.size, src.content, dtype=np.int64))


def merge(so, do, ln):
    """Joins each run with the next where both sides continue it. Same order, fewer runs."""
    if len(so) < 2:
        return so, do, ln
    cont = (so[1:] == so[:-1] + ln[:-1]) & (do[1:] == do[:-1] + ln[:-1])
    starts = np.concatenate(([0], np.nonzero(~cont)[0] + 1))
    return so[starts], do[starts], np.add.reduceat(ln, starts)


def request_runs(src, dst, rank, src_pids, dst_pids, template=None):
    """The runs of one request for decode rank `rank`: pages src_pids[i] -> dst_pids[i] (page
    ids in descriptor order, as Shape.request_pages gives them). Byte offsets from each cache's
    base: int64 arrays (src_off, dst_off, length)."""
    ts, td, tl = template if template is not None else page_template(src, dst, rank)
    so = (np.asarray(src_pids, dtype=np.int64)[:, None] * src.page + ts[None, :]).reshape(-1)
    do = (np.asarray(dst_pids, dtype=np.int64)[:, None] * dst.page + td[None, :]).reshape(-1)
    return merge(so, do, np.tile(tl, len(src_pids)))


def word_map(src, dst, rank):
    """int64 array, one entry per 4-byte word of a destination page: the index of the word of the
    source page that it must equal."""
    ts, td, tl = page_template(src, dst, rank)
    out = np.full(dst.page // 4, -1, dtype=np.int64)
    for s, d, n in zip(ts, td, tl):
        out[d // 4:(d + n) // 4] = np.arange(s // 4, (s + n) // 4)
    if (out < 0).any():
        raise ValueError("the rank's runs do not cover its page")
    return out


def _selftest():
    """Checks request_runs and word_map against element-by-element offsets written out from the
    layout definition (tiny shapes, both orders, TP 1, 2 and 4, scattered blocks)."""
    rng = np.random.default_rng(1)
    for order in ("LBNHC", "BLHNC"):
        for tp in (1, 2, 4):
            L, NB, N, H, C = 3, 7, 4, 4, 8
            src, dst = Layout(order, L, NB, N, H, C), Layout(order, L, NB, N, H // tp, C)

            def off(lay, l, b, h, n):
                idx = {"L": l, "B": b, "H": h, "N": n, "C": 0}
                return sum(idx[a] * lay.stride[a] for a in order)

            sb, db = rng.permutation(NB)[:5], rng.permutation(NB)[:5]
            if order == "LBNHC":
                sp = (np.arange(L)[:, None] * NB + sb[None, :]).reshape(-1)
                dp = (np.arange(L)[:, None] * NB + db[None, :]).reshape(-1)
            else:
                sp, dp = sb, db
            for r in range(tp):
                so, do, ln = request_runs(src, dst, r, sp, dp)
                moved = {}
                for s, d, n in zip(so, do, ln):
                    for k in range(0, n, C):
                        moved[d + k] = s + k
                want = {off(dst, l, db[i], h, n): off(src, l, sb[i], r * (H // tp) + h, n)
                        for l in range(L) for i in range(5) for h in range(H // tp)
                        for n in range(N)}
                assert moved == want, (order, tp, r)
                words = word_map(src, dst, r)
                for d, s in want.items():  # the word's place in its page, on each side
                    pd, ps = d // dst.page, s // src.page
                    assert words[(d - pd * dst.page) // 4] == (s - ps * src.page) // 4
    print("geometry self-test: OK")


if __name__ == "__main__":
    _selftest()
