"""P/D from Python for the tests: engines with CPU KV caches in kvd's shared memory, built like
vLLM's views, every element of every request checked with torch indexing."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

import torch

import kvd
from kvd import testing as kt


@dataclass
class Shape:
    layers: int = 3
    heads: int = 4  # total KV heads of the model
    head_dim: int = 8
    blocks: int = 24
    block_size: int = 16
    order: str = "LBNHC"
    mla: bool = False
    latent: int = 36
    legacy: bool = False  # (2, B, N, H, D) per layer
    pad_bytes: int = 0  # padded pages: each block's stride grows by this
    with_config: bool = False  # register with the vLLM-style KVCacheConfig


@dataclass
class Engine:
    """One rank: its connector, raw buffer and per-layer views."""
    connector: kvd.Connector
    shape: Shape
    raw: torch.Tensor
    views: dict
    regions: list = field(default_factory=list)

    @property
    def local_heads(self):
        return 1 if self.shape.mla else self.shape.heads // self.connector.tp_size

    def token_view(self, layer, blocks, tokens):
        """(T, H_local, C-elements) of `tokens` stored in `blocks` (torch indexing)."""
        s = self.shape
        v = self.views[list(self.views)[layer]]
        t = torch.arange(tokens)
        b = torch.as_tensor(blocks, dtype=torch.int64)[t // s.block_size]
        n = t % s.block_size
        if s.mla:
            return v[b, n].unsqueeze(1)
        if s.legacy:  # (2, B, N, H, D) -> (T, H, 2D)
            return torch.cat([v[0][b, n], v[1][b, n]], dim=-1)
        return v[b, :, n]


def make_engine(connector: kvd.Connector, shape: Shape, seed=None) -> Engine:
    tp = connector.tp_size
    s = shape
    item = 2
    if s.mla:
        nbytes = s.layers * s.blocks * s.block_size * s.latent * item
    elif s.legacy:
        nbytes = s.layers * 2 * s.blocks * s.block_size * (s.heads // tp) * s.head_dim * item
    else:
        nbytes = kt.kv_nbytes(s.order, s.layers, s.blocks, s.heads // tp, s.block_size,
                              s.head_dim, item, pad_bytes=s.pad_bytes)
    raw = kvd.allocate_host_kv_cache(nbytes)
    assert raw.numel() == nbytes and not raw.any()
    if s.mla:
        views = kt.mla_kv_caches(raw, s.layers, s.blocks, s.block_size, s.latent,
                                 blocks_first=s.order.startswith("B"))
    elif s.legacy:
        views = kt.legacy_kv_caches(raw, True, s.layers, s.blocks, s.heads // tp, s.block_size,
                                    s.head_dim)
    else:
        views, config = kt.vllm_kv_caches(raw, s.order, s.layers, s.blocks, s.heads // tp,
                                          s.block_size, s.head_dim, pad_bytes=s.pad_bytes)
    e = Engine(connector, shape, raw, views)
    e.regions = connector.register_kv_caches(views, config if s.with_config else None)
    if seed is not None:
        kt.fill_random(raw, seed)
    return e


def blocks_for(tokens, block_size, pool, g):
    n = (tokens + block_size - 1) // block_size
    return pool[torch.randperm(len(pool), generator=g)[:n]].tolist()


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def check_request(prefill: list, decode: list, src_blocks, dst_blocks, tokens):
    """Every layer, token and head of every decode rank equals the prefill rank holding it."""
    for d in decode:
        s_tp, d_tp = prefill[0].connector.tp_size, d.connector.tp_size
        for layer in range(d.shape.layers):
            got = d.token_view(layer, dst_blocks, tokens)
            for h in range(got.shape[1]):
                if d.shape.mla:
                    src, sh = prefill[0], 0
                else:
                    g = d.connector.tp_rank * d.local_heads + h if d.shape.heads >= d_tp else \
                        d.connector.tp_rank * d.shape.heads // d_tp
                    src = prefill[g // prefill[0].local_heads] if s_tp > 1 else prefill[0]
                    sh = g % src.local_heads
                want = src.token_view(layer, src_blocks, tokens)[:, sh]
                assert torch.equal(got[:, h].view(torch.int16), want.view(torch.int16)), \
                    f"layer {layer} head {h} of decode rank {d.connector.tp_rank} differs"


def untouched_zero(engine: Engine, used_blocks):
    """The decode cache's blocks no request used are still all zero."""
    mask = torch.ones(engine.shape.blocks, dtype=torch.bool)
    mask[torch.as_tensor(sorted(set(used_blocks)), dtype=torch.int64)] = False
    for v in engine.views.values():
        blocks = v[:, mask] if engine.shape.legacy else v[mask]
        assert not blocks.view(torch.int16).any(), "a block outside the requests was written"


def run_pd(prefill: list, decode: list, address: str, requests=4, tokens=40, mode="push", seed=7,
           early_push=True, timeout=20.0, engine_tokens=False, early_tokens=False):
    """`address`: the prefill kvd's. Prefill ranks save every layer of every request and finish them; decode ranks load them
    (push: announced before the saves when early_push) and wait layer by layer; every element is
    checked, the blocks no request used stay zero, and the sources release every request.
    engine_tokens: every request gets a transfer token chosen up front (as vLLM's scheduler
    does), the decode ranks load with it before the prefill saves (any mode), and the prefill
    ranks finish the requests with it.
    early_tokens: engine_tokens, but the prefill ranks fix each token before their first save
    (set_transfer_token, as behind a router that mints it when the prefill starts) and finish
    the requests without it; in push mode layer 0 must be in place on every decode rank before
    any prefill rank saved layer 1 (streaming with tokens required)."""
    engine_tokens = engine_tokens or early_tokens
    g = torch.Generator().manual_seed(seed)
    ps, ds = prefill[0].shape, decode[0].shape
    src_pool, dst_pool = torch.arange(ps.blocks), torch.arange(ds.blocks)
    ids = [f"req-{seed}-{i}" for i in range(requests)]
    src = {r: blocks_for(tokens, ps.block_size, src_pool, g) for r in ids}
    dst = {r: blocks_for(tokens, ds.block_size, dst_pool[:ds.blocks // requests * requests]
                         .view(requests, -1)[i], g) for i, r in enumerate(ids)}

    def load(params_of):
        for d in decode:
            results = d.connector.start_loads(
                [(r, params_of(r), torch.tensor(dst[r]), tokens, mode) for r in ids])
            assert results == [None] * len(ids), results

    chosen = {r: secrets.token_hex(16) for r in ids} if engine_tokens else {}
    if engine_tokens:
        load(lambda r: kvd.TransferParams(peer_address=address, request_id=r,
                                          transfer_token=chosen[r]))
    elif mode == "push" and early_push:
        load(lambda r: kvd.TransferParams(peer_address=address, request_id=r))
    if early_tokens:
        for p in prefill:
            for r in ids:
                p.connector.set_transfer_token(r, chosen[r])
    for layer in range(ps.layers):
        for p in prefill:
            for r in ids:
                p.connector.save_layer(r, layer, src[r])
        if early_tokens and mode == "push" and layer == 0:
            for d in decode:
                for r in ids:
                    d.connector.wait_layer(r, 0)
    params = {}
    for p in prefill:
        for r in ids:
            got = p.connector.request_finished(
                r, transfer_token=None if early_tokens else chosen.get(r))
            if engine_tokens:
                assert got.transfer_token == chosen[r]
            params.setdefault(r, got)
    if not engine_tokens and not (mode == "push" and early_push):
        load(lambda r: kvd.TransferParams.from_dict(params[r].to_dict()))
    for layer in range(ds.layers):
        for d in decode:
            for r in ids:
                d.connector.wait_layer(r, layer)
    for r in ids:
        check_request(prefill, decode, src[r], dst[r], tokens)
    for d in decode:
        untouched_zero(d, [b for r in ids for b in dst[r]])
    for p in prefill:
        sent = set()
        wait_for(lambda: sent.update(p.connector.get_finished()[0]) or sent >= set(ids),
                 timeout, "the sources to release the requests")
    received = set()
    for d in decode:
        wait_for(lambda: received.update(d.connector.get_finished()[1]) or received >= set(ids),
                 timeout, "the destinations to report the requests")
        assert d.connector.get_failed_blocks() == []
    return params
