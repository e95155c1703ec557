"""CPU offload through kvd's host pool (kvd --offload-bytes / Daemon(offload_bytes=...)): block
keys, OffloadOp, and the Connector methods offload_store / offload_lookup / offload_load."""

from __future__ import annotations

import ctypes
from ctypes import byref, c_size_t, c_void_p, sizeof

from . import _lib
from ._arrays import Int64Ids, is_tensor
from .errors import InvalidArgumentError


class _Keys:
    """`count` keys of `key_bytes` bytes each, back to back, at `ptr`. From a list of bytes
    (8 to 32 bytes, one length), a list of ints (vLLM's 64-bit block hashes: 8 bytes each,
    little-endian, as two's complement when negative), a 1-D int64/uint64 numpy array or CPU
    tensor (8 bytes each, no copy) or a 2-D uint8 array (one key per row)."""

    __slots__ = ("ptr", "count", "key_bytes", "_keep")

    def __init__(self, keys, count_hint=None):
        iface = None if is_tensor(keys) else getattr(keys, "__array_interface__", None)
        if is_tensor(keys):
            if str(keys.device) != "cpu" or keys.dim() not in (1, 2):
                raise InvalidArgumentError("keys: a CPU tensor of int64 hashes or uint8 rows")
            keys = keys.contiguous()
            self._keep, self.ptr = keys, int(keys.data_ptr())
            if keys.dim() == 1:
                if keys.element_size() != 8:
                    raise InvalidArgumentError(f"keys: a tensor of {keys.dtype}; 64-bit hashes")
                self.count, self.key_bytes = int(keys.shape[0]), 8
            else:
                if keys.element_size() != 1:
                    raise InvalidArgumentError("keys: a 2-D key tensor holds uint8 rows")
                self.count, self.key_bytes = int(keys.shape[0]), int(keys.shape[1])
        elif iface is not None:
            shape, typestr = iface["shape"], iface["typestr"]
            if iface.get("strides") is not None:
                raise InvalidArgumentError("keys: pass a C-contiguous array")
            if len(shape) == 1 and typestr[1:] in ("i8", "u8"):
                self.count, self.key_bytes = int(shape[0]), 8
            elif len(shape) == 2 and typestr[1:] == "u1":
                self.count, self.key_bytes = int(shape[0]), int(shape[1])
            else:
                raise InvalidArgumentError(f"keys: an array of {typestr} shape {shape}; pass "
                                           "64-bit hashes (1-D) or uint8 rows (2-D)")
            self._keep, self.ptr = keys, int(iface["data"][0])
        else:
            keys = list(keys)
            if not keys:
                raise InvalidArgumentError("keys: none given")
            if all(isinstance(k, int) and not isinstance(k, bool) for k in keys):
                try:
                    data = b"".join(k.to_bytes(8, "little", signed=k < 0) for k in keys)
                except OverflowError:
                    raise InvalidArgumentError("keys: an int key does not fit 64 bits") from None
                self.key_bytes = 8
            elif all(isinstance(k, (bytes, bytearray, memoryview)) for k in keys):
                sizes = {len(k) for k in keys}
                if len(sizes) != 1:
                    raise InvalidArgumentError(f"keys: of lengths {sorted(sizes)}; one length")
                self.key_bytes = sizes.pop()
                data = b"".join(bytes(k) for k in keys)
            else:
                raise InvalidArgumentError("keys: ints (64-bit hashes) or bytes, not a mix")
            self.count = len(keys)
            buf = ctypes.create_string_buffer(data, len(data))
            self._keep, self.ptr = buf, ctypes.addressof(buf)
        if not 8 <= self.key_bytes <= _lib.MAX_KEY_BYTES:
            raise InvalidArgumentError(f"keys: {self.key_bytes} bytes each; kvd keys are 8 to "
                                       f"{_lib.MAX_KEY_BYTES} bytes")
        if self.count == 0:
            raise InvalidArgumentError("keys: none given")


class OffloadOp:
    """An asynchronous store or load. wait() / wait_layer(layer) until the bytes landed (the
    copy's error or TimeoutError otherwise). Free it (free(), a with block, or let it be
    collected) before its connector closes; close() frees those left."""

    def __init__(self, connector, handle: int, kind: str, info: dict = None):
        self._connector, self._h, self.kind = connector, handle, kind
        self.info = info or {}
        connector._ops.add(self)

    def _handle(self):
        if self._h is None:
            from .connector import ClosedError
            raise ClosedError(f"the offload {self.kind} op is freed (or its connector closed)")
        return self._h

    def wait(self):
        lib = self._connector._lib
        err = _lib.KvErrorStruct()
        lib.check(lib.kv_offload_wait(self._handle(), byref(err)), err, f"offload {self.kind}")

    def wait_layer(self, layer: int):
        lib = self._connector._lib
        layer = self._connector._layer(layer)
        err = _lib.KvErrorStruct()
        lib.check(lib.kv_offload_wait_layer(self._handle(), layer, byref(err)), err,
                  f"offload {self.kind} layer {layer}")

    def free(self):
        h, self._h = self._h, None
        if h is not None:
            self._connector._lib.kv_offload_op_free(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __del__(self):
        if getattr(self, "_h", None) is not None and not self._connector.closed:
            self.free()


def _region_index(region) -> int:
    if isinstance(region, bool) or not isinstance(region, int) or not 0 <= region < 2 ** 32:
        raise InvalidArgumentError(f"region must be a registered region's index, got {region!r}")
    return region


class OffloadMixin:
    """Connector's offload methods; `region` is the index of a registered region."""

    EVICTED_CAPACITY = 4096

    def _offload_args(self, keys, block_ids):
        k = _Keys(keys)
        ids = Int64Ids(block_ids)
        if ids.count != k.count:
            raise InvalidArgumentError(f"offload: {k.count} keys for {ids.count} block ids")
        return k, ids

    def offload_store(self, keys, block_ids, region: int = 0, stream=None) -> OffloadOp:
        """Copies the blocks of keys the pool lacks into kvd's pool; keys[i] names block_ids[i].
        op.info: stored, already_present, evicted (count), evicted_keys (bytes), bytes, runs.
        The blocks must not change until op.wait() returned."""
        from .connector import _stream_handle
        h = self._handle()
        k, ids = self._offload_args(keys, block_ids)
        info = _lib.KvOffloadStoreInfoStruct()
        info.struct_size = sizeof(info)
        evicted = (_lib.KvBlockKeyStruct * self.EVICTED_CAPACITY)()
        op, err = c_void_p(), _lib.KvErrorStruct()
        self._lib.check(self._lib.kv_offload_store(
            h, _region_index(region), k.ptr, k.key_bytes, ids.ptr, ids.count,
            _stream_handle(stream), byref(op), byref(info), evicted, self.EVICTED_CAPACITY,
            byref(err)), err, "offload_store")
        n = min(info.evicted, self.EVICTED_CAPACITY)
        return OffloadOp(self, op.value, "store", {
            "stored": info.stored, "already_present": info.already_present,
            "evicted": info.evicted,
            "evicted_keys": [bytes(e.bytes[:e.size]) for e in evicted[:n]],
            "bytes": info.bytes, "runs": info.runs})

    def offload_lookup(self, keys, region: int = 0) -> int:
        """How many leading keys the pool holds ready."""
        h = self._handle()
        k = _Keys(keys)
        hits, err = c_size_t(), _lib.KvErrorStruct()
        self._lib.check(self._lib.kv_offload_lookup(h, _region_index(region), k.ptr, k.key_bytes,
                                                    k.count, byref(hits), byref(err)), err,
                        "offload_lookup")
        return hits.value

    def offload_load(self, keys, block_ids, per_layer: bool = False, region: int = 0) -> OffloadOp:
        """Copies the pool's blocks of `keys` into block_ids; every key must be ready
        (NotFoundError naming the missing ones otherwise, nothing written). per_layer: wait with
        op.wait_layer(layer) layer by layer."""
        h = self._handle()
        k, ids = self._offload_args(keys, block_ids)
        op, err = c_void_p(), _lib.KvErrorStruct()
        self._lib.check(self._lib.kv_offload_load(h, _region_index(region), k.ptr, k.key_bytes,
                                                  ids.ptr, ids.count, int(bool(per_layer)),
                                                  byref(op), byref(err)), err, "offload_load")
        return OffloadOp(self, op.value, "load")
