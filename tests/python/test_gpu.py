"""CUDA tensors through kvd from Python: prefill caches on GPU 0, decode caches on GPU 1, two kvd
processes (--transport ipc or nccl), views built as vLLM builds them, save_layer recorded on the
current torch stream with no host synchronisation. Every element is compared with torch indexing
and the decode side's scaled_dot_product_attention over the received cache equals the prefill
side's. Skips without two CUDA devices (CI has none; run it on the GPU machine)."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

import kvd  # noqa: E402
from kvd import testing as kt  # noqa: E402
from kvd.daemon import KvdProcess  # noqa: E402

# kvd shares cudaMalloc'ed memory (and VMM memory with a POSIX fd handle), not PyTorch's
# expandable segments; set before torch's allocator first runs.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")

if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    # Skips the module: ctest then reports the test skipped (run_pytest.py), not passed.
    pytest.skip("needs two CUDA devices", allow_module_level=True)

LAYERS, BLOCKS, HEADS, HEAD_DIM = 4, 64, 8, 64
TOKENS = 200


def _cache(device, order, block_size):
    nbytes = kt.kv_nbytes(order, LAYERS, BLOCKS, HEADS, block_size, HEAD_DIM, 2)
    raw = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    views, _ = kt.vllm_kv_caches(raw, order, LAYERS, BLOCKS, HEADS, block_size, HEAD_DIM,
                                 dtype=torch.bfloat16)
    return raw, views


def _tokens(view, blocks, block_size):
    """(T, H, 2*D) of the request's tokens in `blocks`, by torch indexing of a [B, H, N, C] view."""
    t = torch.arange(TOKENS, device=view.device)
    b = torch.as_tensor(blocks, device=view.device)[t // block_size]
    return view[b, :, t % block_size]


def _attention(kv):
    """Decode attention of a fixed query over one layer's (T, H, 2*D) K/V."""
    k, v = kv[..., :HEAD_DIM], kv[..., HEAD_DIM:]
    q = torch.ones(1, HEADS, 1, HEAD_DIM, dtype=kv.dtype, device=kv.device) / HEAD_DIM
    return torch.nn.functional.scaled_dot_product_attention(
        q, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0))


@pytest.mark.parametrize("transport", ["ipc", "nccl"])
@pytest.mark.parametrize("orders", [("LBNHC", 16, "LBNHC", 16), ("LBNHC", 16, "BLHNC", 32)])
def test_cuda_caches_move_per_layer_and_attend_alike(tmp_path, transport, orders):
    p_order, p_bs, d_order, d_bs = orders
    src_raw, src = _cache("cuda:0", p_order, p_bs)
    dst_raw, dst = _cache("cuda:1", d_order, d_bs)
    g = torch.Generator().manual_seed(5)
    src_blocks = torch.randperm(BLOCKS, generator=g)[:(TOKENS + p_bs - 1) // p_bs].tolist()
    dst_blocks = torch.randperm(BLOCKS, generator=g)[:(TOKENS + d_bs - 1) // d_bs].tolist()
    with KvdProcess("p", tmp_path / "p.sock", transport=transport, args=("--device", "0")) as p, \
            KvdProcess("d", tmp_path / "d.sock", transport=transport,
                       args=("--device", "1")) as d, \
            kvd.Connector(socket=p.socket, instance="prefill") as pc, \
            kvd.Connector(socket=d.socket, instance="decode") as dc:
        pc.register_kv_caches(src)
        dc.register_kv_caches(dst)
        # Push: the decode side asks first; each layer streams once the engine's stream got there.
        dc.start_load("r", kvd.TransferParams(peer_address=p.address, request_id="r"),
                      dst_blocks, tokens=TOKENS, mode="push")
        stream = torch.cuda.Stream(device="cuda:0")
        with torch.cuda.device(0), torch.cuda.stream(stream):
            for layer, view in enumerate(src.values()):
                torch.cuda._sleep(2_000_000)  # a forward pass: the save must wait for it
                kv = torch.randn(TOKENS, HEADS, 2 * HEAD_DIM, dtype=torch.bfloat16,
                                 device="cuda:0", generator=None)
                t = torch.arange(TOKENS, device="cuda:0")
                b = torch.as_tensor(src_blocks, device="cuda:0")[t // p_bs]
                view[b, :, t % p_bs] = kv
                pc.save_layer("r", layer, src_blocks, stream=stream)
        params = pc.request_finished("r")
        assert params.peer_address == p.address
        for layer in range(LAYERS):
            dc.wait_layer("r", layer)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        for (name, s), d_view in zip(src.items(), dst.values()):
            want = _tokens(s, src_blocks, p_bs)
            got = _tokens(d_view, dst_blocks, d_bs)
            assert torch.equal(got.cpu().view(torch.int16), want.cpu().view(torch.int16)), name
            assert torch.equal(_attention(got).cpu(), _attention(want).cpu()), name
        # Blocks no request used are untouched.
        mask = torch.ones(BLOCKS, dtype=torch.bool)
        mask[torch.as_tensor(dst_blocks)] = False
        for view in dst.values():
            assert not view[mask.to(view.device)].view(torch.int16).any()
