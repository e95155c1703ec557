"""KvdConnector: vLLM's KVConnectorBase_V1 (+ SupportsHMA) over kvd, both roles.

    --kv-transfer-config '{"kv_connector": "KvdConnector", "kv_connector_module_path": "kvd.vllm",
      "kv_role": "kv_producer", "kv_connector_extra_config": {"kvd_socket": "/run/kvd.sock"}}'
"""

from __future__ import annotations

from . import config as kc
from ._compat import (HAVE_VLLM, KVConnectorBase_V1, KVConnectorTransferResults, KvdStats,
                      SupportsHMA, VLLM_VERSION, base_has, logger)

# Hooks vLLM added over the supported releases; where the installed base class lacks one, vLLM
# does not call it and the connector's older path carries the same information.
OPTIONAL_HOOKS = {
    "get_transfer_results": "failed loads reach the scheduler through invalid_block_ids only",
    "has_pending_push_work": "the engine may idle while kvd still holds finished requests",
    "on_new_request": "requests are recorded at update_state_after_alloc instead",
    "set_xfer_handshake_metadata_pp_aware": "handshake through set_xfer_handshake_metadata",
}
from .metadata import KvdConnectorMetadata
from .scheduler import SchedulerSide
from .worker import WorkerSide

# kvd.Daemon objects for kv_connector_extra_config.kvd_embedded (tests, single process).
_EMBEDDED = {}


def register_embedded_daemon(name: str, daemon) -> None:
    """Makes an in-process kvd.Daemon usable as {"kvd_embedded": name}; None removes it."""
    if daemon is None:
        _EMBEDDED.pop(name, None)
    else:
        _EMBEDDED[name] = daemon


def _is_scheduler(role) -> bool:
    return getattr(role, "name", str(role)).upper().endswith("SCHEDULER")


class KvdConnector(KVConnectorBase_V1, SupportsHMA):
    """P/D transfer (per-layer push or pull) and CPU offload through kvd."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.kvd_config = kc.parse_config(vllm_config.kv_transfer_config,
                                          check_socket=True)
        if not self.kvd_config.offload_namespace or self.kvd_config.offload_namespace == "vllm":
            # Block hashes name tokens, not the model: engines of one model share the pool's
            # blocks (a restarted engine has a new engine_id), other models do not see them.
            model = getattr(getattr(vllm_config, "model_config", None), "model", None)
            self.kvd_config.offload_namespace = f"vllm:{model}" if model else "vllm"
        self._scheduler = self._worker = None
        if _is_scheduler(role):
            self._scheduler = SchedulerSide(self.kvd_config, vllm_config, kv_cache_config,
                                            _EMBEDDED)
        else:
            self._worker = WorkerSide(self.kvd_config, vllm_config, kv_cache_config, _EMBEDDED)
        if HAVE_VLLM:
            for hook, fallback in OPTIONAL_HOOKS.items():
                if not base_has(hook):
                    logger.info("KvdConnector: this vLLM has no %s: %s", hook, fallback)
        logger.info("KvdConnector %s: role %s, mode %s, offload %s, kvd %s (vLLM %s)",
                    self.kvd_config.engine_id, getattr(role, "name", role), self.kvd_config.mode,
                    self.kvd_config.offload, self.kvd_config.socket or self.kvd_config.embedded,
                    VLLM_VERSION or "absent: stand-ins")

    # ---- class-level declarations ----

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None  # kvd plans any layout into any other

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config) -> bool:
        # save_kv_layer hands each layer to kvd (push) and wait_for_layer_load waits for
        # offload hits: both must run between graph pieces.
        extra = extra_config or {}
        return extra.get("mode", "push") == "push" or bool(extra.get("offload", False))

    # ---- worker role ----

    def register_kv_caches(self, kv_caches):
        self._worker.register_kv_caches(kv_caches)

    def register_cross_layers_kv_cache(self, kv_cache, attn_backend=None):
        self._worker.register_cross_layers_kv_cache(kv_cache, attn_backend)

    def bind_connector_metadata(self, connector_metadata):
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None:
            self._worker.bind(connector_metadata)

    def clear_connector_metadata(self):
        super().clear_connector_metadata()
        if self._worker is not None:
            self._worker.bind(None)

    def handle_preemptions(self, kv_connector_metadata=None):
        # Saves are one-way messages and kvd copies a layer only after its event: nothing to
        # flush before preempted blocks are reused.
        return None

    def start_load_kv(self, forward_context=None, **kwargs):
        self._worker.start_load_kv()

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name, kv_layer=None, attn_metadata=None, **kwargs) -> None:
        self._worker.save_kv_layer(layer_name)

    def wait_for_save(self):
        self._worker.wait_for_save()

    def get_finished(self, finished_req_ids):
        return self._worker.get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids):
        sending, recving = self._worker.get_finished(finished_req_ids)
        return KVConnectorTransferResults(finished_sending=set(sending or ()),
                                          finished_recving=set(recving or ()),
                                          failed_recving=self._worker.take_failed_recving())

    def get_block_ids_with_load_errors(self):
        return self._worker.get_block_ids_with_load_errors()

    def get_handshake_metadata(self):
        return self._worker.handshake() if self._worker is not None else None

    def get_kv_connector_stats(self):
        """The worker's counters since the last call (saves, loads, load_failures, sends,
        stores, offload_loads), or None when nothing happened."""
        if self._worker is None:
            return None
        now = dict(self._worker.stats)
        last, self._last_stats = getattr(self, "_last_stats", {}), now
        delta = {k: v - last.get(k, 0) for k, v in now.items()}
        stats = KvdStats(data=delta)
        return None if stats.is_empty() else stats

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KvdStats(data=dict(data or {}))

    @property
    def stats(self) -> dict:
        return dict(self._worker.stats) if self._worker is not None else {}

    # ---- scheduler role ----

    def set_xfer_handshake_metadata(self, metadata):
        if self._scheduler is not None:
            self._scheduler.set_handshake(metadata)

    def on_new_request(self, request):
        self._scheduler.on_new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KvdConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output):
        self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request, block_ids):
        return self._scheduler.request_finished(request, (list(block_ids),))

    def request_finished_all_groups(self, request, block_ids):
        return self._scheduler.request_finished(request, tuple(block_ids))

    def get_loaded_kv_cache_group_ids(self, request):
        return kc.transfer_group_ids(self._kv_cache_config)

    def take_events(self):
        return ()

    def has_pending_push_work(self) -> bool:
        return self._scheduler is not None and self._scheduler.has_pending_push_work()

    def reset_cache(self):
        return None

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()
        if self._scheduler is not None:
            self._scheduler.shutdown()
