"""describe_kv_caches on every layout vLLM builds, checked byte for byte against torch
indexing of the views; its refusals."""

import numpy as np
import pytest
import torch

import kvd
from kvd import testing as kt

ORDERS = kvd.VLLM_ORDERS


def _raw(nbytes, seed=1):
    raw = torch.zeros(nbytes + 64, dtype=torch.uint8)
    kt.fill_random(raw, seed)
    return raw


def _check_views(region, raw, views, n_blocks=5, seed=0):
    """Every layer: for random blocks, every head and token, the bytes at the layout model's
    offsets equal the view's element bytes."""
    g = torch.Generator().manual_seed(seed)
    lay = region.layout
    for l, name in enumerate(region.layer_names):
        view = views[name]
        blocks = torch.randint(0, lay.blocks, (n_blocks,), generator=g)
        off = kt.element_offsets(region, l, blocks, range(lay.heads), range(lay.block_size))
        got = kt.region_bytes_at(raw, raw.data_ptr(), region, off)
        want = view[blocks].contiguous().view(torch.uint8)
        want = want.reshape(got.shape)
        assert torch.equal(got, want), f"{name}: bytes differ"


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("pad", [0, 96])
@pytest.mark.parametrize("packed", [True, False])
def test_vllm_views_every_order(order, pad, packed):
    dims = dict(layers=3, blocks=7, heads=4, block_size=8, head_dim=4)
    raw = _raw(kt.kv_nbytes(order, pad_bytes=pad, packed=packed, **dims) + 256)
    views, config = kt.vllm_kv_caches(raw, order, pad_bytes=pad, offset_bytes=256,
                                      packed=packed, **dims)
    (region,) = kvd.describe_kv_caches(views)
    lay = region.layout
    assert (lay.order, lay.layers, lay.blocks) == (order, 3, 7)
    assert (lay.heads, lay.block_size) == ((4, 8) if packed else (2, 8))
    assert lay.content_bytes == (2 * 4 * 2 if packed else 4 * 4 * 2)
    assert region.base == raw.data_ptr() + 256
    assert region.layer_names == list(views)
    assert lay.stride("L") == config.kv_cache_tensors[0].layer_stride
    assert lay.stride("B") == config.kv_cache_tensors[0].block_stride
    _check_views(region, raw, views)
    (again,) = kvd.describe_kv_caches(views, config)
    assert again.layout == lay and again.base == region.base and again.group == 0


def test_layer_order_follows_addresses_not_dict_order():
    raw = _raw(kt.kv_nbytes(layers=3))
    views, _ = kt.vllm_kv_caches(raw, layers=3)
    shuffled = {k: views[k] for k in reversed(list(views))}
    (region,) = kvd.describe_kv_caches(shuffled)
    assert region.layer_names == list(views)


@pytest.mark.parametrize("kv_first", [True, False])
def test_legacy_five_d(kv_first):
    raw = _raw(2 * 2 * 6 * 16 * 3 * 8 * 2)
    views = kt.legacy_kv_caches(raw, kv_first, layers=2, blocks=6, heads=3, head_dim=8)
    (region,) = kvd.describe_kv_caches(views)
    lay = region.layout
    assert lay.order == ("LSBNHC" if kv_first else "LBSNHC")
    assert (lay.heads, lay.block_size, lay.content_bytes) == (3, 16, 16)
    g = torch.Generator().manual_seed(3)
    for l, name in enumerate(region.layer_names):
        blocks = torch.randint(0, 6, (4,), generator=g)
        for s in (0, 1):
            off = kt.element_offsets(region, l, blocks, range(3), range(16), s)
            got = kt.region_bytes_at(raw, raw.data_ptr(), region, off)
            v = views[name][s][blocks] if kv_first else views[name][blocks, s]
            want = v.permute(0, 2, 1, 3).contiguous().view(torch.uint8)  # (b, N, H) -> (b, H, N)
            assert torch.equal(got, want.reshape(got.shape))


@pytest.mark.parametrize("blocks_first", [False, True])
def test_mla(blocks_first):
    raw = _raw(2 * 9 * 16 * 36 * 2)
    views = kt.mla_kv_caches(raw, layers=2, blocks=9, latent=36, blocks_first=blocks_first)
    (region,) = kvd.describe_kv_caches(views, tp_rank=1, tp_size=2)
    lay = region.layout
    assert lay.order == ("BLNHC" if blocks_first else "LBNHC")
    assert lay.replicated and lay.heads == 1 and lay.total_heads == 1
    assert (lay.tp_rank, lay.tp_size) == (1, 2)
    g = torch.Generator().manual_seed(5)
    for l, name in enumerate(region.layer_names):
        blocks = torch.randint(0, 9, (4,), generator=g)
        got = kt.region_bytes_at(raw, raw.data_ptr(), region,
                                 kt.element_offsets(region, l, blocks, [0], range(16)))
        want = views[name][blocks].contiguous().view(torch.uint8)
        assert torch.equal(got, want.reshape(got.shape))


def test_mamba_state_pages():
    raw = _raw(3 * 5 * 256)
    views = kt.mamba_kv_caches(raw, layers=3, blocks=5, page_bytes=256)
    (region,) = kvd.describe_kv_caches(views)
    lay = region.layout
    assert (lay.heads, lay.block_size, lay.content_bytes) == (1, 1, (24 + 24) * 2)
    assert lay.stride("B") == 256 and lay.stride("L") == 5 * 256 and not lay.replicated
    for l, name in enumerate(region.layer_names):
        conv, ssm = views[name]
        for b in range(5):
            at = region.base - raw.data_ptr() + lay.offset(l, b, 0, 0)
            page = raw[at:at + lay.content_bytes]
            assert torch.equal(page[:48], conv[b].contiguous().view(torch.uint8).reshape(-1))
            assert torch.equal(page[48:], ssm[b].contiguous().view(torch.uint8).reshape(-1))


def test_cross_layer_tensor_with_dims():
    raw = _raw(6 * 3 * 2 * 16 * 16 * 2)
    t = raw.view(torch.float16)[:6 * 3 * 2 * 16 * 16].view(6, 3, 2, 16, 16)  # B, L, H, N, C
    (region,) = kvd.describe_kv_caches({"all": t}, dims="BLHNC")
    assert region.layout.order == "BLHNC" and region.layout.layers == 3
    assert region.layer_names == ["all[0]", "all[1]", "all[2]"]
    views = {f"all[{l}]": t[:, l] for l in range(3)}
    _check_views(region, raw, views)


def test_hybrid_groups_alias_one_buffer():
    """An attention group and a Mamba group over the same bytes (vLLM's hybrid allocator): two
    regions that overlap, one per group."""
    page = 2 * 16 * 16 * 2  # H=2, N=16, C=16 bytes... as float16 elements 8 per head-token
    raw = _raw(2 * 4 * page)
    attn, _ = kt.vllm_kv_caches(raw, "LBNHC", layers=2, blocks=4, heads=2, block_size=16,
                                head_dim=4, prefix="attn")
    mamba = kt.mamba_kv_caches(raw, layers=2, blocks=4, page_bytes=kt.kv_nbytes(
        layers=1, blocks=1, heads=2, block_size=16, head_dim=4))
    caches = {**attn, **mamba}
    regions = kvd.describe_kv_caches(caches)
    assert [r.kind for r in regions] == ["attention", "mamba"]
    assert regions[0].base == regions[1].base
    ns = __import__("types").SimpleNamespace
    config = ns(kv_cache_layout="LBNHC",
                kv_cache_groups=[ns(layer_names=list(attn)), ns(layer_names=list(mamba))],
                kv_cache_tensors=[
                    ns(size=raw.numel(), layers=list(attn), layer_stride=regions[0].layout
                       .stride("L"), block_stride=regions[0].layout.stride("B"), offset=0),
                    ns(size=raw.numel(), layers=list(mamba), layer_stride=regions[1].layout
                       .stride("L"), block_stride=regions[1].layout.stride("B"), offset=0)])
    with_config = kvd.describe_kv_caches(caches, config)
    assert [r.group for r in with_config] == [0, 1]
    assert [r.layout for r in with_config] == [r.layout for r in regions]


def test_numpy_arrays_without_torch_types():
    raw = np.random.default_rng(0).integers(0, 256, 2 * 4 * 2 * 8 * 8, dtype=np.uint8)
    full = raw.view(np.float16).reshape(2, 4, 2, 8, 4)  # L, B, H, N, C
    views = {"a": full[0], "b": full[1]}
    (region,) = kvd.describe_kv_caches(views)
    assert region.layout.order == "LBHNC" and region.base == raw.ctypes.data
    assert region.layout.stride("L") == 4 * 2 * 8 * 8


def test_tp_fields():
    raw = _raw(kt.kv_nbytes(heads=2))
    views, _ = kt.vllm_kv_caches(raw, heads=2)
    (r,) = kvd.describe_kv_caches(views, tp_rank=1, tp_size=4)
    assert (r.layout.tp_rank, r.layout.tp_size, r.layout.total_heads) == (1, 4, 8)
    assert r.layout.global_head(1) == 3


# ---- the transfer, in the layout model's terms -----------------------------------------------

@pytest.mark.parametrize("src_order,dst_order,dst_tp,dst_n", [
    ("LBNHC", "LBNHC", 1, 16), ("LBNHC", "BLHNC", 2, 32), ("BHLNC", "LHBNC", 2, 16),
    ("LBHNC", "BLNHC", 1, 8)])
def test_reference_transfer_matches_torch_indexing(src_order, dst_order, dst_tp, dst_n):
    """The bytes the layout model moves for random block ids: dst[layer][block, head, token]
    equals src[...] for every token, global head and layer, by torch indexing."""
    tokens, heads, hd, layers = 45, 4, 4, 3
    src_raw = _raw(kt.kv_nbytes(src_order, layers, 8, heads, 16, hd), seed=2)
    src_views, _ = kt.vllm_kv_caches(src_raw, src_order, layers, 8, heads, 16, hd)
    (src,) = kvd.describe_kv_caches(src_views)
    g = torch.Generator().manual_seed(9)
    src_blocks = torch.randperm(8, generator=g)[:3]
    dst_blocks_n = (tokens + dst_n - 1) // dst_n
    for rank in range(dst_tp):
        h = heads // dst_tp
        dst_raw = torch.zeros(kt.kv_nbytes(dst_order, layers, 12, h, dst_n, hd), dtype=torch.uint8)
        dst_views, _ = kt.vllm_kv_caches(dst_raw, dst_order, layers, 12, h, dst_n, hd)
        (dst,) = kvd.describe_kv_caches(dst_views, tp_rank=rank, tp_size=dst_tp)
        dst_blocks = torch.randperm(12, generator=g)[:dst_blocks_n]
        kt.reference_transfer(src, src_raw, dst, dst_raw, src_blocks, dst_blocks, tokens)
        for l in range(layers):
            s, d = src_views[f"layers.{l}"], dst_views[f"layers.{l}"]
            for t in range(tokens):
                sv = s[src_blocks[t // 16], rank * h:(rank + 1) * h, t % 16]
                dv = d[dst_blocks[t // dst_n], :, t % dst_n]
                assert torch.equal(sv.view(torch.int16), dv.view(torch.int16)), (l, t)
        untouched = torch.ones(12, dtype=torch.bool)
        untouched[dst_blocks] = False
        for l in range(layers):
            assert not dst_views[f"layers.{l}"][untouched].view(torch.int16).any()


# ---- refusals -----------------------------------------------------------------------------------

def _views(**kw):
    raw = _raw(kt.kv_nbytes(**kw) * 2)
    return kt.vllm_kv_caches(raw, **kw) + (raw,)


def test_refuses_non_uniform_layer_stride():
    raw = _raw(4 * kt.kv_nbytes(layers=1))
    n = kt.kv_nbytes(layers=1)
    a, _ = kt.vllm_kv_caches(raw[:n], layers=1, prefix="a")
    b, _ = kt.vllm_kv_caches(raw[n:2 * n], layers=1, prefix="b")
    c, _ = kt.vllm_kv_caches(raw[3 * n:], layers=1, prefix="c")
    with pytest.raises(kvd.InvalidArgumentError, match="c.0.*bytes after 'b.0'.*layer stride"):
        kvd.describe_kv_caches({**a, **b, **c})


def test_refuses_overlapping_views_of_one_group():
    views, _, _ = _views(layers=2)
    with pytest.raises(kvd.InvalidArgumentError, match="0 bytes after"):
        kvd.describe_kv_caches({"x": views["layers.0"], "y": views["layers.0"]})


def test_refuses_non_contiguous_content():
    views, _, _ = _views()
    bad = {k: v[..., ::2] for k, v in views.items()}
    with pytest.raises(kvd.InvalidArgumentError, match="'layers.0'.*last \\(C\\) dimension has "
                                                       "stride 2"):
        kvd.describe_kv_caches(bad)


def test_refuses_stride_not_a_multiple_of_the_element_size():
    raw = np.zeros(4096, dtype=np.uint8)
    v = np.lib.stride_tricks.as_strided(raw.view(np.float16), (4, 2, 8, 4), (513, 64, 8, 2))
    with pytest.raises(kvd.InvalidArgumentError, match="stride 513 bytes of axis B"):
        kvd.describe_kv_caches({"odd": v})


def test_refuses_overlapping_axes():
    raw = _raw(4096)
    v = raw.view(torch.float16).as_strided((4, 2, 8, 8), (64, 64, 8, 1))  # B and H collide
    with pytest.raises(kvd.InvalidArgumentError, match="axes B and H have the same stride"):
        kvd.describe_kv_caches({"v": v})
    v = raw.view(torch.float16).as_strided((4, 2, 8, 8), (100, 128, 16, 1))  # B < N extent
    with pytest.raises(kvd.InvalidArgumentError, match="'v'.*stride of B \\(200 bytes\\)"):
        kvd.describe_kv_caches({"v": v})


def test_refuses_layout_that_contradicts_strides():
    views, config, _ = _views(order="LBNHC")
    with pytest.raises(kvd.InvalidArgumentError, match="not the layout LBHNC"):
        kvd.describe_kv_caches(views, layout="HND")
    config.kv_cache_layout = "BLNHC"
    with pytest.raises(kvd.InvalidArgumentError, match="not the layout BLNHC"):
        kvd.describe_kv_caches(views, config)


def test_config_cross_checks():
    views, config, _ = _views(layers=3)
    t = config.kv_cache_tensors[0]
    t.offset = 64
    with pytest.raises(kvd.InvalidArgumentError, match="'layers.0' starts 0 bytes into its "
                                                       "buffer.*offset 64"):
        kvd.describe_kv_caches(views, config)
    t.offset = 0
    t.block_stride += 2
    with pytest.raises(kvd.InvalidArgumentError, match="block stride of 1024 bytes.*1026"):
        kvd.describe_kv_caches(views, config)
    t.block_stride -= 2
    t.layers = t.layers[:2]
    with pytest.raises(kvd.InvalidArgumentError, match="'layers.2' is among the caches but in "
                                                       "no kv_cache_tensor"):
        kvd.describe_kv_caches(views, config)
    t.layers = ["layers.0", "nope"]
    with pytest.raises(kvd.InvalidArgumentError, match="'nope'"):
        kvd.describe_kv_caches(views, config)


def test_config_refuses_dtype_change_inside_a_region():
    views, config, raw = _views(layers=2)
    views["layers.1"] = views["layers.1"].view(torch.bfloat16)
    with pytest.raises(kvd.InvalidArgumentError, match="'layers.1' \\(torch.bfloat16.*differs"):
        kvd.describe_kv_caches(views, config)


def test_config_refuses_overlap_inside_a_group():
    views, config, _ = _views(layers=2)
    t = config.kv_cache_tensors[0]
    ns = __import__("types").SimpleNamespace
    config.kv_cache_tensors = [
        ns(size=t.size, layers=["layers.0"], layer_stride=0, block_stride=t.block_stride,
           offset=0),
        ns(size=t.size, layers=["layers.1"], layer_stride=0, block_stride=t.block_stride,
           offset=t.layer_stride)]
    kvd.describe_kv_caches(views, config)  # two regions side by side: fine
    views["layers.1"] = views["layers.0"]
    config.kv_cache_tensors[1].offset = 0
    with pytest.raises(kvd.InvalidArgumentError, match="of KV-cache group 0 overlap"):
        kvd.describe_kv_caches(views, config)


def test_refuses_what_it_cannot_read():
    with pytest.raises(kvd.InvalidArgumentError, match="'x': a str is no tensor"):
        kvd.describe_kv_caches({"x": "tensor"})
    with pytest.raises(kvd.InvalidArgumentError, match="5-D tensor of shape \\(2, 2"):
        kvd.describe_kv_caches({"x": torch.zeros(2, 2, 4, 4, 4)})
    with pytest.raises(kvd.InvalidArgumentError, match="6-D"):
        kvd.describe_kv_caches({"x": torch.zeros(1, 2, 2, 2, 2, 2)})
    with pytest.raises(kvd.InvalidArgumentError, match="dims 'BHN'"):
        kvd.describe_kv_caches({"x": torch.zeros(2, 2, 2, 2)}, dims="BHN")
    with pytest.raises(kvd.InvalidArgumentError, match="no kv caches"):
        kvd.describe_kv_caches({})
    with pytest.raises(kvd.InvalidArgumentError, match="layout 'XYZ'"):
        kvd.describe_kv_caches({"x": torch.zeros(2, 2, 2, 2)}, layout="XYZ")


def test_refuses_views_of_one_buffer_that_differ_without_a_config():
    views, _, _ = _views(layers=2)
    views["layers.1"] = views["layers.1"].view(torch.bfloat16)
    with pytest.raises(kvd.InvalidArgumentError, match="views of one buffer differ from "
                                                       "'layers.0'"):
        kvd.describe_kv_caches(views)


class _FakeCudaArray:
    """Only __cuda_array_interface__ (as CuPy or Numba arrays have): no memory behind it."""

    def __init__(self, ptr, shape, strides, typestr="<f2"):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": shape,
                                         "strides": strides, "typestr": typestr, "version": 3}


def test_cuda_array_interface_objects():
    page = 2 * 16 * 16 * 2
    base = 0x7f0000000000
    views = {f"l{l}": _FakeCudaArray(base + l * 64 * page, (64, 2, 16, 16),
                                     (page, 16 * 16 * 2, 16 * 2, 2)) for l in range(3)}
    (r,) = kvd.describe_kv_caches(views)
    assert (r.memory, r.base, r.layout.order, r.layout.layers) == ("cuda", base, "LBHNC", 3)
    assert r.layout.stride("L") == 64 * page
