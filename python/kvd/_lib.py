"""ctypes declarations of libkvconnector.so's C API (include/kv/kv_connector.h) and the lookup
of the library. Nothing here imports torch or numpy."""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (POINTER, Structure, c_char, c_char_p, c_int, c_int64, c_size_t, c_uint8,
                    c_uint32, c_uint64, c_void_p)
from pathlib import Path

from .errors import LibraryNotFoundError, error_for

LIBRARY_NAME = "libkvconnector.so"
MAX_ID_BYTES = 256
MAX_LOADS_PER_CALL = 1024
MAX_FINISHES_PER_CALL = 1024
MAX_KEY_BYTES = 32
MEMORY_HOST = 0
MEMORY_CUDA = 1
MODE_PUSH = 0
MODE_PULL = 1


class KvErrorStruct(Structure):
    _fields_ = [("code", c_int), ("message", c_char * 512)]


class KvDaemonOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p), ("listen", c_char_p),
                ("transport", c_char_p), ("offload_bytes", c_uint64),
                ("auth_secret_file", c_char_p), ("insecure_peers", c_int)]


class KvConnectorOptions(Structure):
    _fields_ = [("struct_size", c_size_t), ("instance", c_char_p), ("tp_rank", c_int),
                ("tp_size", c_int), ("timeout_ms", c_int), ("offload_namespace", c_char_p),
                ("busy_poll", c_int)]


class KvLayoutStruct(Structure):
    _fields_ = [("order", c_char_p), ("layers", c_int64), ("blocks", c_int64),
                ("heads", c_int64), ("block_size", c_int64), ("content_bytes", c_int64),
                ("strides", c_int64 * 6), ("tp_rank", c_int), ("tp_size", c_int),
                ("total_heads", c_int64), ("replicated", c_int), ("region_bytes", c_int64)]


class KvCacheDescStruct(Structure):
    _fields_ = [("struct_size", c_size_t), ("layout", KvLayoutStruct), ("memory", c_int),
                ("device", c_int), ("base", c_void_p)]


class KvTransferParamsStruct(Structure):
    _fields_ = [("struct_size", c_size_t), ("peer_name", c_char * (MAX_ID_BYTES + 1)),
                ("peer_address", c_char * (MAX_ID_BYTES + 1)),
                ("request_id", c_char * (MAX_ID_BYTES + 1)), ("transfer_token", c_char * 65),
                ("tokens", c_int64), ("mode", c_int)]


class KvSaveStruct(Structure):
    _fields_ = [("request", c_char_p), ("block_ids", c_void_p), ("count", c_size_t)]


class KvLoadStruct(Structure):
    _fields_ = [("request", c_char_p), ("params", POINTER(KvTransferParamsStruct)),
                ("block_ids", c_void_p), ("count", c_size_t)]


class KvFinishStruct(Structure):
    _fields_ = [("request", c_char_p), ("transfer_token", c_char_p)]


class KvBlockKeyStruct(Structure):
    _fields_ = [("bytes", c_uint8 * MAX_KEY_BYTES), ("size", c_uint32)]


class KvOffloadStoreInfoStruct(Structure):
    _fields_ = [("struct_size", c_size_t), ("stored", c_size_t), ("already_present", c_size_t),
                ("evicted", c_size_t), ("bytes", c_uint64), ("runs", c_size_t)]


REQUEST_CALLBACK = ctypes.CFUNCTYPE(None, c_void_p, c_char_p, c_int)

_err_p = POINTER(KvErrorStruct)
# name: (restype, argtypes). Pointers to caller arrays are c_void_p so that an int address (a
# tensor's data_ptr, a numpy array's buffer) passes without conversion.
_SIGNATURES = {
    "kv_strerror": (c_char_p, [c_int]),
    "kv_version": (c_char_p, []),
    "kv_daemon_start": (c_int, [POINTER(KvDaemonOptions), POINTER(c_void_p), _err_p]),
    "kv_daemon_address": (c_char_p, [c_void_p]),
    "kv_daemon_stop": (None, [c_void_p]),
    "kv_connector_open": (c_int, [c_char_p, POINTER(KvConnectorOptions), POINTER(c_void_p),
                                  _err_p]),
    "kv_connector_open_embedded": (c_int, [c_void_p, POINTER(KvConnectorOptions),
                                           POINTER(c_void_p), _err_p]),
    "kv_connector_close": (None, [c_void_p]),
    "kv_register_kv_caches": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p, _err_p]),
    "kv_host_memory_alloc": (c_int, [c_uint64, POINTER(c_void_p), _err_p]),
    "kv_host_memory_free": (c_int, [c_void_p, _err_p]),
    "kv_save_layer": (c_int, [c_void_p, c_char_p, c_int, c_void_p, c_size_t, c_void_p, _err_p]),
    "kv_save_layers": (c_int, [c_void_p, c_int, POINTER(KvSaveStruct), c_size_t, c_void_p,
                               c_void_p, _err_p]),
    "kv_request_finished": (c_int, [c_void_p, c_char_p, POINTER(KvTransferParamsStruct),
                                    c_void_p, c_size_t, POINTER(c_size_t), _err_p]),
    "kv_set_transfer_token": (c_int, [c_void_p, c_char_p, c_char_p, _err_p]),
    "kv_request_finished_with_token": (c_int, [c_void_p, c_char_p, c_char_p,
                                               POINTER(KvTransferParamsStruct), c_void_p,
                                               c_size_t, POINTER(c_size_t), _err_p]),
    "kv_requests_finished": (c_int, [c_void_p, POINTER(KvFinishStruct), c_size_t,
                                     POINTER(KvTransferParamsStruct), c_void_p, _err_p]),
    "kv_start_load": (c_int, [c_void_p, c_char_p, POINTER(KvTransferParamsStruct), c_void_p,
                              c_size_t, _err_p]),
    "kv_start_loads": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p, _err_p]),
    "kv_wait_layer": (c_int, [c_void_p, c_char_p, c_int, _err_p]),
    "kv_get_finished": (c_int, [c_void_p, REQUEST_CALLBACK, c_void_p, _err_p]),
    "kv_get_failed_blocks": (c_int, [c_void_p, c_void_p, c_size_t, POINTER(c_size_t), _err_p]),
    "kv_load_error": (c_int, [c_void_p, c_char_p, _err_p, _err_p]),
    "kv_daemon_status_json": (c_int, [c_void_p, c_void_p, c_size_t, POINTER(c_size_t), _err_p]),
    "kv_offload_store": (c_int, [c_void_p, c_uint32, c_void_p, c_size_t, c_void_p, c_size_t,
                                 c_void_p, POINTER(c_void_p),
                                 POINTER(KvOffloadStoreInfoStruct), c_void_p, c_size_t,
                                 _err_p]),
    "kv_offload_lookup": (c_int, [c_void_p, c_uint32, c_void_p, c_size_t, c_size_t,
                                  POINTER(c_size_t), _err_p]),
    "kv_offload_load": (c_int, [c_void_p, c_uint32, c_void_p, c_size_t, c_void_p, c_size_t,
                                c_int, POINTER(c_void_p), _err_p]),
    "kv_offload_wait": (c_int, [c_void_p, _err_p]),
    "kv_offload_wait_layer": (c_int, [c_void_p, c_int, _err_p]),
    "kv_offload_op_free": (None, [c_void_p]),
}


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def candidate_paths() -> list[tuple[str, Path]]:
    """Where the library is looked for, in order: next to the package (a wheel), KVD_LIBRARY,
    the build tree of the repository this package sits in."""
    out = [("next to the package", _package_dir() / LIBRARY_NAME),
           ("next to the package", _package_dir() / "lib" / LIBRARY_NAME)]
    env = os.environ.get("KVD_LIBRARY")
    if env:
        p = Path(env)
        out.append(("KVD_LIBRARY", p / LIBRARY_NAME if p.is_dir() else p))
    repo = _package_dir().parent.parent  # <repo>/python/kvd
    out.append(("the build tree", repo / "build" / "lib" / LIBRARY_NAME))
    return out


class Library:
    """The loaded library with its functions declared. `call(name, *args)` raises the KvdError
    of a non-zero return; the last argument of such calls is the kv_error it fills."""

    def __init__(self, path: Path):
        self.path = path
        self.dll = ctypes.CDLL(str(path))
        missing = []
        for name, (restype, argtypes) in _SIGNATURES.items():
            try:
                fn = getattr(self.dll, name)
            except AttributeError:
                missing.append(name)
                continue
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)
        if missing:
            raise ImportError(f"{path} lacks {', '.join(missing)}: it is older than this kvd "
                              "package (rebuild it, or point KVD_LIBRARY at a matching one)")
        self.version = self.kv_version().decode()
        self._local = threading.local()

    def err(self) -> KvErrorStruct:
        """A kv_error of this thread, reused across calls (hot paths allocate nothing)."""
        e = getattr(self._local, "err", None)
        if e is None:
            e = self._local.err = KvErrorStruct()
        return e

    def check(self, rc: int, err: KvErrorStruct, what: str = ""):
        if rc != 0:
            raise self.error(rc, err, what)

    def error(self, rc: int, err: KvErrorStruct, what: str = ""):
        msg = err.message.decode("utf-8", "replace") if err.code == rc else ""
        if not msg:
            msg = self.kv_strerror(rc).decode()
        return error_for(rc, f"{what}: {msg}" if what else msg)


_lib: Library | None = None
_lock = threading.Lock()


def load() -> Library:
    """The library, loaded once; ImportError naming every place looked at when absent."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for where, path in candidate_paths():
            if path.is_file():
                try:
                    _lib = Library(path)
                    return _lib
                except OSError as e:
                    tried.append(f"{path} ({where}): {e}")
            else:
                tried.append(f"{path} ({where}): not there")
        raise LibraryNotFoundError(
            f"cannot find {LIBRARY_NAME}. Looked at:\n  " + "\n  ".join(tried) +
            "\nBuild the repository (cmake --build build), install the kvd wheel, or set "
            "KVD_LIBRARY to the library's path.")
