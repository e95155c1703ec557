"""KvdConnector's scheduler role (the engine-core process): which tokens come from elsewhere,
what each step's workers must save, load, send and store, and the transfer params."""

from __future__ import annotations

import secrets

import kvd

from . import config as kc
from ._compat import logger
from .metadata import KvdConnectorMetadata, LoadSpec, OffloadSpec

_NORMAL_FINISH = ("FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED")


def _status_name(request) -> str:
    status = getattr(request, "status", None)
    return getattr(status, "name", str(status))


def _prompt_len(request) -> int:
    n = getattr(request, "num_prompt_tokens", None)
    if n is None:
        n = len(getattr(request, "prompt_token_ids", None) or [])
    return int(n)


class SchedulerSide:
    def __init__(self, cfg: kc.KvdConfig, vllm_config, kv_cache_config, daemons: dict):
        self.cfg = cfg
        self.kv_cache_config = kv_cache_config
        parallel = getattr(vllm_config, "parallel_config", None)
        self.tp_size = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
        self.groups = kc.transfer_group_ids(kv_cache_config)
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        self.block_sizes = {g: int(getattr(groups[g].kv_cache_spec, "block_size", 0) or 0)
                            for g in self.groups}
        self.fingerprint = kc.fingerprint(kv_cache_config, self.tp_size)
        self.windows = kc.sliding_windows(kv_cache_config)
        self._daemons = daemons
        if cfg.offload and len(self.groups) != 1:
            # kvd's pool holds one block shape, and a hit must cover every group vLLM loads.
            logger.warning("kvd: offload is off: it supports models with one transferred "
                           "KV-cache group, this one has %d", len(self.groups))
            cfg.offload = False
        self._prompt = {}    # req -> prompt tokens
        self._blocks = {}    # req -> [block ids per KV-cache group], as the workers see them
        self._to_save = set()  # prefill: do_remote_decode requests whose prompt is not done yet
        self._saved = set()    # prefill: requests whose layers the workers hand to kvd
        self._loading = set()  # decode: loads started and not yet reported finished
        self._held = {}        # req -> why its blocks are held (until finished_sending)
        self._offload_hit = {}  # req -> locally computed tokens when the hit was counted
        self._meta = KvdConnectorMetadata()
        self._peer = None      # (name, address) of this engine's kvd
        self._handshake = {}
        self._lookup = None    # (connector, buffer) for offload lookups
        self._lookup_failed = False

    # ---- handshake -------------------------------------------------------------------------------

    def set_handshake(self, metadata: dict):
        self._handshake = dict(metadata)
        first = self._handshake.get(min(self._handshake)) if self._handshake else None
        if first is not None and getattr(first, "peer_address", ""):
            self._peer = (first.peer_name, first.peer_address)

    def _open(self, instance: str):
        if self.cfg.embedded:
            return kvd.Connector(daemon=self._daemons[self.cfg.embedded], instance=instance,
                                 timeout=self.cfg.timeout_s,
                             offload_namespace=self.cfg.offload_namespace)
        return kvd.Connector(socket=self.cfg.socket, instance=instance,
                             timeout=self.cfg.timeout_s,
                             offload_namespace=self.cfg.offload_namespace)

    def peer(self):
        """(name, address) of this engine's kvd, the address the decode side dials."""
        if self._peer is None:
            with self._open(f"{self.cfg.instance}.scheduler") as c:
                st = c.status()
            self._peer = (st.get("name", ""), st.get("listen_address", ""))
        name, address = self._peer
        return name, self.cfg.peer_address or address

    def _lookup_connector(self):
        """A connector registering a one-block twin of rank 0's offloadable region, so that kvd
        can look keys up in its pool (lookups name a registered region)."""
        if self._lookup is not None or self._lookup_failed:
            return self._lookup
        meta = self._handshake.get(min(self._handshake)) if self._handshake else None
        lay = getattr(meta, "offload_layout", None)
        if not lay:
            return None
        try:
            from ..describe import KvCacheRegion
            from ..layout import KvLayout
            layout = KvLayout(order=lay["order"], layers=lay["layers"], blocks=1,
                              heads=lay["heads"], block_size=lay["block_size"],
                              content_bytes=lay["content_bytes"], tp_rank=lay["tp_rank"],
                              tp_size=lay["tp_size"], total_heads=lay["total_heads"],
                              replicated=lay["replicated"]).normalized()
            buf = kvd.allocate_host_kv_cache(layout.span_bytes)
            region = KvCacheRegion(layout, int(buf.data_ptr()), "host", 0,
                                   [f"lookup.{i}" for i in range(layout.layers)],
                                   lay.get("kind", "attention"), lay.get("dtype", ""))
            c = kvd.Connector(socket=self.cfg.socket, instance=f"{self.cfg.instance}.lookup",
                              tp_rank=lay["tp_rank"], tp_size=lay["tp_size"],
                              timeout=self.cfg.timeout_s,
                             offload_namespace=self.cfg.offload_namespace) if not self.cfg.embedded else \
                kvd.Connector(daemon=self._daemons[self.cfg.embedded],
                              instance=f"{self.cfg.instance}.lookup", tp_rank=lay["tp_rank"],
                              tp_size=lay["tp_size"], timeout=self.cfg.timeout_s,
                             offload_namespace=self.cfg.offload_namespace)
            c._register(c._handle(), [region])
            self._lookup = (c, buf)
        except kvd.KvdError as e:
            logger.warning("kvd: offload lookups are off: %s", e)
            self._lookup_failed = True
        return self._lookup

    # ---- scheduling ------------------------------------------------------------------------------

    def on_new_request(self, request):
        params = getattr(request, "kv_transfer_params", None) or {}
        self._prompt[request.request_id] = _prompt_len(request)
        if self.cfg.is_producer and params.get("do_remote_decode"):
            self._to_save.add(request.request_id)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        params = getattr(request, "kv_transfer_params", None) or {}
        prompt = _prompt_len(request)
        if params.get("do_remote_prefill"):
            if "kvd_peer_address" not in params:
                logger.error("kvd: request %s has do_remote_prefill but no kvd transfer params "
                             "(kvd_peer_address): was its prefill engine running KvdConnector? "
                             "Computing it locally.", request.request_id)
                return 0, False
            if not self.cfg.is_consumer:
                return 0, False
            total = prompt
            remote = params.get("remote_num_tokens")
            if remote:
                total = min(total, int(remote))
            count = total - num_computed_tokens
            return (count, True) if count > 0 else (0, False)
        if not self.cfg.offload or not self.groups:
            return 0, False
        hashes = list(getattr(request, "block_hashes", None) or [])
        g = self.groups[0]
        bs = self.block_sizes[g]
        if not hashes or not bs:
            return 0, False
        lookup = self._lookup_connector()
        if lookup is None:
            return 0, False
        keys = [kc.offload_key(h, g, 0) for h in hashes[:prompt // bs]]
        if not keys:
            return 0, False
        try:
            hits = lookup[0].offload_lookup(keys)
        except kvd.KvdError as e:
            logger.warning("kvd: offload lookup of %s failed: %s", request.request_id, e)
            return 0, False
        hit_tokens = min(hits * bs, ((prompt - 1) // bs) * bs)  # one token left to compute
        count = hit_tokens - num_computed_tokens
        if count <= 0:
            return 0, False
        self._offload_hit[request.request_id] = num_computed_tokens
        return count, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        rid = request.request_id
        params = getattr(request, "kv_transfer_params", None) or {}
        self._prompt.setdefault(rid, _prompt_len(request))
        if self.cfg.is_producer and params.get("do_remote_decode") and rid not in self._saved:
            self._to_save.add(rid)
        if params.get("do_remote_prefill"):
            if num_external_tokens > 0 and "kvd_peer_address" in params:
                ids = blocks.get_block_ids()
                total = self._prompt[rid]
                if params.get("remote_num_tokens"):
                    total = min(total, int(params["remote_num_tokens"]))
                self._meta.loads.append(LoadSpec(rid, dict(params),
                                                 [list(ids[g]) for g in self.groups], total))
                self._loading.add(rid)
            params["do_remote_prefill"] = False  # one transfer per request
            return
        computed = self._offload_hit.pop(rid, None)
        if computed is None or num_external_tokens <= 0:
            return
        g = self.groups[0]
        bs = self.block_sizes[g]
        first, n = computed // bs, num_external_tokens // bs
        ids = blocks.get_block_ids()[g]
        hashes = list(request.block_hashes)[first:first + n]
        self._meta.offload_loads.append(OffloadSpec(rid, g, hashes, list(ids[first:first + n])))

    def build_connector_meta(self, scheduler_output) -> KvdConnectorMetadata:
        so = scheduler_output
        progress = []
        for nr in getattr(so, "scheduled_new_reqs", None) or []:
            self._blocks[nr.req_id] = [list(b) for b in nr.block_ids]
            if nr.prompt_token_ids is not None:
                self._prompt.setdefault(nr.req_id, len(nr.prompt_token_ids))
            progress.append((nr.req_id, nr.num_computed_tokens))
        cached = getattr(so, "scheduled_cached_reqs", None)
        if cached is not None:
            resumed = getattr(cached, "resumed_req_ids", None) or set()
            for i, rid in enumerate(cached.req_ids):
                new = cached.new_block_ids[i]
                if new is not None:
                    if rid in resumed or rid not in self._blocks:
                        self._blocks[rid] = [list(b) for b in new]
                    else:
                        for have, add in zip(self._blocks[rid], new):
                            have.extend(add)
                progress.append((rid, cached.num_computed_tokens[i]))
        scheduled = getattr(so, "num_scheduled_tokens", None) or {}
        for rid, computed in progress:
            if rid in self._to_save and \
                    computed + scheduled.get(rid, 0) >= self._prompt.get(rid, 1 << 62):
                blocks, total = self._blocks[rid], self._prompt[rid]
                self._meta.saves[rid] = [list(blocks[g][self._skip(g, total) //
                                                         self.block_sizes[g]:])
                                         for g in self.groups]
                self._to_save.discard(rid)
                self._saved.add(rid)
        self._meta.preempted = list(getattr(so, "preempted_req_ids", None) or ())
        for rid in getattr(so, "finished_req_ids", None) or ():
            self._blocks.pop(rid, None)
            self._prompt.pop(rid, None)
        meta, self._meta = self._meta, KvdConnectorMetadata()
        return meta

    # ---- completion ------------------------------------------------------------------------------

    def update_connector_output(self, output):
        for rid in getattr(output, "finished_sending", None) or ():
            self._held.pop(rid, None)
        for rid in getattr(output, "finished_recving", None) or ():
            self._loading.discard(rid)
        for rid in getattr(output, "failed_recving", None) or ():
            self._loading.discard(rid)

    def request_finished(self, request, block_ids) -> tuple:
        rid = request.request_id
        params = getattr(request, "kv_transfer_params", None) or {}
        normal = _status_name(request) in _NORMAL_FINISH
        self._to_save.discard(rid)
        self._offload_hit.pop(rid, None)
        delay, out = False, None
        if rid in self._loading:
            # Aborted while kvd may still write into its blocks: they come back once the load
            # ended (finished_sending).
            self._meta.abort_loads.append(rid)
            self._held[rid] = "load"
            delay = True
        elif rid in self._saved:
            self._saved.discard(rid)
            if normal and params.get("do_remote_decode"):
                # The request's capability (SECURITY.md, transfer tokens): minted here, where the
                # params leave for the decode side, and handed to the workers, which finish the
                # request in kvd with it next step. The decode kvd's Want must present it; one that
                # comes before the workers' request_finished waits for it in the prefill kvd.
                token = secrets.token_hex(16)
                self._meta.sends[rid] = token
                self._held[rid] = "send"
                delay = True
                out = self._params(request, block_ids, token)
            else:
                self._meta.drops.append(rid)
        if self.cfg.offload and normal and self.groups and not delay:
            g = self.groups[0]
            bs = self.block_sizes[g]
            hashes = list(getattr(request, "block_hashes", None) or [])
            full = min(len(hashes), int(getattr(request, "num_computed_tokens", 0)) // bs,
                       len(block_ids[g]))
            if full > 0:
                self._meta.offload_stores.append(
                    OffloadSpec(rid, g, hashes[:full], list(block_ids[g][:full])))
                self._held[rid] = "store"
                delay = True
        return delay, out

    def _skip(self, g, tokens) -> int:
        """Leading tokens of group g that do not move (sliding-window groups: before the
        window)."""
        return kc.swa_skip_tokens(self.windows.get(g), self.block_sizes[g], tokens)

    def _params(self, request, block_ids, token: str) -> dict:
        name, address = self.peer()
        host, _, port = address.rpartition(":")
        prompt = self._prompt.get(request.request_id) or _prompt_len(request)
        computed = int(getattr(request, "num_computed_tokens", 0) or 0)
        return {
            "do_remote_prefill": True, "do_remote_decode": False,
            "remote_engine_id": self.cfg.engine_id,
            "remote_request_id": request.request_id,
            "remote_block_ids": [list(block_ids[g]) for g in self.groups],
            "remote_host": host, "remote_port": int(port) if port.isdigit() else 0,
            "tp_size": self.tp_size,
            "remote_num_tokens": min(computed, prompt) if computed else prompt,
            "transfer_mode": self.cfg.mode,
            "kvd_peer_name": name, "kvd_peer_address": address,
            "kvd_layout": self.fingerprint, "kvd_lease_s": self.cfg.lease_s,
            "kvd_skip_tokens": [self._skip(g, prompt) for g in self.groups],
            "kvd_protocol": kc.PROTOCOL_VERSION, "kvd_transfer_token": token,
        }

    def has_pending_push_work(self) -> bool:
        return bool(self._held)

    def shutdown(self):
        if self._lookup is not None:
            self._lookup[0].close()
            self._lookup = None
