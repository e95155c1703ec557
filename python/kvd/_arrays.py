"""Duck-typed access to torch tensors, numpy arrays and anything with __array_interface__ or
__cuda_array_interface__, without importing torch or numpy."""

from __future__ import annotations

import array
from dataclasses import dataclass

from .errors import InvalidArgumentError

_INT64_TYPESTRS = ("<i8", "=i8")


def _typestr_itemsize(typestr: str) -> int:
    try:
        return int(typestr[2:])
    except ValueError:
        raise InvalidArgumentError(f"array type '{typestr}' has no element size") from None


def is_tensor(obj) -> bool:
    return callable(getattr(obj, "data_ptr", None)) and callable(getattr(obj, "stride", None))


@dataclass
class ArrayInfo:
    """What describe_kv_caches needs to know of one array: its address, shape and byte strides,
    element size and type, where it lives, and the address of the allocation it views (when the
    array says: a torch tensor's storage, a numpy array's base) so that views of one buffer can
    be told from views of another."""

    ptr: int
    shape: tuple
    strides: tuple  # bytes
    itemsize: int
    dtype: str
    device: str  # "cpu" or "cuda"
    device_index: int
    storage_offset: int | None  # bytes from the allocation's start, when known
    buffer: int | None  # the allocation's address, when known

    @property
    def ndim(self):
        return len(self.shape)


def _interface_info(obj, iface: dict, device: str) -> ArrayInfo:
    shape = tuple(int(s) for s in iface["shape"])
    itemsize = _typestr_itemsize(iface["typestr"])
    strides = iface.get("strides")
    if strides is None:  # C-contiguous
        strides, step = [], itemsize
        for s in reversed(shape):
            strides.append(step)
            step *= s
        strides = tuple(reversed(strides))
    ptr = int(iface["data"][0])
    buffer = None
    root = obj
    while getattr(root, "base", None) is not None and hasattr(root.base, "__array_interface__"):
        root = root.base
    if root is not obj:
        try:
            buffer = int(root.__array_interface__["data"][0])
        except (AttributeError, KeyError, TypeError):
            buffer = None
    elif hasattr(obj, "base") and obj.base is None:  # a numpy array owning its memory
        buffer = ptr
    return ArrayInfo(ptr, shape, tuple(int(s) for s in strides), itemsize, iface["typestr"],
                     device, 0, None if buffer is None else ptr - buffer, buffer)


def array_info(obj, name: str = "array") -> ArrayInfo:
    """ArrayInfo of a torch tensor (data_ptr/stride), or of an object with
    __cuda_array_interface__ / __array_interface__; InvalidArgumentError for anything else."""
    if is_tensor(obj):
        itemsize = int(obj.element_size())
        dev = getattr(obj, "device", None)
        dtype = getattr(dev, "type", "cpu") if dev is not None else "cpu"
        index = getattr(dev, "index", None) if dev is not None else None
        ptr = int(obj.data_ptr())
        offset = int(obj.storage_offset()) * itemsize if hasattr(obj, "storage_offset") else None
        return ArrayInfo(ptr, tuple(int(s) for s in obj.shape),
                         tuple(int(s) * itemsize for s in obj.stride()), itemsize,
                         str(obj.dtype), dtype, int(index or 0), offset,
                         None if offset is None else ptr - offset)
    cuda = getattr(obj, "__cuda_array_interface__", None)
    if cuda is not None:
        return _interface_info(obj, cuda, "cuda")
    host = getattr(obj, "__array_interface__", None)
    if host is not None:
        return _interface_info(obj, host, "cpu")
    raise InvalidArgumentError(
        f"{name}: a {type(obj).__name__} is no tensor or array (kvd reads torch tensors and "
        "objects with __array_interface__ or __cuda_array_interface__)")


class Int64Ids:
    """Block ids as a C int64 array: `ptr` and `count`, valid while this object lives. Passes
    contiguous int64 CPU tensors and numpy arrays without a copy; converts int32 tensors and
    arrays, lists, tuples and ranges."""

    __slots__ = ("ptr", "count", "_keep")

    def __init__(self, ids, what: str = "block_ids"):
        if is_tensor(ids):
            dev = getattr(ids, "device", None)
            if dev is not None and getattr(dev, "type", "cpu") != "cpu":
                raise InvalidArgumentError(f"{what}: a tensor on {dev}; pass block ids on the CPU")
            if ids.dim() != 1:
                raise InvalidArgumentError(f"{what}: a {ids.dim()}-D tensor; block ids are 1-D")
            dtype = str(ids.dtype)
            if dtype != "torch.int64" or not ids.is_contiguous():
                if dtype not in ("torch.int64", "torch.int32", "torch.int16", "torch.uint8",
                                 "torch.int8"):
                    raise InvalidArgumentError(f"{what}: tensor of {dtype}; pass integers")
                ids = ids.contiguous().long()
            self._keep = ids
            self.ptr = int(ids.data_ptr())
            self.count = int(ids.numel())
            return
        iface = getattr(ids, "__array_interface__", None)
        if iface is not None and not isinstance(ids, (bytes, bytearray, memoryview)):
            shape = iface["shape"]
            if len(shape) != 1:
                raise InvalidArgumentError(f"{what}: a {len(shape)}-D array; block ids are 1-D")
            typestr = iface["typestr"]
            strides = iface.get("strides")
            if typestr in _INT64_TYPESTRS and (strides is None or strides == (8,)):
                self._keep = ids
                self.ptr = int(iface["data"][0])
                self.count = int(shape[0])
                return
            if typestr[1] not in "iu":
                raise InvalidArgumentError(f"{what}: array of {typestr}; pass integers")
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise InvalidArgumentError(
                f"{what}: {type(ids).__name__} is no sequence of block ids")
        try:
            buf = ids if isinstance(ids, array.array) and ids.typecode == "q" else \
                array.array("q", ids)
        except (TypeError, OverflowError) as e:
            raise InvalidArgumentError(f"{what}: {e}") from None
        self._keep = buf
        self.ptr, self.count = buf.buffer_info() if len(buf) else (0, 0)

    def tolist(self):
        if self.count == 0:
            return []
        import ctypes
        return list((ctypes.c_int64 * self.count).from_address(self.ptr))
