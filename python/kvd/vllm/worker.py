"""KvdConnector's worker role (one per TP/PP rank): registration with kvd, per-layer saves,
loads, offload copies and what finished.

One kvd.Connector per transferred KV-cache group: the C API takes one list of block ids per
call for all of a connector's regions, and vLLM's groups have a block table each. Group g's kvd
request id is the vLLM request id, suffixed "|g<g>" for every group but the first."""

from __future__ import annotations

import time

import kvd

from . import config as kc
from ._compat import logger
from .metadata import KvdConnectorMetadata, KvdHandshakeMetadata


def _tp_rank_size(vllm_config):
    parallel = getattr(vllm_config, "parallel_config", None)
    size = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
    rank = None
    if size > 1:
        try:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
            rank = get_tensor_model_parallel_rank()
        except Exception:  # noqa: BLE001 (no vLLM, or its groups are not initialized)
            rank = None
    if rank is None:
        rank = int(getattr(parallel, "rank", 0) or 0) % size
    return rank, size


class _Load:
    __slots__ = ("req_id", "pending", "blocks", "aborted", "failed", "why", "keys")

    def __init__(self, req_id, blocks):
        self.req_id, self.blocks = req_id, blocks  # blocks: {group: [ids]}
        self.keys = {}  # group -> kvd's id of the load
        self.pending, self.aborted, self.failed, self.why = set(), False, False, None


class WorkerSide:
    def __init__(self, cfg: kc.KvdConfig, vllm_config, kv_cache_config, daemons: dict):
        self.cfg = cfg
        self.kv_cache_config = kv_cache_config
        self.tp_rank, self.tp_size = _tp_rank_size(vllm_config)
        self.groups = kc.transfer_group_ids(kv_cache_config)
        self.group_pos = {g: i for i, g in enumerate(self.groups)}
        self.fingerprint = kc.fingerprint(kv_cache_config, self.tp_size)
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        self.block_sizes = {g: int(getattr(groups[g].kv_cache_spec, "block_size", 0) or 0)
                            for g in self.groups}
        self._daemons = daemons
        self.conns = {}      # group -> kvd.Connector
        self.layer_of = {}   # layer name -> (group, layer index of its connector)
        self._cuda = False
        self._meta = None
        self._started = None   # the metadata whose work was started
        self._loads = {}       # req -> _Load
        self._owner = {}       # (group, block) -> req of a load in flight
        # kvd names a load by the source's request id (the prefill's remote_request_id)
        self._local = {}       # kvd load id -> vLLM request id
        self._sends = {}       # req -> kvd RequestDone(sent) still expected
        self._sending, self._recving, self._failed = set(), set(), set()
        self._load_errors = set()
        self._stores = []      # (req, [OffloadOp])
        self._sync_loads = []  # (req, group, OffloadOp, block ids)
        self.stats = {"saves": 0, "loads": 0, "load_failures": 0, "sends": 0, "stores": 0,
                      "offload_loads": 0}

    # ---- keys ------------------------------------------------------------------------------------

    def key(self, req_id: str, group: int) -> str:
        return req_id if group == self.groups[0] else f"{req_id}|g{group}"

    @staticmethod
    def unkey(key: str) -> str:
        return key.split("|g", 1)[0]

    # ---- registration ----------------------------------------------------------------------------

    def _open(self, instance):
        try:
            if self.cfg.embedded:
                d = self._daemons.get(self.cfg.embedded)
                if d is None:
                    raise kc.ConfigError(f"kv_connector_extra_config.kvd_embedded: no kvd.Daemon "
                                         f"registered as {self.cfg.embedded!r} (register it "
                                         "with kvd.vllm.register_embedded_daemon)")
                return kvd.Connector(daemon=d, instance=instance, tp_rank=self.tp_rank,
                                     tp_size=self.tp_size, timeout=self.cfg.timeout_s,
                             offload_namespace=self.cfg.offload_namespace,
                             busy_poll=self.cfg.busy_poll)
            return kvd.Connector(socket=self.cfg.socket, instance=instance, tp_rank=self.tp_rank,
                                 tp_size=self.tp_size, timeout=self.cfg.timeout_s,
                             offload_namespace=self.cfg.offload_namespace,
                             busy_poll=self.cfg.busy_poll)
        except kvd.KvdError as e:
            raise RuntimeError(f"KvdConnector (TP rank {self.tp_rank}): cannot reach kvd at "
                               f"{self.cfg.socket or self.cfg.embedded}: {e}") from e

    def _group_config(self, names):
        """The kv_cache_config's entries for one group's layers, or None when its tensors mix
        groups (then the views alone describe the regions)."""
        cfg = self.kv_cache_config
        tensors = getattr(cfg, "kv_cache_tensors", None) or []
        mine = [t for t in tensors if set(getattr(t, "layers", None) or []) <= set(names)]
        covered = {n for t in mine for n in t.layers}
        if not mine or covered != set(names):
            return None
        return {"kv_cache_tensors": mine, "kv_cache_layout": getattr(cfg, "kv_cache_layout", None),
                "kv_cache_groups": [{"layer_names": list(names)}]}

    def register_kv_caches(self, kv_caches: dict):
        groups = getattr(self.kv_cache_config, "kv_cache_groups", None) or []
        for g in self.groups:
            names = [n for n in groups[g].layer_names if n in kv_caches]
            if not names:
                continue
            caches = {n: kv_caches[n] for n in names}
            first = caches[names[0]]
            first = first[0] if isinstance(first, (list, tuple)) else first
            self._cuda = self._cuda or getattr(getattr(first, "device", None), "type", "") == "cuda"
            instance = self.cfg.instance if g == self.groups[0] else f"{self.cfg.instance}.g{g}"
            c = self._open(instance)
            try:
                c.register_kv_caches(caches, self._group_config(names))
            except kvd.KvdError as e:
                c.close()
                raise RuntimeError(f"KvdConnector: registering KV-cache group {g} ({names[0]}, "
                                   f"...) with kvd failed: {e}") from e
            self.conns[g] = c
            for n in names:
                self.layer_of[n] = (g, c.layer_index[n])
        if not self.conns:
            raise RuntimeError("KvdConnector: none of the KV caches belongs to a transferred "
                               "KV-cache group")

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend=None):
        """One tensor holding every layer per block (uniform single-group models): registered as
        a cross-layer region, dims (B, L, H, N, C)."""
        groups = getattr(self.kv_cache_config, "kv_cache_groups", None) or []
        g = self.groups[0]
        c = self._open(self.cfg.instance)
        name = groups[g].layer_names[0] if groups else "cross_layers"
        c.register_kv_caches({name: kv_cache}, dims="BLHNC")
        self.conns[g] = c
        for l, n in enumerate(groups[g].layer_names if groups else [name]):
            self.layer_of[n] = (g, l)

    def handshake(self) -> KvdHandshakeMetadata:
        g = self.groups[0]
        c = self.conns.get(g)
        if c is None:
            return None
        st = c.status()
        r = c.regions[0]
        lay = r.layout
        return KvdHandshakeMetadata(
            tp_rank=self.tp_rank, peer_name=st.get("name", ""),
            peer_address=self.cfg.peer_address or st.get("listen_address", ""),
            offload_layout={"order": lay.order, "layers": lay.layers, "heads": lay.heads,
                            "block_size": lay.block_size, "content_bytes": lay.content_bytes,
                            "tp_rank": lay.tp_rank, "tp_size": lay.tp_size,
                            "total_heads": lay.total_heads, "replicated": bool(lay.replicated),
                            "kind": r.kind, "dtype": r.dtype})

    # ---- per step --------------------------------------------------------------------------------

    def bind(self, meta):
        self._meta = meta

    def _start(self):
        """Starts the bound metadata's work once: kvd request_finished of the sends, the loads,
        the offload stores and synchronous offload loads."""
        meta = self._meta
        if meta is None or meta is self._started or not isinstance(meta, KvdConnectorMetadata):
            return
        self._started = meta
        if meta.sends:
            self._send(meta.sends)
        for rid in meta.abort_loads:
            load = self._loads.get(rid)
            if load is not None:
                load.aborted = True
        if meta.loads:
            self._start_loads(meta.loads)
        for spec in meta.offload_stores:
            self._store(spec)
        for spec in meta.offload_loads:
            self._offload_load(spec)

    def _send(self, sends):
        """Finishes the step's sends ({req_id: token}) in kvd under the scheduler's transfer
        tokens (every group's request and every rank the same), which the decode side presents:
        one round trip per group's connection for all of them, not one per request (a pull's
        decode side waits for them)."""
        expected = dict.fromkeys(sends, 0)
        items = list(sends.items())
        step = kvd.Connector.MAX_FINISHES_PER_CALL
        for g, c in self.conns.items():
            for begin in range(0, len(items), step):
                chunk = items[begin:begin + step]
                try:
                    got = c.requests_finished([(self.key(rid, g), token or None)
                                               for rid, token in chunk])
                except kvd.KvdError as e:
                    logger.warning("kvd: request_finished of %d requests failed: %s",
                                   len(chunk), e)
                    continue
                for (rid, _), result in zip(chunk, got):
                    if isinstance(result, kvd.NotFoundError):
                        continue  # nothing saved for this group on this rank
                    if isinstance(result, kvd.KvdError):
                        logger.warning("kvd: request_finished(%s) failed: %s", rid, result)
                        continue
                    expected[rid] += 1
        for rid, n in expected.items():
            self.stats["sends"] += 1
            if n:
                self._sends[rid] = self._sends.get(rid, 0) + n
            else:
                self._sending.add(rid)

    def _fail_load(self, load, why, groups=None):
        if not load.failed:
            logger.error("kvd: load of %s failed: %s", load.req_id, why)
            load.failed, load.why = True, why
            self.stats["load_failures"] += 1
        for g in (load.blocks if groups is None else groups):
            self._load_errors.update(load.blocks[g])

    def _start_loads(self, specs):
        per_group = {g: [] for g in self.conns}
        for spec in specs:
            blocks = {g: spec.block_ids[self.group_pos[g]] for g in self.conns}
            load = self._loads[spec.req_id] = _Load(spec.req_id, blocks)
            self.stats["loads"] += 1
            p = spec.params
            why = None
            if p.get("kvd_protocol") != kc.PROTOCOL_VERSION:
                why = (f"kvd transfer params of protocol {p.get('kvd_protocol')!r}, this "
                       f"connector speaks {kc.PROTOCOL_VERSION}")
            else:
                diff = kc.layout_mismatch(p.get("kvd_layout"), self.fingerprint)
                if diff:
                    why = f"the prefill engine's KV cache is incompatible: {diff}"
            if why:
                self._fail_load(load, why)
                continue
            remote_rid = p.get("remote_request_id") or spec.req_id
            skips = p.get("kvd_skip_tokens") or [0] * len(self.groups)
            for g in self.conns:
                skip, bs = int(skips[self.group_pos[g]]), self.block_sizes[g] or 1
                if skip % bs:
                    self._fail_load(load, f"group {g}: the prefill side moves tokens from "
                                          f"{skip}, not a whole number of this engine's "
                                          f"{bs}-token blocks")
                    break
                ids, tokens = blocks[g][skip // bs:], spec.tokens - skip
                if not ids or tokens <= 0:
                    continue
                params = kvd.TransferParams(
                    peer_name=p.get("kvd_peer_name", ""), peer_address=p["kvd_peer_address"],
                    request_id=self.key(remote_rid, g),
                    transfer_token=p.get("kvd_transfer_token", ""))
                self._local[params.request_id] = spec.req_id
                load.keys[g] = params.request_id
                per_group[g].append((spec.req_id, params, ids, tokens))
                load.pending.add(g)
                for b in ids:
                    self._owner[(g, b)] = spec.req_id
        for g, loads in per_group.items():
            step = kvd.Connector.MAX_LOADS_PER_CALL
            for i in range(0, len(loads), step):
                chunk = loads[i:i + step]
                batch = [(params.request_id, params, ids, tokens, self.cfg.mode)
                         for rid, params, ids, tokens in chunk]
                try:
                    results = self.conns[g].start_loads(batch)
                except kvd.KvdError as e:
                    results = [e] * len(batch)
                for (rid, _, _, _), err in zip(chunk, results):
                    if err is not None:
                        load = self._loads[rid]
                        load.pending.discard(g)
                        self._fail_load(load, str(err), groups=[g])
        for spec in specs:
            self._maybe_done(self._loads.get(spec.req_id))

    @staticmethod
    def _load_error(c, load, g) -> str:
        """kvd's reason for the failed load of group g (a refused transfer token, a peer gone)."""
        why = None
        try:
            why = c.load_error(load.keys.get(g, load.req_id))
        except kvd.KvdError:
            pass
        if why is None:
            return f"kvd reported the load of group {g} failed"
        return f"group {g}: {why.message}"  # the C message, which names its code

    def _maybe_done(self, load):
        if load is None or load.pending:
            return
        self._loads.pop(load.req_id, None)
        for k in [k for k, v in self._local.items() if v == load.req_id]:
            del self._local[k]
        for g, ids in load.blocks.items():
            for b in ids:
                if self._owner.get((g, b)) == load.req_id:
                    del self._owner[(g, b)]
        if load.failed:
            # Every group's load ended: nothing writes into its blocks any more.
            for g in load.blocks:
                self._load_errors.update(load.blocks[g])
        if load.aborted:
            self._sending.add(load.req_id)  # its blocks go back to vLLM now
            return
        self._recving.add(load.req_id)
        if load.failed:
            self._failed.add(load.req_id)

    def _keys(self, spec, region):
        return [kc.offload_key(h, spec.group, region) for h in spec.block_hashes]

    def _store(self, spec):
        c = self.conns.get(spec.group)
        ops = []
        if c is not None:
            for r in range(len(c.regions)):
                try:
                    ops.append(c.offload_store(self._keys(spec, r), spec.block_ids, region=r,
                                               stream=self._stream()))
                except kvd.KvdError as e:
                    logger.warning("kvd: offload store of %s failed: %s", spec.req_id, e)
        self.stats["stores"] += 1
        self._stores.append((spec.req_id, ops))

    def _offload_load(self, spec):
        c = self.conns.get(spec.group)
        for r in range(len(c.regions) if c else 0):
            try:
                op = c.offload_load(self._keys(spec, r), spec.block_ids, per_layer=True,
                                    region=r)
            except kvd.KvdError as e:
                logger.error("kvd: offload load of %s failed: %s", spec.req_id, e)
                self._load_errors.update(spec.block_ids)
                continue
            self.stats["offload_loads"] += 1
            self._sync_loads.append((spec.req_id, spec.group, op, list(spec.block_ids)))

    def _stream(self):
        if not self._cuda:
            return None
        import torch
        return torch.cuda.current_stream()

    # ---- hooks -----------------------------------------------------------------------------------

    def start_load_kv(self):
        self._start()

    def wait_for_layer_load(self, layer_name):
        if not self._sync_loads:
            return
        g, idx = self.layer_of.get(layer_name, (None, None))
        for item in self._sync_loads:
            rid, group, op, blocks = item
            if group != g or op is None:
                continue
            try:
                op.wait_layer(idx)
            except kvd.KvdError as e:
                logger.error("kvd: offload load of %s, layer %s: %s", rid, layer_name, e)
                self._load_errors.update(blocks)

    def save_kv_layer(self, layer_name):
        meta = self._meta
        if meta is None or not meta.saves:
            return
        if meta is not self._started:
            self._start()
        where = self.layer_of.get(layer_name)
        if where is None:
            return
        g, idx = where
        c, pos = self.conns[g], self.group_pos[g]
        stream = self._stream()
        # One call into kvd per layer for every request of the step.
        saves = [(self.key(rid, g), blocks[pos]) for rid, blocks in meta.saves.items()
                 if blocks[pos]]
        if saves:
            try:
                results = c.save_layers(idx, saves, stream)
            except kvd.KvdError as e:
                results = [e] * len(saves)
            for (key, _), e in zip(saves, results):
                if e is not None:
                    logger.error("kvd: save_layer(%s, %s) failed: %s", key, layer_name, e)
        self.stats["saves"] += len(meta.saves)

    def wait_for_save(self):
        self._start()
        loads, self._sync_loads = self._sync_loads, []
        for rid, _, op, blocks in loads:
            try:
                op.wait()
            except kvd.KvdError as e:
                logger.error("kvd: offload load of %s: %s", rid, e)
                self._load_errors.update(blocks)
            finally:
                op.free()

    def get_finished(self, finished_req_ids=()):
        self._start()
        if self._sync_loads:  # a step without wait_for_save (no forward)
            self.wait_for_save()
        for g, c in self.conns.items():
            try:
                sent, received = c.get_finished()
                failed = c.get_failed_blocks()
            except kvd.KvdError as e:
                logger.error("kvd: polling group %s failed: %s", g, e)
                sent, received, failed = [], [], []
                # This rank's kvd is gone: nothing reads the held blocks any more.
                sent = [self.key(rid, g) for rid in list(self._sends)]
                for load in list(self._loads.values()):
                    if g in load.pending:
                        load.pending.discard(g)
                        self._fail_load(load, str(e), groups=[g])
            for k in sent:
                rid = self.unkey(k)
                if rid in self._sends:
                    self._sends[rid] -= 1
                    if self._sends[rid] <= 0:
                        del self._sends[rid]
                        self._sending.add(rid)
            for k in received:
                load = self._loads.get(self._local.get(k, ""))
                if load is not None:
                    load.pending.discard(g)
            for b in failed:
                rid = self._owner.get((g, b))
                load = self._loads.get(rid) if rid else None
                if load is not None and g in load.pending:
                    load.pending.discard(g)
                    self._fail_load(load, self._load_error(c, load, g), groups=[g])
        for load in list(self._loads.values()):
            self._maybe_done(load)
        stores, self._stores = self._stores, []
        for rid, ops in stores:
            for op in ops:
                try:
                    op.wait()
                except kvd.KvdError as e:
                    logger.warning("kvd: offload store of %s: %s", rid, e)
                finally:
                    op.free()
            self._sending.add(rid)
        sending, self._sending = self._sending, set()
        recving, self._recving = self._recving, set()
        return (sending or None), (recving or None)

    def take_failed_recving(self):
        failed, self._failed = self._failed, set()
        return failed

    def get_block_ids_with_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self, timeout: float = 10.0):
        """Waits (bounded) for sends and loads in flight, then closes every kvd connection."""
        deadline = time.monotonic() + timeout
        while (self._sends or self._loads) and time.monotonic() < deadline:
            self.get_finished(set())
            time.sleep(0.01)
        for op_list in [ops for _, ops in self._stores]:
            for op in op_list:
                op.free()
        for _, _, op, _ in self._sync_loads:
            op.free()
        self._stores, self._sync_loads = [], []
        for c in self.conns.values():
            c.close()
        self.conns = {}
