"""Regions from a vLLM KVCacheConfig: one region per kv_cache_tensor (size, layers, layer_stride,
block_stride, offset), in the config's layer order and layout, every view cross-checked against
it. Groups (kv_cache_groups[i].layer_names) may alias one another's bytes; the regions of one
group may not overlap."""

from __future__ import annotations

from .errors import InvalidArgumentError
from .layout import layout_name


def _fail(message):
    return InvalidArgumentError(f"kv_cache_config: {message}")


def regions_from_config(entries: dict, config, layout, tp, make_region, get) -> list:
    tensors = get(config, "kv_cache_tensors")
    if not tensors:
        raise _fail("it has no kv_cache_tensors")
    hint = layout_name(layout if layout is not None else get(config, "kv_cache_layout"))
    group_of = {}
    for g, group in enumerate(get(config, "kv_cache_groups", default=None) or []):
        for name in get(group, "layer_names", default=[]) or []:
            group_of[name] = g
    regions, covered = [], set()
    for t, kt in enumerate(tensors):
        layers = list(get(kt, "layers", "shared_by", default=[]) or [])
        what = f"kv_cache_tensors[{t}]"
        if not layers:
            raise _fail(f"{what} names no layers")
        size = int(get(kt, "size", default=0))
        offset = int(get(kt, "offset", default=0) or 0)
        layer_stride = int(get(kt, "layer_stride", default=0) or 0)
        block_stride = get(kt, "block_stride", default=None)
        group = [entries.get(name) for name in layers]
        for name, e in zip(layers, group):
            if e is None:
                raise _fail(f"{what} names layer '{name}', which is not among the caches")
            if e.kind == "cross_layer":
                raise _fail(f"layer '{name}' is a cross-layer tensor: describe it without "
                            "kv_cache_config")
        e0 = group[0]
        for name, e in zip(layers, group):
            if (e.dtype, e.content_bytes, e.axes) != (e0.dtype, e0.content_bytes, e0.axes):
                raise _fail(f"{what}: layer '{name}' ({e.dtype}, C {e.content_bytes} bytes, "
                            f"axes {e.axes}) differs from '{layers[0]}' ({e0.dtype}, C "
                            f"{e0.content_bytes} bytes, axes {e0.axes}): one region has one "
                            "dtype, one C size and one set of strides")
            if (e.info.device, e.info.device_index) != (e0.info.device, e0.info.device_index):
                raise _fail(f"{what}: layer '{name}' is on another device than '{layers[0]}'")
        if block_stride is not None and e0.axes["B"][1] != int(block_stride) \
                and e0.axes["B"][0] > 1:
            raise _fail(f"{what}: view '{layers[0]}' has a block stride of {e0.axes['B'][1]} "
                        f"bytes, the config says block_stride {int(block_stride)}")
        for l, (name, e) in enumerate(zip(layers, group)):
            want = offset + l * layer_stride
            if e.info.storage_offset is not None and e.kind != "mamba" \
                    and e.info.storage_offset != want:
                raise _fail(f"{what}: view '{name}' starts {e.info.storage_offset} bytes into "
                            f"its buffer (storage_offset), the config puts layer {l} at "
                            f"offset {offset} + {l} x layer_stride {layer_stride} = {want}")
            if e.ptr - e0.ptr != l * layer_stride:
                raise _fail(f"{what}: view '{name}' (data_ptr) is {e.ptr - e0.ptr} bytes after "
                            f"'{layers[0]}', the config says {l} x layer_stride {layer_stride}")
            if name in covered:
                raise _fail(f"layer '{name}' is in two kv_cache_tensors")
            covered.add(name)
        region = make_region(group, layer_stride, hint if e0.kind == "attention" else None, tp,
                             name=f"{what} ({layers[0]})")
        region.group = group_of.get(layers[0])
        if size and e0.info.storage_offset is not None and \
                e0.info.storage_offset + region.nbytes > size and e0.kind != "mamba":
            raise _fail(f"{what}: its layout spans {region.nbytes} bytes from offset "
                        f"{e0.info.storage_offset}, past the tensor's size {size}")
        regions.append(region)
    missing = [n for n in entries if n not in covered]
    if missing:
        raise _fail(f"layer '{missing[0]}' is among the caches but in no kv_cache_tensor")
    for i, a in enumerate(regions):
        for b in regions[i + 1:]:
            if a.group is not None and a.group == b.group and a.memory == b.memory and \
                    a.device == b.device and a.base < b.base + b.nbytes and \
                    b.base < a.base + a.nbytes:
                raise _fail(f"regions of layers '{a.layer_names[0]}' and '{b.layer_names[0]}' "
                            f"of KV-cache group {a.group} overlap (only different groups may "
                            "alias one another's bytes)")
    return regions
