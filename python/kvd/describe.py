"""describe_kv_caches: an engine's KV-cache tensors -> kvd regions (KvLayout + base address).

Reads vLLM's per-layer [B, H, N, C] strided views into one buffer per KV-cache group (any of the
six physical orders, padded pages), the legacy 5-D (2, B, N, H, D) / (B, 2, N, H, D) tensors,
cross-layer tensors (dims naming an L axis), MLA [B, N, latent] (replicated across TP) and
Mamba state pages (a list of state views per layer: opaque bytes, H = N = 1), optionally
guided and cross-checked by a vLLM KVCacheConfig (kv_cache_tensors, kv_cache_layout). Pure:
registers nothing and needs no library."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._arrays import ArrayInfo, array_info
from .errors import InvalidArgumentError
from .layout import AXES, KvLayout, layout_name


@dataclass
class KvCacheRegion:
    """One region kvd registers: `layout` (normalized), its `base` address, where it lives, and
    the layers (caches' names) that make up its L axis, in order."""

    layout: KvLayout
    base: int
    memory: str  # "host" or "cuda"
    device: int
    layer_names: list
    kind: str  # "attention", "legacy", "mla", "mamba", "cross_layer"
    dtype: str
    group: int | None = None  # KV-cache group (with a kv_cache_config)
    tensors: list = field(default_factory=list, repr=False)

    @property
    def nbytes(self) -> int:
        return self.layout.span_bytes

    def __str__(self) -> str:
        names = self.layer_names
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} layers)" if len(names) > 3 else "")
        return (f"{self.kind} region {self.memory}:{self.device} base=0x{self.base:x} "
                f"{self.nbytes} bytes [{shown}]: {self.layout}")


@dataclass
class _Entry:
    name: str
    kind: str
    info: ArrayInfo
    ptr: int
    axes: dict  # axis letter -> (size, byte stride); no C
    content_bytes: int
    dtype: str
    tensors: list
    layers: int = 1  # > 1 for a cross-layer tensor (its L axis is in axes)

    def key(self):
        # Views of one allocation group together; views whose allocation is unknown (objects
        # with only __cuda_array_interface__) group by their structure alone.
        i = self.info
        return (self.kind, i.device, i.device_index, i.buffer, self.dtype, self.content_bytes,
                tuple(sorted(self.axes.items())))


def _fail(name, message):
    return InvalidArgumentError(f"kv cache '{name}': {message}")


def _infer_dims(name, info: ArrayInfo) -> str:
    shape = info.shape
    if info.ndim == 4:
        return "BHNC"
    if info.ndim == 3:
        return "BNC"  # MLA: [B, N, latent]
    if info.ndim == 2:
        return "state"
    if info.ndim == 5:
        if shape[0] == 2 and shape[1] != 2:
            return "SBNHC"
        if shape[1] == 2 and shape[0] != 2:
            return "BSNHC"
        raise _fail(name, f"a 5-D tensor of shape {shape}: say which dimension is K/V with "
                          "dims='SBNHC' or 'BSNHC' (or the cross-layer dims, e.g. 'BLHNC')")
    raise _fail(name, f"a {info.ndim}-D tensor of shape {shape}: kvd reads [B, H, N, C] views, "
                      "(2, B, N, H, D), (B, 2, N, H, D), MLA [B, N, C] and Mamba state lists")


def _state_entry(name, tensors) -> _Entry:
    """A Mamba layer: one or more state views [B, ...] sharing the block stride: one opaque page
    of C bytes per block, from the first state's byte to the last one's."""
    infos = [array_info(t, f"kv cache '{name}'") for t in tensors]
    if not infos:
        raise _fail(name, "an empty list of state tensors")
    first = infos[0]
    lo = hi = None
    for i, info in enumerate(infos):
        if info.ndim < 1 or info.device != first.device or info.device_index != first.device_index:
            raise _fail(name, f"state {i} is not a [B, ...] tensor on {first.device}")
        if (info.shape[0], info.strides[0]) != (first.shape[0], first.strides[0]):
            raise _fail(name, f"state {i} has {info.shape[0]} blocks of stride "
                              f"{info.strides[0]} bytes, state 0 {first.shape[0]} of "
                              f"{first.strides[0]}: the states of a layer share the block stride")
        if any(s < 0 for s in info.strides):
            raise _fail(name, f"state {i} has a negative stride {info.strides}")
        end = info.ptr + info.itemsize + sum((n - 1) * s for n, s in
                                             zip(info.shape[1:], info.strides[1:]))
        lo = info.ptr if lo is None else min(lo, info.ptr)
        hi = end if hi is None else max(hi, end)
    c = hi - lo
    if first.shape[0] > 1 and c > first.strides[0]:
        raise _fail(name, f"its states span {c} bytes per block but blocks are "
                          f"{first.strides[0]} bytes apart: pages would overlap")
    return _Entry(name, "mamba", first, lo, {"B": (first.shape[0], first.strides[0])}, c,
                  "state", list(tensors))


def _entry(name, value, dims) -> _Entry:
    if isinstance(value, (list, tuple)):
        return _state_entry(name, value)
    info = array_info(value, f"kv cache '{name}'")
    dims = dims or _infer_dims(name, info)
    if dims == "state":
        return _state_entry(name, [value])
    if len(dims) != info.ndim or any(d not in AXES for d in dims) or len(set(dims)) != len(dims):
        raise _fail(name, f"dims '{dims}' do not name the {info.ndim} dimensions of shape "
                          f"{info.shape} (letters of {AXES}, each once)")
    if "B" not in dims or dims[-1] != "C":
        raise _fail(name, f"dims '{dims}' need a B axis and C last")
    if "S" in dims and info.shape[dims.index("S")] != 2:
        raise _fail(name, f"its S (K/V) axis has size {info.shape[dims.index('S')]}, not 2")
    for d, s in zip(dims, info.strides):
        if s % info.itemsize:
            raise _fail(name, f"stride {s} bytes of axis {d} is not a multiple of the element "
                              f"size {info.itemsize}")
        if s < 0:
            raise _fail(name, f"axis {d} has a negative stride ({s} bytes)")
    if info.strides[-1] != info.itemsize and info.shape[-1] > 1:
        raise _fail(name, f"its last (C) dimension has stride {info.strides[-1] // info.itemsize} "
                          "elements; kvd needs the content of one head-token contiguous")
    axes = {d: (n, s) for d, n, s in zip(dims[:-1], info.shape[:-1], info.strides[:-1])}
    kind = ("cross_layer" if "L" in dims else "legacy" if "S" in dims else
            "mla" if info.ndim == 3 and dims == "BNC" else "attention")
    return _Entry(name, kind, info, info.ptr, axes, info.shape[-1] * info.itemsize,
                  info.dtype, [value], axes.get("L", (1, 0))[0])


def _order(name, axes: dict, hint: str | None) -> str:
    """The physical order: axes of size > 1 by descending stride, a size-1 L outermost, size-1
    N and H just inside (where they change nothing), C last; the hint's order when the strides
    agree with it."""
    big = sorted((a for a, (n, _) in axes.items() if n > 1), key=lambda a: -axes[a][1])
    for x, y in zip(big, big[1:]):
        if axes[x][1] == axes[y][1]:
            raise _fail(name, f"axes {x} and {y} have the same stride ({axes[x][1]} bytes): "
                              "elements would overlap")
    if hint:
        order = hint if "L" in hint else "L" + hint
        if [a for a in order if a in big] == big and set(axes) | {"C"} == set(order):
            return order
        derived = "".join(big)
        raise _fail(name, f"its strides put the axes in the order {derived} "
                          f"({', '.join(f'{a}={axes[a][1]}' for a in big)} bytes), which is not "
                          f"the layout {hint}")
    ones = [a for a in "LSNH" if a in axes and axes[a][0] == 1]
    head = ["L"] if "L" in ones else []
    return "".join(head + big + [a for a in ones if a != "L"] + ["C"])


def _region(entries: list, layer_stride: int, hint, tp, name=None) -> KvCacheRegion:
    e0 = entries[0]
    what = name or e0.name
    axes = dict(e0.axes)
    if "L" not in axes:
        axes["L"] = (len(entries), layer_stride if len(entries) > 1 else 0)
    for a in "HN":
        axes.setdefault(a, (1, 0))
    order = _order(what, axes, hint)
    strides = [0] * 6
    for a, (n, s) in axes.items():
        strides[AXES.index(a)] = s if n > 1 else 0
    tp_rank, tp_size, total_heads, replicated = tp
    if replicated is None:
        replicated = e0.kind == "mla"
    layout = KvLayout(order=order, layers=axes["L"][0], blocks=axes["B"][0], heads=axes["H"][0],
                      block_size=axes["N"][0], content_bytes=e0.content_bytes,
                      strides=tuple(strides), tp_rank=tp_rank, tp_size=tp_size,
                      total_heads=total_heads or 0, replicated=bool(replicated))
    layout = layout.normalized(f"kv cache '{what}'")
    names = [e.name for e in entries]
    if e0.layers > 1:
        names = [f"{e0.name}[{i}]" for i in range(e0.layers)]
    return KvCacheRegion(layout, e0.ptr, "cuda" if e0.info.device == "cuda" else "host",
                         e0.info.device_index, names, e0.kind, e0.dtype,
                         tensors=[t for e in entries for t in e.tensors])


def _get(obj, *names, default=None):
    for n in names:
        if isinstance(obj, dict) and n in obj:
            return obj[n]
        if hasattr(obj, n):
            return getattr(obj, n)
    return default


def describe_kv_caches(caches, kv_cache_config=None, *, dims=None, layout=None, tp_rank=0,
                       tp_size=1, total_heads=None, replicated=None) -> list:
    """The regions kvd would register for `caches`, without registering anything.

    caches: dict layer name -> tensor (or a list of Mamba state tensors), as vLLM hands
      register_kv_caches; a single tensor or a list of tensors is named by position.
    kv_cache_config: vLLM's KVCacheConfig (or a dict of the same fields): its kv_cache_tensors
      (size, layers, layer_stride, block_stride, offset) give the regions and their layer order,
      kv_cache_layout the physical order, kv_cache_groups the groups; every view is cross-checked
      against them (data_ptr, stride, storage_offset).
    dims: the logical axes of each tensor's dimensions ("BHNC", "SBNHC", "BLHNC" for a
      cross-layer tensor, "state" for an opaque page), one string or a dict name -> string;
      inferred from the number of dimensions when absent.
    layout: the physical order (a vLLM layout name); checked against the strides.
    tp_rank, tp_size, total_heads, replicated: the engine's tensor parallelism (MLA caches are
      replicated unless `replicated` says otherwise).
    Raises InvalidArgumentError naming the tensor and the stride for anything kvd cannot
    describe."""
    if isinstance(caches, dict):
        items = list(caches.items())
    elif isinstance(caches, (list, tuple)):
        items = [(str(i), t) for i, t in enumerate(caches)]
    else:
        items = [("kv_cache", caches)]
    if not items:
        raise InvalidArgumentError("no kv caches to describe")
    tp = (int(tp_rank), int(tp_size), total_heads, replicated)
    per_dims = dims if isinstance(dims, dict) else {}
    entries = {}
    for name, value in items:
        d = per_dims.get(name) if isinstance(dims, dict) else dims
        entries[name] = _entry(str(name), value, d)
    if kv_cache_config is not None:
        from .vllm_config import regions_from_config
        return regions_from_config(entries, kv_cache_config, layout, tp, _region, _get)
    hint = layout_name(layout)
    groups = {}
    for e in entries.values():
        groups.setdefault(e.key() if e.kind != "cross_layer" else ("x", e.name), []).append(e)
    regions, by_buffer = [], {}
    for group in groups.values():
        group.sort(key=lambda e: e.ptr)
        stride = group[1].ptr - group[0].ptr if len(group) > 1 else 0
        for prev, e in zip(group, group[1:]):
            if e.ptr - prev.ptr != stride or stride == 0:
                raise _fail(e.name, f"starts {e.ptr - prev.ptr} bytes after '{prev.name}', but "
                                    f"the layers before are {stride} bytes apart: views of one "
                                    "buffer need one layer stride (for KV-cache groups that "
                                    "alias one buffer, pass kv_cache_config)")
        region = _region(group, stride, hint if group[0].kind in ("attention", "mla") else None,
                         tp)
        other = by_buffer.setdefault(group[0].key()[:4], region)
        if other is not region and group[0].info.buffer is not None:
            raise _fail(group[0].name, f"views of one buffer differ from '{other.layer_names[0]}'"
                                       f" ({region.layout} vs {other.layout}): kvd makes one "
                                       "region of a buffer's layers (for several KV-cache "
                                       "groups in one buffer, pass kv_cache_config)")
        regions.append(region)
    # In the caches' order (the model's), so that two engines of one model register their
    # regions in the same order, whatever addresses their allocator chose.
    position = {name: i for i, (name, _) in enumerate(items)}
    regions.sort(key=lambda r: min(position[e] for e in _entry_names(r)))
    return regions


def _entry_names(region):
    return [n.rsplit("[", 1)[0] if region.kind == "cross_layer" else n
            for n in region.layer_names]
