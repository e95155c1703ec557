"""Helpers for tests, examples and benchmarks: KV caches built the way vLLM builds them (one
buffer, an as_strided view per layer), a vLLM-style KVCacheConfig for them, and a pure-Python
reference of kvd's transfer (the layout model's byte offsets, DESIGN.md "The transfer plan").
Needs torch."""

from __future__ import annotations

from types import SimpleNamespace

from .layout import AXES


def _dense(order, sizes, item, pad):
    """Element strides of a dense physical `order` (over logical sizes), B's padded by `pad`
    elements."""
    strides, step = {}, 1
    for a in reversed(order):
        strides[a] = step
        step *= sizes[a]
        if a == "B":
            strides[a] += pad
            step = strides[a] * sizes[a]
    return strides, step


def vllm_kv_caches(raw, order="LBNHC", layers=2, blocks=8, heads=2, block_size=16, head_dim=8,
                   dtype=None, pad_bytes=0, offset_bytes=0, prefix="layers", packed=True):
    """Per-layer [B, H, N, C] views over `raw` (1-D uint8), K and V packed in C (C = 2 x
    head_dim elements), in the physical `order` (one of kvd.VLLM_ORDERS), each block's stride
    padded by pad_bytes, starting offset_bytes into raw: as vLLM's create_kv_cache_views.
    packed=False gives the ROCm head-slot form: H = 2 slots (K, V), C = heads x head_dim.
    Returns (dict name -> view, config) with config a vLLM-style KVCacheConfig."""
    import torch
    dtype = dtype or torch.float16
    item = torch.empty((), dtype=dtype).element_size()
    if not packed:
        heads, c = 2, heads * head_dim
    else:
        c = 2 * head_dim
    sizes = {"L": layers, "B": blocks, "H": heads, "N": block_size, "C": c}
    strides, total = _dense(order, sizes, item, pad_bytes // item)
    assert pad_bytes % item == 0 and offset_bytes % item == 0
    need = offset_bytes + total * item
    assert raw.numel() >= need, f"raw has {raw.numel()} bytes, the caches need {need}"
    typed = raw.view(dtype)
    # One 5-D [L, B, H, N, C] view, each layer its [l]: as vLLM's create_kv_cache_views.
    view_5d = typed.as_strided(
        (layers, blocks, heads, block_size, c),
        (strides["L"], strides["B"], strides["H"], strides["N"], 1),
        typed.storage_offset() + offset_bytes // item)
    views = {f"{prefix}.{l}": view_5d[l] for l in range(layers)}
    tensor = SimpleNamespace(size=raw.numel(), layers=list(views), layer_stride=strides["L"] *
                             item, block_stride=strides["B"] * item, offset=offset_bytes)
    config = SimpleNamespace(kv_cache_tensors=[tensor], kv_cache_layout=order,
                             kv_cache_groups=[SimpleNamespace(layer_names=list(views))])
    return views, config


def kv_nbytes(order="LBNHC", layers=2, blocks=8, heads=2, block_size=16, head_dim=8, item=2,
              pad_bytes=0, packed=True):
    if not packed:
        heads, c = 2, heads * head_dim
    else:
        c = 2 * head_dim
    sizes = {"L": layers, "B": blocks, "H": heads, "N": block_size, "C": c}
    return _dense(order, sizes, item, pad_bytes // item)[1] * item


def legacy_kv_caches(raw, kv_first=True, layers=2, blocks=8, heads=2, block_size=16, head_dim=8,
                     dtype=None, prefix="layers"):
    """Legacy per-layer tensors, (2, B, N, H, D) (kv_first) or (B, 2, N, H, D), dense and back
    to back in raw."""
    import torch
    dtype = dtype or torch.float16
    shape = (2, blocks, block_size, heads, head_dim) if kv_first else \
        (blocks, 2, block_size, heads, head_dim)
    n = 2 * blocks * block_size * heads * head_dim
    typed = raw.view(dtype)
    return {f"{prefix}.{l}": typed[l * n:(l + 1) * n].view(shape) for l in range(layers)}


def mla_kv_caches(raw, layers=2, blocks=8, block_size=16, latent=36, dtype=None,
                  prefix="mla", blocks_first=False):
    """MLA per-layer [B, N, latent] views (H = 1), layer-first or blocks-first."""
    import torch
    dtype = dtype or torch.float16
    page = block_size * latent
    typed = raw.view(dtype)
    at = typed.storage_offset()  # as_strided's offsets count from the storage's start
    if blocks_first:
        return {f"{prefix}.{l}": typed.as_strided((blocks, block_size, latent),
                                                  (layers * page, latent, 1), at + l * page)
                for l in range(layers)}
    return {f"{prefix}.{l}": typed.as_strided((blocks, block_size, latent), (page, latent, 1),
                                              at + l * blocks * page) for l in range(layers)}


def mamba_kv_caches(raw, layers=2, blocks=8, conv=(3, 8), ssm=(4, 6), page_bytes=256,
                    dtype=None, prefix="mamba"):
    """Mamba layers as vLLM hands them: per layer a list [conv_state, ssm_state] of [B, ...]
    views into one page of page_bytes per (layer, block), layer-first."""
    import torch
    dtype = dtype or torch.float16
    item = torch.empty((), dtype=dtype).element_size()
    page = page_bytes // item
    conv_n = conv[0] * conv[1]
    assert (conv_n + ssm[0] * ssm[1]) * item <= page_bytes
    typed = raw.view(dtype)
    out = {}
    for l in range(layers):
        base = typed.storage_offset() + l * blocks * page
        out[f"{prefix}.{l}"] = [
            typed.as_strided((blocks,) + tuple(conv), (page, conv[1], 1), base),
            typed.as_strided((blocks,) + tuple(ssm), (page, ssm[1], 1), base + conv_n)]
    return out


def element_offsets(region, layer, blocks, heads, tokens, s=0):
    """Byte offsets from the region's base of (layer, blocks[i], heads[j], tokens[k], s) as an
    int64 tensor of shape (len(blocks), len(heads), len(tokens)) (the layout model's)."""
    import torch
    lay = region.layout
    b = torch.as_tensor(blocks, dtype=torch.int64).view(-1, 1, 1)
    h = torch.as_tensor(heads, dtype=torch.int64).view(1, -1, 1)
    n = torch.as_tensor(tokens, dtype=torch.int64).view(1, 1, -1)
    return lay.offset(layer, b, h, n, s)


def region_bytes_at(raw, raw_base, region, offsets):
    """The C content bytes at `offsets` (from element_offsets) of `region` in raw (1-D uint8
    whose byte 0 is at address raw_base): shape offsets.shape + (C,)."""
    import torch
    c = region.layout.content_bytes
    idx = (region.base - raw_base) + offsets.unsqueeze(-1) + torch.arange(c, dtype=torch.int64)
    return raw[idx]


def reference_transfer(src_region, src_raw, dst_region, dst_raw, src_blocks, dst_blocks, tokens):
    """What kvd's plan does, in Python: for every layer, token t < tokens at
    (src_blocks[t // Ns], t % Ns) -> (dst_blocks[t // Nd], t % Nd), every global head both ranks
    hold and every content byte (both S values), dst_raw's bytes take src_raw's. raw tensors are
    1-D uint8 whose byte 0 is each region's allocation start (data_ptr)."""
    import torch
    s, d = src_region.layout, dst_region.layout
    t = torch.arange(tokens, dtype=torch.int64)
    sb = torch.as_tensor(src_blocks, dtype=torch.int64)[t // s.block_size]
    db = torch.as_tensor(dst_blocks, dtype=torch.int64)[t // d.block_size]
    sn, dn = t % s.block_size, t % d.block_size
    pairs = [(hs, hd) for hs in range(s.heads) for hd in range(d.heads)
             if s.global_head(hs) == d.global_head(hd)]
    c = s.content_bytes
    cr = torch.arange(c, dtype=torch.int64)
    s0, d0 = src_region.base - src_raw.data_ptr(), dst_region.base - dst_raw.data_ptr()
    for layer in range(s.layers):
        for kv in range(s.size("S")):
            for hs, hd in pairs:
                so = s0 + s.offset(layer, sb, hs, sn, kv)
                do = d0 + d.offset(layer, db, hd, dn, kv)
                dst_raw[(do.unsqueeze(1) + cr).reshape(-1)] = \
                    src_raw[(so.unsqueeze(1) + cr).reshape(-1)]


def fill_random(raw, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    raw.copy_(torch.randint(0, 256, (raw.numel(),), dtype=torch.uint8, generator=g))


__all__ = ["vllm_kv_caches", "kv_nbytes", "legacy_kv_caches", "mla_kv_caches", "mamba_kv_caches",
           "element_offsets", "region_bytes_at", "reference_transfer", "fill_random", "AXES"]
