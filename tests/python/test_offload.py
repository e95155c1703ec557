"""CPU offload from Python: store, lookup, load round trip (per layer too), across an engine
restart, and the refusals."""

import numpy as np
import pytest
import torch

import kvd
from kvd import testing as kt


def _engine(d, seed=None):
    c = kvd.Connector(daemon=d, instance="e", timeout=5)
    raw = kvd.allocate_host_kv_cache(kt.kv_nbytes(layers=3, blocks=16))
    views, _ = kt.vllm_kv_caches(raw, layers=3, blocks=16)
    c.register_kv_caches(views)
    if seed is not None:
        kt.fill_random(raw, seed)
    return c, views


def test_round_trip_and_restart():
    with kvd.Daemon(transport="local", offload_bytes=8 << 20) as d:
        c, src = _engine(d, seed=1)
        keys = [0x1234, 0x5678, -3]  # vLLM's 64-bit hashes, signed or not
        with c.offload_store(keys, [4, 9, 2]) as op:
            op.wait()
            assert op.info["stored"] == 3 and op.info["bytes"] > 0
        assert c.offload_lookup(keys) == 3
        assert c.offload_lookup([0x1234, 0x9999, 0x5678]) == 1
        expected = {k: {n: v[b].clone() for n, v in src.items()}
                    for k, b in zip(keys, [4, 9, 2])}
        c.close()
        # The engine restarts: a new connector with a fresh (zeroed) cache finds its pages.
        c, dst = _engine(d)
        with c:
            assert c.offload_lookup(np.array(keys, dtype=np.int64)) == 3
            with c.offload_load(keys, torch.tensor([0, 1, 15]), per_layer=True) as op:
                for layer in range(3):
                    op.wait_layer(layer)
                op.wait()
            for k, b in zip(keys, [0, 1, 15]):
                for n, v in dst.items():
                    assert torch.equal(v[b].view(torch.int16), expected[k][n].view(torch.int16))
            assert not dst["layers.0"][2:15].view(torch.int16).any()


def test_bytes_keys_and_refusals():
    with kvd.Daemon(transport="local", offload_bytes=4 << 20) as d:
        c, _ = _engine(d, seed=2)
        with c:
            keys = [bytes([i]) * 16 for i in range(4)]
            op = c.offload_store(keys, [0, 1, 2, 3])
            op.wait()
            op.free()
            with pytest.raises(kvd.KvdError, match="freed"):
                op.wait()
            assert c.offload_lookup(keys) == 4
            with pytest.raises(kvd.NotFoundError):
                c.offload_load([b"\xff" * 16], [5])
            with pytest.raises(kvd.InvalidArgumentError, match="8 to 32 bytes"):
                c.offload_lookup([b"short"])
            with pytest.raises(kvd.InvalidArgumentError, match="one length"):
                c.offload_lookup([b"a" * 8, b"b" * 9])
            with pytest.raises(kvd.InvalidArgumentError, match="2 keys for 1 block ids"):
                c.offload_store([1, 2], [0])
            with pytest.raises(kvd.KvdError):
                c.offload_store([1], [99])  # no such block
            with pytest.raises(kvd.KvdError):
                c.offload_lookup([1], region=5)
            pending = c.offload_store([77], [6])
        with pytest.raises(kvd.KvdError, match="freed"):  # close() freed it
            pending.wait()


def test_without_a_pool():
    with kvd.Daemon(transport="local") as d:
        c, _ = _engine(d)
        with c, pytest.raises(kvd.KvdError):
            c.offload_lookup([1])


ENGINE = r"""
import sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
import torch, kvd
from kvd import testing as kt
role, socket = sys.argv[3], sys.argv[4]
with kvd.Connector(socket=socket, instance="engine", timeout=10) as c:
    raw = kvd.allocate_host_kv_cache(kt.kv_nbytes(layers=3, blocks=16))
    views, _ = kt.vllm_kv_caches(raw, layers=3, blocks=16)
    c.register_kv_caches(views)
    expected = torch.zeros_like(raw)
    kt.fill_random(expected, 42)
    keys = [1001, 1002, 1003]
    if role == "store":
        raw.copy_(expected)
        with c.offload_store(keys, [3, 4, 5]) as op:
            op.wait()
    else:
        assert c.offload_lookup(keys) == 3, c.offload_lookup(keys)
        with c.offload_load(keys, [3, 4, 5]) as op:
            op.wait()
        ref, _ = kt.vllm_kv_caches(expected, layers=3, blocks=16)
        for name in views:
            assert torch.equal(views[name][3:6].view(torch.int16),
                               ref[name][3:6].view(torch.int16)), name
            assert not views[name][:3].view(torch.int16).any()
print(role, "ok")
"""


def test_engine_process_restart_finds_its_pages(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    from kvd.daemon import KvdProcess
    here = Path(__file__).resolve().parent
    pkg = Path(kvd.__file__).resolve().parent.parent
    with KvdProcess("offload-node", str(tmp_path / "k.sock"), offload_bytes=8 << 20,
                    transport="local") as k:
        for role in ("store", "load"):
            out = subprocess.run([sys.executable, "-c", ENGINE, str(pkg), str(here), role,
                                  k.socket], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            assert f"{role} ok" in out.stdout
