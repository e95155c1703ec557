"""KvdConnector's configuration (kv_connector_extra_config), the layout fingerprint carried in
the transfer params, and the offload keys derived from vLLM's block hashes."""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass

PROTOCOL_VERSION = 1
MODES = ("push", "pull")

# key -> (type, default, what it does); README.md (examples/vllm) lists the same.
EXTRA_KEYS = {
    "kvd_socket": (str, None, "the node's kvd unix socket (kvd --socket); required unless "
                              "kvd_embedded"),
    "kvd_embedded": (str, None, "name of a kvd.Daemon registered with "
                                "kvd.vllm.register_embedded_daemon (tests, one process)"),
    "mode": (str, "push", "push: the prefill side streams each layer as it is saved; pull: the "
                          "decode side reads the whole request after the prefill finished"),
    "offload": (bool, False, "store finished requests' full blocks in kvd's CPU pool (kvd "
                             "--offload-bytes) keyed by vLLM's block hashes; load prefix hits"),
    "kvd_instance": (str, None, "kvd instance name of this engine's ranks (default: the "
                                "engine_id)"),
    "kvd_offload_namespace": (str, None, "whose blocks in kvd's pool this engine stores and "
                                         "finds: engines that share it share prefixes, across "
                                         "restarts (default: vllm:<model>)"),
    "timeout_s": (float, 30.0, "bound of every blocking call into kvd"),
    "kvd_busy_poll": (bool, False, "the workers' connectors spin instead of sleeping: on kvd's "
                                   "socket (a core per worker) and in wait_for_layer_load; pair "
                                   "with kvd --busy-poll"),
    "lease_s": (float, 30.0, "advertised in the params; the prefill kvd's --lease-ms decides"),
    "kvd_peer_address": (str, None, "the address the decode side dials (default: the prefill "
                                    "kvd's listen address), or the prefill kvd's --name: a "
                                    "decode kvd run with --etcd finds its address there"),
}


class ConfigError(ValueError):
    """A bad kv_transfer_config for KvdConnector."""


@dataclass
class KvdConfig:
    socket: str | None
    embedded: str | None
    mode: str
    offload: bool
    instance: str
    timeout_s: float
    lease_s: float
    peer_address: str | None
    role: str  # kv_producer, kv_consumer, kv_both
    engine_id: str
    load_failure_policy: str
    offload_namespace: str = "vllm"
    busy_poll: bool = False

    @property
    def is_producer(self):
        return self.role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self):
        return self.role in ("kv_consumer", "kv_both")


def _get(obj, name, default=None):
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def parse_config(kv_transfer_config, check_socket: bool = True) -> KvdConfig:
    """KvdConfig from vLLM's KVTransferConfig (or a dict of its fields). ConfigError names the
    key and what it accepts."""
    extra = _get(kv_transfer_config, "kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ConfigError(f"kv_connector_extra_config must be a dict, got {extra!r}")
    unknown = sorted(set(extra) - set(EXTRA_KEYS))
    if unknown:
        raise ConfigError(f"kv_connector_extra_config: unknown key(s) {unknown}; KvdConnector "
                          f"knows {sorted(EXTRA_KEYS)}")
    values = {}
    for key, (kind, default, _) in EXTRA_KEYS.items():
        v = extra.get(key, default)
        if v is None:
            values[key] = None
            continue
        if kind is bool:
            if isinstance(v, str) and v.lower() in ("true", "false", "1", "0"):
                v = v.lower() in ("true", "1")
            if not isinstance(v, bool):
                raise ConfigError(f"kv_connector_extra_config.{key} must be true or false, "
                                  f"got {v!r}")
        elif kind is float:
            try:
                v = float(v)
            except (TypeError, ValueError):
                raise ConfigError(f"kv_connector_extra_config.{key} must be seconds, "
                                  f"got {v!r}") from None
            if not 0 < v < 3600:
                raise ConfigError(f"kv_connector_extra_config.{key} must be in (0, 3600) "
                                  f"seconds, got {v}")
        elif not isinstance(v, str) or not v:
            raise ConfigError(f"kv_connector_extra_config.{key} must be a non-empty string, "
                              f"got {v!r}")
        values[key] = v
    if values["mode"] not in MODES:
        raise ConfigError(f"kv_connector_extra_config.mode must be one of {list(MODES)}, got "
                          f"{values['mode']!r}")
    if (values["kvd_socket"] is None) == (values["kvd_embedded"] is None):
        raise ConfigError("kv_connector_extra_config needs exactly one of kvd_socket (the "
                          "node's kvd unix socket, kvd --socket) and kvd_embedded")
    if check_socket and values["kvd_socket"] and not os.path.exists(values["kvd_socket"]):
        raise ConfigError(f"kv_connector_extra_config.kvd_socket: no kvd socket at "
                          f"{values['kvd_socket']} (start kvd with --socket "
                          f"{values['kvd_socket']}, or fix the path)")
    role = _get(kv_transfer_config, "kv_role")
    if role not in ("kv_producer", "kv_consumer", "kv_both"):
        raise ConfigError(f"kv_role must be kv_producer, kv_consumer or kv_both, got {role!r}")
    engine_id = str(_get(kv_transfer_config, "engine_id") or "vllm")
    policy = _get(kv_transfer_config, "kv_load_failure_policy") or "fail"
    return KvdConfig(socket=values["kvd_socket"], embedded=values["kvd_embedded"],
                     mode=values["mode"], offload=values["offload"],
                     instance=values["kvd_instance"] or engine_id,
                     timeout_s=values["timeout_s"], lease_s=values["lease_s"],
                     peer_address=values["kvd_peer_address"], role=role, engine_id=engine_id,
                     load_failure_policy=policy,
                     offload_namespace=values["kvd_offload_namespace"] or "vllm",
                     busy_poll=values["kvd_busy_poll"])


# ---- layout fingerprint --------------------------------------------------------------------------

def transfer_group_ids(kv_cache_config) -> tuple:
    groups = _get(kv_cache_config, "kv_cache_groups") or []
    ids = _get(kv_cache_config, "transfer_group_ids", None)
    if ids is not None and not callable(ids):
        return tuple(ids)
    return tuple(g for g, grp in enumerate(groups) if _get(grp, "enable_kv_transfer", True))


def fingerprint(kv_cache_config, tp_size: int) -> list:
    """Per transfer group what both sides must agree on (layers, kind, heads, head size,
    dtype, window); TP size, block size and layout may differ (kvd plans those)."""
    groups = _get(kv_cache_config, "kv_cache_groups") or []
    out = []
    for g in transfer_group_ids(kv_cache_config):
        spec = _get(groups[g], "kv_cache_spec")
        kind = type(spec).__name__
        mla = "MLA" in kind
        heads = _get(spec, "num_kv_heads", 1) or 1
        out.append({
            "group": g, "kind": kind, "layers": len(_get(groups[g], "layer_names") or []),
            "total_kv_heads": 1 if mla else int(heads) * max(1, int(tp_size)),
            "head_size": int(_get(spec, "head_size", 0) or 0),
            "dtype": str(_get(spec, "dtype", "")).replace("torch.", ""),
            "sliding_window": _get(spec, "sliding_window", None),
            "block_size": int(_get(spec, "block_size", 0) or 0),
        })
    return out


IGNORED_FIELDS = ("group", "block_size")  # planned by kvd, never refused


def layout_mismatch(remote: list, local: list) -> str | None:
    """None when the prefill's fingerprint is compatible with ours, else what differs."""
    if remote is None:
        return None
    if len(remote) != len(local):
        return (f"the prefill engine transfers {len(remote)} KV-cache group(s), this engine "
                f"{len(local)}")
    diffs = []
    for r, l in zip(remote, local):
        for k in sorted(set(r) | set(l)):
            if k in IGNORED_FIELDS:
                continue
            if r.get(k) != l.get(k):
                diffs.append(f"group {l.get('group')}: {k} {r.get(k)!r} (prefill) != "
                             f"{l.get(k)!r} (decode)")
    return "; ".join(diffs) or None


# ---- offload keys --------------------------------------------------------------------------------

def hash_bytes(h) -> bytes:
    if isinstance(h, (bytes, bytearray, memoryview)):
        return bytes(h)
    if isinstance(h, int):
        return h.to_bytes(8, "little", signed=h < 0)
    inner = getattr(h, "hash_value", None)  # older BlockHashType(hash_value, token_ids, ...)
    if inner is not None:
        return hash_bytes(inner)
    return repr(h).encode()


def offload_key(h, group: int, region: int) -> bytes:
    """16 bytes naming (vLLM block hash, KV-cache group, region): deterministic across processes,
    so kvd's pool outlives engine restarts (vLLM's hashes are, with PYTHONHASHSEED set)."""
    return hashlib.blake2b(hash_bytes(h) + b"kvd" + group.to_bytes(2, "big") +
                           region.to_bytes(2, "big"), digest_size=16).digest()


# ---- sliding-window tails ------------------------------------------------------------------------

# The leading tokens a sliding-window group does not move are a multiple of this (and of the
# prefill block size), so that they are whole blocks on a decode side of any block size that
# divides it: kvd loads whole blocks from a request's first saved one.
SWA_SKIP_ALIGN = 256


def sliding_windows(kv_cache_config) -> dict:
    """transfer group -> its sliding window in tokens (sliding-window groups only)."""
    groups = _get(kv_cache_config, "kv_cache_groups") or []
    out = {}
    for g in transfer_group_ids(kv_cache_config):
        spec = _get(groups[g], "kv_cache_spec")
        window = _get(spec, "sliding_window", None)
        if window and "SlidingWindow" in type(spec).__name__:
            out[g] = int(window)
    return out


def swa_skip_tokens(window, block_size: int, tokens: int) -> int:
    """Leading tokens of a `tokens`-token prompt a sliding-window group need not move: those
    before the window of the last prompt token (which the decode side recomputes), rounded
    down to whole blocks of SWA_SKIP_ALIGN tokens."""
    if not window or not block_size:
        return 0
    start = max(0, tokens - int(window) - 1)
    unit = block_size * SWA_SKIP_ALIGN // math.gcd(block_size, SWA_SKIP_ALIGN)
    return (start // unit) * unit
