"""The bindings themselves: library lookup, Daemon, Connector, host memory, errors, a closed
connector, TransferParams."""

import gc
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import kvd
from kvd import testing as kt
from kvd.host_memory import _live


def test_library_and_version():
    assert os.path.isfile(kvd.library_path())
    major, minor, patch = kvd.version().split(".")
    assert major.isdigit() and minor.isdigit()


def test_import_loads_neither_torch_nor_the_library():
    code = ("import sys; sys.path.insert(0, 'python'); import kvd; "
            "print('torch' in sys.modules, kvd._lib._lib is None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                         check=True, timeout=60)
    assert out.stdout.split() == ["False", "True"]


def test_missing_library_names_where_it_looked(tmp_path):
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import kvd, kvd._lib as l; "
            "l.candidate_paths = lambda: [('KVD_LIBRARY', __import__('pathlib').Path(sys.argv[2]))]\n"
            "try:\n  kvd.version()\nexcept kvd.LibraryNotFoundError as e:\n  print(e.message)")
    pkg = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    out = subprocess.run([sys.executable, "-c", code, pkg, str(tmp_path / "nope.so")],
                         capture_output=True, text=True, timeout=60)
    assert "cannot find libkvconnector.so" in out.stdout and "nope.so (KVD_LIBRARY)" in out.stdout


def test_daemon_and_connector_lifecycle():
    with kvd.Daemon(name="n1", transport="local") as d:
        assert d.address.startswith("127.0.0.1:") and not d.address.endswith(":0")
        with kvd.Connector(daemon=d, instance="e", timeout=5) as c:
            assert not c.closed
            status = c.status()
            assert isinstance(status, dict)
            json.dumps(status)
            assert c.get_finished() == ([], [])
            assert c.get_failed_blocks() == []
        assert c.closed


def test_connector_arguments():
    with pytest.raises(kvd.InvalidArgumentError, match="exactly one of socket"):
        kvd.Connector()
    with kvd.Daemon(transport="local") as d:
        with pytest.raises(kvd.InvalidArgumentError, match="exactly one of socket"):
            kvd.Connector("/tmp/x.sock", daemon=d)
        with pytest.raises(kvd.InvalidArgumentError, match="tp_rank 2 is outside"):
            kvd.Connector(daemon=d, tp_rank=2, tp_size=2)
        with pytest.raises(kvd.InvalidArgumentError, match="timeout"):
            kvd.Connector(daemon=d, timeout=-1)
        with pytest.raises(kvd.InvalidArgumentError):
            kvd.Connector(daemon=d, instance="x" * 300)
    with pytest.raises(kvd.InvalidArgumentError, match="offload_bytes"):
        kvd.Daemon(offload_bytes=-5)


def test_connect_to_no_kvd_fails_fast(tmp_path):
    with pytest.raises(kvd.KvdError) as e:
        kvd.Connector(socket=str(tmp_path / "none.sock"), timeout=2)
    assert "none.sock" in str(e.value)


def test_host_memory_is_freed_with_its_last_view():
    before = len(_live)
    raw = kvd.allocate_host_kv_cache(1 << 20)
    assert isinstance(raw, torch.Tensor) and raw.dtype == torch.uint8 and raw.numel() == 1 << 20
    assert raw.data_ptr() % 4096 == 0 and not raw.any()
    view = raw[4096:].view(torch.float16)
    assert len(_live) == before + 1
    del raw
    gc.collect()
    assert len(_live) == before + 1  # the view keeps it
    view.fill_(1.0)
    del view
    gc.collect()
    assert len(_live) == before
    for bad in (0, -1, 1.5, "1"):
        with pytest.raises(kvd.InvalidArgumentError):
            kvd.allocate_host_kv_cache(bad)


@pytest.fixture
def engine():
    d = kvd.Daemon(transport="local")
    c = kvd.Connector(daemon=d, instance="e", timeout=3)
    raw = kvd.allocate_host_kv_cache(kt.kv_nbytes(layers=2, blocks=8))
    views, _ = kt.vllm_kv_caches(raw, layers=2, blocks=8)
    yield c, views
    c.close()
    d.stop()


def test_register_and_refusals(engine):
    c, views = engine
    plain = {k: v.clone() for k, v in views.items()}
    with pytest.raises(kvd.InvalidArgumentError, match="not inside memory from "
                                                       "kvd.allocate_host_kv_cache"):
        c.register_kv_caches(plain)
    regions = c.register_kv_caches(views)
    assert len(regions) == 1 and regions[0].layout.layers == 2
    assert c.layer_index == {"layers.0": 0, "layers.1": 1}
    with pytest.raises(kvd.InvalidArgumentError, match="once per connector"):
        c.register_kv_caches(views)


def test_save_layers_saves_a_step_in_one_call(engine):
    c, views = engine
    c.register_kv_caches(views)
    results = c.save_layers(0, [("a", [1, 2]), ("b", np.array([3], dtype=np.int64)),
                                ("c", [99])])
    assert results[:2] == [None, None]
    assert isinstance(results[2], kvd.OutOfRangeError) and "block id 99" in str(results[2])
    with pytest.raises(kvd.InvalidArgumentError):
        c.save_layers(0, [])
    with pytest.raises(kvd.OutOfRangeError, match="layer 5"):  # the call's own: 2 layers
        c.save_layers(5, [("a", [1])])


def test_bad_calls_raise(engine):
    c, views = engine
    c.register_kv_caches(views)
    with pytest.raises(kvd.KvdError, match="block"):
        c.save_layer("r", 0, [99])  # past the 8 blocks
    with pytest.raises(kvd.InvalidArgumentError, match="layer 'nope'"):
        c.save_layer("r", "nope", [0])
    with pytest.raises(kvd.InvalidArgumentError, match="layer must be"):
        c.save_layer("r", -1, [0])
    with pytest.raises(kvd.InvalidArgumentError, match="block_ids: float"):
        c.save_layer("r", 0, 1.5)
    with pytest.raises(kvd.InvalidArgumentError, match="2-D"):
        c.save_layer("r", 0, np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(kvd.InvalidArgumentError, match="pass integers"):
        c.save_layer("r", 0, torch.zeros(2))
    with pytest.raises(kvd.KvdError):
        c.save_layer("x" * 300, 0, [0])
    with pytest.raises(kvd.KvdError):
        c.request_finished("never-saved")
    # An engine's own transfer token: 32 to 64 hex digits.
    with pytest.raises(kvd.InvalidArgumentError, match="non-hex"):
        c.request_finished("never-saved", transfer_token="zz" * 16)
    with pytest.raises(kvd.InvalidArgumentError, match="transfer token of 8 bytes"):
        c.request_finished("never-saved", transfer_token="ab" * 8)
    with pytest.raises(kvd.InvalidArgumentError, match="must be a str"):
        c.request_finished("never-saved", transfer_token=b"ab" * 16)
    with pytest.raises(kvd.InvalidArgumentError, match="sets the tokens"):
        c.start_load("r", kvd.TransferParams(peer_address="127.0.0.1:1"), [0])
    with pytest.raises(kvd.InvalidArgumentError, match="mode must be"):
        c.start_load("r", kvd.TransferParams(peer_address="127.0.0.1:1", tokens=4), [0],
                     mode="teleport")
    with pytest.raises(kvd.InvalidArgumentError, match="1 to 1024 loads"):
        c.start_loads([])
    with pytest.raises(kvd.KvdError):
        c.wait_layer("unknown-request", 0)


def test_unreachable_peer_fails_bounded(engine):
    c, views = engine
    c.register_kv_caches(views)
    params = kvd.TransferParams(peer_address="127.0.0.1:9", request_id="r", tokens=16)
    try:
        c.start_load("r", params, [0])
    except kvd.KvdError:
        return  # refused at once: fine
    with pytest.raises(kvd.KvdError):
        c.wait_layer("r", 0)


def test_closed_connector_raises(engine):
    c, views = engine
    c.register_kv_caches(views)
    c.close()
    c.close()  # idempotent
    calls = [lambda: c.save_layer("r", 0, [0]), lambda: c.request_finished("r"),
             lambda: c.start_load("r", kvd.TransferParams(tokens=1), [0]),
             lambda: c.wait_layer("r", 0), c.get_finished, c.get_failed_blocks, c.status,
             lambda: c.offload_lookup([1]), lambda: c.register_kv_caches(views)]
    for call in calls:
        with pytest.raises(kvd.KvdError, match="closed"):
            call()


def test_stopped_daemon_refuses_new_connectors():
    d = kvd.Daemon(transport="local")
    d.stop()
    with pytest.raises(kvd.KvdError, match="stopped"):
        kvd.Connector(daemon=d)


def test_transfer_params_round_trip():
    p = kvd.TransferParams(peer_name="p", peer_address="127.0.0.1:5", request_id="r1",
                           transfer_token="ab" * 32, tokens=17, mode="pull",
                           remote_block_ids=[3, 4])
    d = json.loads(json.dumps(p.to_dict()))
    assert kvd.TransferParams.from_dict(d) == p
    with pytest.raises(kvd.InvalidArgumentError, match="unknown keys"):
        kvd.TransferParams.from_dict({**d, "bogus": 1})
    with pytest.raises(kvd.InvalidArgumentError, match="transfer_token is 66 bytes"):
        kvd.TransferParams.from_dict({**d, "transfer_token": "a" * 66})
    with pytest.raises(kvd.InvalidArgumentError, match="needs a dict"):
        kvd.TransferParams.from_dict("r1")


def test_error_classes():
    e = kvd.errors.error_for(7, "late")
    assert isinstance(e, kvd.TimeoutError) and isinstance(e, TimeoutError) and e.code == 7
    assert isinstance(kvd.errors.error_for(4, "x"), kvd.NotFoundError)
    assert isinstance(kvd.errors.error_for(2, "x"), kvd.OutOfRangeError)
    assert isinstance(kvd.errors.error_for(8, "x"), kvd.UnavailableError)
    assert isinstance(kvd.errors.error_for(1, "x"), kvd.InvalidArgumentError)
    assert type(kvd.errors.error_for(99, "x")) is kvd.KvdError


def test_python_m_kvd_daemon_runs_the_kvd_binary():
    pkg = os.path.join(os.path.dirname(__file__), "..", "..", "python")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(pkg))
    out = subprocess.run([sys.executable, "-m", "kvd.daemon", "--help"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 0 and "usage: kvd --name NAME" in out.stdout + out.stderr


def test_without_torch_host_memory_is_a_numpy_array():
    code = ("import sys; sys.modules['torch'] = None; sys.path.insert(0, 'python'); import kvd\n"
            "a = kvd.allocate_host_kv_cache(8192)\n"
            "print(type(a).__module__, a.dtype, a.size, a.ctypes.data % 4096)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["numpy", "uint8", "8192", "0"]
