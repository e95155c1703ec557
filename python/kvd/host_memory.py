"""allocate_host_kv_cache: shared host memory kvd can map, as a 1-D uint8 torch tensor (a numpy
array without torch), freed when the last reference to it (or to a view of it) goes."""

from __future__ import annotations

import ctypes
import threading

from . import _lib
from .errors import InvalidArgumentError

_lock = threading.Lock()
_live = {}  # base address -> bytes, of every allocation not yet freed


class _HostMemory:
    """Owns one kv_host_memory_alloc allocation; frees it when collected."""

    def __init__(self, nbytes: int):
        lib = _lib.load()
        out = ctypes.c_void_p()
        err = _lib.KvErrorStruct()
        lib.check(lib.kv_host_memory_alloc(nbytes, ctypes.byref(out), ctypes.byref(err)), err,
                  f"allocate_host_kv_cache({nbytes})")
        self.lib = lib
        self.ptr = out.value
        self.nbytes = nbytes
        with _lock:
            _live[self.ptr] = nbytes

    def __del__(self):
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr is None:
            return
        with _lock:
            _live.pop(ptr, None)
        try:
            self.lib.kv_host_memory_free(ptr, None)
        except Exception:  # interpreter shutdown: the process's memory goes with it
            pass


def allocate_host_kv_cache(nbytes: int):
    """`nbytes` of zeroed, page-aligned shared memory kvd can map, as a 1-D uint8 torch tensor
    (numpy array when torch is not installed). Build the per-layer views on it (as_strided) and
    register those; the memory lives as long as any view of it."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise InvalidArgumentError(f"allocate_host_kv_cache: nbytes must be a positive int, "
                                   f"got {nbytes!r}")
    owner = _HostMemory(nbytes)
    buf = (ctypes.c_uint8 * nbytes).from_address(owner.ptr)
    buf._kvd_owner = owner  # the buffer keeps the allocation; tensors keep the buffer
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        return torch.frombuffer(buf, dtype=torch.uint8)
    import numpy
    return numpy.frombuffer(buf, dtype=numpy.uint8)


def host_allocation_of(ptr: int, nbytes: int):
    """(base, size) of the live allocation holding [ptr, ptr + nbytes), or None."""
    with _lock:
        for base, size in _live.items():
            if base <= ptr and ptr + nbytes <= base + size:
                return base, size
    return None
