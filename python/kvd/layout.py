"""kvd's layout model in Python: KvLayout mirrors the C kv_layout (kv::LayoutSpec) and
computes the byte offset of any element exactly as kv::KvRegion does (layout/kv_region.cc).
See DESIGN.md, "The layout model"."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .errors import InvalidArgumentError, OutOfRangeError

AXES = "LBHNSC"  # index order of strides, as kv::Axis
VLLM_ORDERS = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
ALIASES = {"NHD": "LBNHC", "HND": "LBHNC"}
MAX_SPAN = 1 << 62


def layout_name(name) -> str:
    """A vLLM layout name (an enum member, "NHD"/"HND" aliases included) as an order string."""
    if name is None:
        return None
    text = getattr(name, "name", name)
    text = str(text).upper()
    text = ALIASES.get(text, text)
    if text not in VLLM_ORDERS:
        raise InvalidArgumentError(f"layout '{name}' is none of {', '.join(VLLM_ORDERS)} "
                                   "(or the aliases NHD, HND)")
    return text


@dataclass
class KvLayout:
    """One region's layout, field for field the C kv_layout. strides are bytes indexed
    L, B, H, N, S, C (AXES); 0 means the dense default of the order."""

    order: str = "LBNHC"
    layers: int = 0
    blocks: int = 0
    heads: int = 0
    block_size: int = 0
    content_bytes: int = 0
    strides: tuple = (0, 0, 0, 0, 0, 0)
    tp_rank: int = 0
    tp_size: int = 1
    total_heads: int = 0
    replicated: bool = False
    region_bytes: int = 0
    _span: int = field(default=0, repr=False, compare=False)

    def full_order(self) -> str:
        return self.order if "L" in self.order else "L" + self.order

    def size(self, axis: str) -> int:
        return {"L": self.layers, "B": self.blocks, "H": self.heads, "N": self.block_size,
                "S": 2 if "S" in self.order else 1, "C": self.content_bytes}[axis]

    def stride(self, axis: str) -> int:
        return self.strides[AXES.index(axis)]

    def normalized(self, what: str = "layout") -> "KvLayout":
        """A copy with every stride filled in and total_heads resolved, after the checks
        kv::KvRegion::Create makes; InvalidArgumentError naming the field otherwise."""
        order = self.full_order()
        if sorted(order) not in (sorted("LBHNC"), sorted("LBHNSC")) or order[-1] != "C":
            raise InvalidArgumentError(f"{what}: order '{self.order}' is not a permutation of "
                                       "LBHNC (optionally with S) ending in C")
        for f in ("layers", "blocks", "heads", "block_size", "content_bytes"):
            if int(getattr(self, f)) <= 0:
                raise InvalidArgumentError(f"{what}: {f} must be positive, got {getattr(self, f)}")
        if len(self.strides) != 6 or any(int(s) < 0 for s in self.strides):
            raise InvalidArgumentError(f"{what}: strides must be 6 non-negative byte counts "
                                       f"(L, B, H, N, S, C), got {tuple(self.strides)}")
        if self.stride("C") > 1:
            raise InvalidArgumentError(f"{what}: C is contiguous, its stride must be 1 or 0")
        strides = [0] * 6
        strides[AXES.index("C")] = 1
        extent = span = self.content_bytes
        for i in range(len(order) - 2, -1, -1):
            a = order[i]
            s = self.stride(a) or extent
            if s < extent:
                raise InvalidArgumentError(
                    f"{what}: stride of {a} ({s} bytes) is smaller than the {order[i + 1]} "
                    f"axis inside it spans ({extent} bytes): elements would overlap")
            n = self.size(a)
            extent, span = s * n, s * (n - 1) + span
            if extent > MAX_SPAN:
                raise InvalidArgumentError(f"{what}: layout spans more than 2^62 bytes")
            strides[AXES.index(a)] = s
        total = self.total_heads
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise InvalidArgumentError(f"{what}: tp_rank {self.tp_rank} of tp_size {self.tp_size}")
        if self.replicated:
            total = total or self.heads
            if total != self.heads:
                raise InvalidArgumentError(f"{what}: a replicated cache holds every head: "
                                           f"total_heads {total} != heads {self.heads}")
        else:
            total = total or self.heads * self.tp_size
            if total >= self.tp_size and total != self.heads * self.tp_size:
                raise InvalidArgumentError(f"{what}: heads {self.heads} x tp_size {self.tp_size} "
                                           f"!= total_heads {total}")
            if total < self.tp_size and (self.heads != 1 or self.tp_size % total):
                raise InvalidArgumentError(f"{what}: total_heads {total} < tp_size "
                                           f"{self.tp_size} needs heads == 1")
        if self.region_bytes and span > self.region_bytes:
            raise OutOfRangeError(f"{what}: the strides span {span} bytes, the region has "
                                  f"{self.region_bytes}")
        return replace(self, strides=tuple(strides), total_heads=total, _span=span)

    @property
    def span_bytes(self) -> int:
        """Bytes from the region's base to one past its last byte."""
        return (self._span if self._span else self.normalized()._span)

    def offset(self, layer, block, head, token, s=0):
        """Byte offset of content byte 0 of (layer, block, head, token, s) from the region's base:
        kv::KvRegion::offset. Works elementwise on numpy arrays too. Call on a normalized()
        layout."""
        st = self.strides
        return layer * st[0] + block * st[1] + head * st[2] + token * st[3] + s * st[4]

    def global_head(self, local: int) -> int:
        """kv::KvRegion::global_head (on a normalized layout)."""
        if self.replicated:
            return local
        if self.total_heads >= self.tp_size:
            return self.tp_rank * self.heads + local
        return self.tp_rank * self.total_heads // self.tp_size

    def page_bytes(self) -> int:
        n = self.heads * self.block_size * self.size("S") * self.content_bytes
        return n * self.layers if self.full_order()[0] == "B" else n

    def to_dict(self) -> dict:
        return {"order": self.order, "layers": self.layers, "blocks": self.blocks,
                "heads": self.heads, "block_size": self.block_size,
                "content_bytes": self.content_bytes, "strides": list(self.strides),
                "tp_rank": self.tp_rank, "tp_size": self.tp_size,
                "total_heads": self.total_heads, "replicated": self.replicated,
                "region_bytes": self.region_bytes}

    def __str__(self) -> str:
        st = " ".join(f"{a}={self.stride(a)}" for a in self.full_order() if a != "C")
        extra = " replicated" if self.replicated else ""
        return (f"{self.order} L={self.layers} B={self.blocks} H={self.heads} "
                f"N={self.block_size} C={self.content_bytes} strides[{st}] "
                f"tp {self.tp_rank}/{self.tp_size} heads {self.total_heads}{extra}")
