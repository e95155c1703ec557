"""KvdConnector with CUDA caches: the call-sequence harness's stand-in engines with the prefill's
caches on GPU 0 and the decode's on GPU 1, two kvd processes over --transport ipc and nccl.
Every element is checked with torch indexing and the decode side's attention over the loaded
cache equals the prefill side's. Skips without two CUDA devices (run it on the GPU machine)."""

import os
import tempfile

import pytest
import torch

from kvd.daemon import KvdProcess

from standins import Engine, Group, expected_kv
from test_call_sequence import run_pd

# kvd shares cudaMalloc'ed memory (and VMM memory with a POSIX fd handle), not PyTorch's
# expandable segments; set before torch's allocator first runs.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")

if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs two CUDA devices", allow_module_level=True)


def _attention(kv, head_dim):
    """Decode attention of a fixed query over (T, H, 2D) K/V, read as int16 values: any bytes
    give finite numbers, so equal inputs must give equal outputs."""
    kv = kv.view(torch.int16).float() / 32768
    k, v = kv[..., :head_dim], kv[..., head_dim:]
    q = torch.ones(1, kv.shape[1], 1, head_dim, device=kv.device) / head_dim
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0))
    return out.cpu()


def _loaded(engine, req, layer_name, block_size, tokens):
    """(T, H, 2D) of `req`'s tokens in one layer of `engine`'s rank 0, by torch indexing."""
    view = engine.ranks[0][1][layer_name]
    ids = engine.blocks[req.request_id][0]
    t = torch.arange(tokens)
    b = torch.as_tensor(ids, dtype=torch.int64)[t // block_size]
    return view[b.to(view.device), :, (t % block_size).to(view.device)]


@pytest.mark.parametrize("transport", ["ipc", "nccl"])
def test_cuda_caches_push_between_two_gpus(transport):
    with tempfile.TemporaryDirectory(prefix="kvd-vllm-gpu-") as tmp, \
            KvdProcess("prefill", os.path.join(tmp, "p.sock"), transport=transport,
                       args=["--device", "0"]) as p, \
            KvdProcess("decode", os.path.join(tmp, "d.sock"), transport=transport,
                       args=["--device", "1"]) as d:
        group_p, group_d = Group(), Group(order="BLHNC", block_size=32)
        prefill = Engine("prefill", "kv_producer", {"kvd_socket": p.socket}, [group_p],
                         device="cuda:0")
        try:
            decode = Engine("decode", "kv_consumer", {"kvd_socket": d.socket}, [group_d],
                            device="cuda:1")
        except BaseException:
            prefill.shutdown()
            raise
        try:
            seen = []

            def attend(r):  # on GPU 1, over what kvd loaded, once the request runs
                seen.append((r, [_attention(_loaded(decode, r, name, group_d.block_size, 40),
                                            group_d.head_dim) for name in group_d.names(0)]))
            _, dreqs = run_pd(prefill, decode, requests=3, prompt_len=40, on_loaded=attend)
            assert len(seen) == len(dreqs)
            # The prefill side's attention, on GPU 0 over the K/V its forward wrote.
            for r, outs in seen:
                for l, out in enumerate(outs):
                    kv = expected_kv(r.prompt_token_ids, (0, l), 40, group_p.heads,
                                     group_p.c_elems())
                    want = _attention(kv.to("cuda:0"), group_p.head_dim)
                    assert torch.equal(out, want), f"{transport}: attention of layer {l} differs"
        finally:
            prefill.shutdown()
            decode.shutdown()
