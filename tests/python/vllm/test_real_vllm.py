"""KvdConnector in real vLLM (tools/test-vllm.sh makes a venv with vllm==0.33.0 and runs this;
skipped where vLLM is not importable).

Two engines, each with vLLM's own Scheduler built from a VllmConfig over a local config.json (no
downloads, DeviceConfig("cpu")); the connector is loaded by vLLM's KVConnectorFactory through
kv_connector_module_path "kvd.vllm" in the scheduler role (inside Scheduler.__init__) and in the
worker role; KV tensors are viewed by vLLM's own create_kv_cache_views over kvd shared memory.
The model runner is played by this file: it writes K/V for the scheduled tokens and calls the
worker connector in the order vLLM's runner does. A request goes prefill (do_remote_decode) ->
kv_transfer_params -> decode (do_remote_prefill) -> loaded (every element checked) -> finished,
and both schedulers end with every block free. The P/D kvds hold a peer secret, so transfer
tokens are required (SECURITY.md)."""

import json
import os
import time

import pytest

# (tests/python/vllm itself can shadow the name "vllm" as a namespace package: ask for a module
# only the real vLLM has.)
pytest.importorskip("vllm.distributed.kv_transfer.kv_connector.v1.base",
                    reason="vLLM is not installed (tools/test-vllm.sh makes a venv with it)")
torch = pytest.importorskip("torch")

import kvd  # noqa: E402
import kvd.vllm as kv  # noqa: E402

PROMPT = list(range(100, 140))  # 40 tokens
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
NUM_BLOCKS, BLOCK, HEADS, HEAD = 64, 16, 2, 16


def _model_dir(tmp_path):
    d = tmp_path / "tiny-llama"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": HEADS,
        "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5, "torch_dtype": "float16", "head_dim": HEAD}))
    return str(d)


def _vllm_config(model, role, extra, engine_id):
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                             SchedulerConfig, VllmConfig)
    model_config = ModelConfig(model=model, skip_tokenizer_init=True, dtype="float16",
                               max_model_len=512, seed=0)
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    sched = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=512,
                            is_encoder_decoder=False, async_scheduling=False)
    ktc = KVTransferConfig(kv_connector="KvdConnector", kv_connector_module_path="kvd.vllm",
                           kv_role=role, engine_id=engine_id, kv_connector_extra_config=extra)
    return VllmConfig(model_config=model_config, cache_config=cache, scheduler_config=sched,
                      kv_transfer_config=ktc, device_config=DeviceConfig("cpu"))


class Engine:
    def __init__(self, tmp_path, name, role, extra, hybrid=False):
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, KVCacheTensor,
                                                SlidingWindowSpec, create_kv_cache_views)
        from vllm.v1.kv_cache_layout import KVCacheLayout
        from vllm.v1.structured_output import StructuredOutputManager
        self.name = name
        self.config = _vllm_config(_model_dir(tmp_path), role, extra, name)
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                                 dtype=torch.float16)
        page = spec.page_size_bytes
        if hybrid:  # layer 0 full attention, layer 1 a sliding window of 16: two groups
            swa = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD,
                                    dtype=torch.float16, sliding_window=16)
            specs = [(spec, LAYERS[:1]), (swa, LAYERS[1:])]
        else:
            specs = [(spec, list(LAYERS))]
        size = page * NUM_BLOCKS * len(LAYERS)
        # One allocation; each group's tensor its own layer-first range (LBNHC).
        tensors, at = [], 0
        for sp, names in specs:
            tensors.append(KVCacheTensor(size=size, layers=list(names),
                                         layer_stride=page * NUM_BLOCKS, block_stride=page,
                                         offset=at))
            at += page * NUM_BLOCKS * len(names)
        self.kv_cache_config = KVCacheConfig(
            num_blocks=NUM_BLOCKS, kv_cache_tensors=tensors,
            kv_cache_groups=[KVCacheGroupSpec(list(names), sp) for sp, names in specs],
            kv_cache_layout="LBNHC")
        # The worker: vLLM's views over kvd shared memory, the connector from the factory.
        self.raw = kvd.allocate_host_kv_cache(size)
        self.views = {}
        for (sp, names), tensor in zip(specs, tensors):
            views = create_kv_cache_views(self.raw.view(torch.int8), sp, NUM_BLOCKS,
                                          KVCacheLayout.LBNHC, tensor)
            self.views.update(zip(names, views))
        self.group_of = {n: g for g, (_, names) in enumerate(specs) for n in names}
        self.worker = KVConnectorFactory.create_connector(self.config, KVConnectorRole.WORKER,
                                                          self.kv_cache_config)
        assert type(self.worker).__name__ == "KvdConnector"
        self.worker.register_kv_caches(self.views)
        handshake = self.worker.get_handshake_metadata()
        # The scheduler builds its own (SCHEDULER role) connector through the same factory.
        self.config.cache_config.num_gpu_blocks = NUM_BLOCKS
        self.scheduler = Scheduler(vllm_config=self.config, kv_cache_config=self.kv_cache_config,
                                   structured_output_manager=StructuredOutputManager(self.config),
                                   block_size=BLOCK, log_stats=False)
        assert type(self.scheduler.connector).__name__ == "KvdConnector"
        self.scheduler.connector.set_xfer_handshake_metadata_pp_aware({(0, 0): handshake})
        self.blocks = {}
        self.finished = {}
        self.computed_here = {}  # req -> tokens this engine's "model" computed

    def ids(self, rid, name):
        return self.blocks[rid][self.group_of[name]]

    def _write(self, rid, start, end):
        for l, name in enumerate(LAYERS):
            ids = self.ids(rid, name)
            v = self.views[name].view(torch.int16)
            for t in range(start, end):
                v[ids[t // BLOCK], :, t % BLOCK] = _value(l, t)

    def step(self):
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        so = self.scheduler.schedule()
        for nr in so.scheduled_new_reqs:
            self.blocks[nr.req_id] = [list(b) for b in nr.block_ids]
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            if cached.new_block_ids[i] is not None:
                have = self.blocks.setdefault(rid, [[] for _ in cached.new_block_ids[i]])
                for h, add in zip(have, cached.new_block_ids[i]):
                    h.extend(add)
        w = self.worker
        md = so.kv_connector_metadata
        w.handle_preemptions(md)
        w.bind_connector_metadata(md)
        w.start_load_kv(None)
        progress = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        progress.update(zip(cached.req_ids, cached.num_computed_tokens))
        for l, name in enumerate(LAYERS):
            w.wait_for_layer_load(name)
            for rid, n in so.num_scheduled_tokens.items():
                s = progress[rid]
                if s < len(PROMPT):
                    self._write(rid, s, min(len(PROMPT), s + n)) if l == 0 else None
            w.save_kv_layer(name, self.views[name], None)
        w.wait_for_save()
        sending, recving = w.get_finished(so.finished_req_ids)
        errors = w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()
        for rid, n in so.num_scheduled_tokens.items():
            self.computed_here[rid] = self.computed_here.get(rid, 0) + n
        req_ids = list(so.num_scheduled_tokens)
        out = ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[7] for _ in req_ids],
            kv_connector_output=KVConnectorOutput(finished_sending=sending,
                                                  finished_recving=recving,
                                                  invalid_block_ids=errors))
        for outputs in self.scheduler.update_from_output(so, out).values():
            for o in outputs.outputs:
                if o.finish_reason is not None:
                    self.finished[o.request_id] = o.kv_transfer_params
        return so

    def busy(self):
        s = self.scheduler
        return s.has_unfinished_requests() or s.connector.has_pending_push_work() or \
            bool(getattr(s, "finished_recving_kv_req_ids", None))

    def free_blocks(self):
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def shutdown(self):
        self.worker.shutdown()
        self.scheduler.shutdown()


def _value(layer, t):
    g = torch.Generator().manual_seed(layer * 100003 + t)
    return torch.randint(-30000, 30000, (HEADS, 2 * HEAD), dtype=torch.int16, generator=g)


def _request(rid, max_tokens, params, hashed=False):
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request
    hasher = None
    if hashed:  # as EngineCore does: sha256 block hashes, NONE_HASH from a fixed seed
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        fn = get_hash_fn_by_name("sha256")
        init_none_hash(fn)
        hasher = get_request_block_hasher(BLOCK, fn)
    extra = {"kv_transfer_params": params} if params is not None else None
    sp = SamplingParams(max_tokens=max_tokens, extra_args=extra)
    return Request(request_id=rid, prompt_token_ids=list(PROMPT), sampling_params=sp,
                   pooling_params=None, arrival_time=time.time(), block_hasher=hasher)


def drive(engines, until, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not until():
        for e in engines:
            e.step()
        assert time.monotonic() < deadline, "timed out"


def _secret(tmp_path) -> str:
    path = tmp_path / "peer.secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32))
    return str(path)


def _wants_held(daemon) -> int:
    with kvd.Connector(daemon=daemon, instance="probe") as probe:
        return int(probe.status().get("wants_held", 0))


@pytest.mark.parametrize("mode,hybrid,decode_first", [
    ("push", False, False), ("pull", False, False), ("push", True, False),
    ("push", False, True), ("pull", True, True)])
def test_pd_through_vllm_schedulers(tmp_path, mode, hybrid, decode_first):
    """decode_first: the decode engine steps alone until its Want waits in the prefill kvd,
    before the prefill's workers finished the request there with the scheduler's token."""
    secret = _secret(tmp_path)
    with kvd.Daemon(name="p", transport="local", auth_secret_file=secret) as pd, \
            kvd.Daemon(name="d", transport="local", auth_secret_file=secret) as dd:
        kv.register_embedded_daemon("p", pd)
        kv.register_embedded_daemon("d", dd)
        prefill = Engine(tmp_path, "prefill", "kv_producer",
                         {"kvd_embedded": "p", "mode": mode}, hybrid)
        decode = Engine(tmp_path, "decode", "kv_consumer", {"kvd_embedded": "d", "mode": mode},
                        hybrid)
        try:
            p_free, d_free = prefill.free_blocks(), decode.free_blocks()
            prefill.scheduler.add_request(_request("r1", 1, {"do_remote_decode": True}))
            drive([prefill], lambda: "r1" in prefill.finished)
            params = prefill.finished["r1"]
            assert params["do_remote_prefill"] and params["remote_request_id"].startswith("r1")
            assert len(params["remote_block_ids"]) == (2 if hybrid else 1)
            assert len(params["kvd_transfer_token"]) == 32
            decode.scheduler.add_request(_request("d1", 3, dict(params)))
            if decode_first:
                drive([decode], lambda: _wants_held(pd) == (2 if hybrid else 1))
            loaded = []

            def check():
                rid = "d1"
                if rid in decode.blocks and not loaded and \
                        decode.scheduler.requests.get(rid) is not None and \
                        decode.scheduler.requests[rid].num_computed_tokens >= len(PROMPT):
                    for l, name in enumerate(LAYERS):
                        ids = decode.ids(rid, name)
                        v = decode.views[name].view(torch.int16)
                        for t in range(len(PROMPT)):
                            assert torch.equal(v[ids[t // BLOCK], :, t % BLOCK], _value(l, t)), \
                                f"layer {l} token {t} differs"
                    loaded.append(rid)
                return not prefill.busy() and not decode.busy()
            drive([prefill, decode], check)
            assert loaded == ["d1"]
            # The decode engine computed the last prompt token and 2 more, kvd brought the rest.
            assert decode.computed_here["d1"] == 3, decode.computed_here
            assert decode.worker.stats["loads"] == 1
            assert decode.worker.stats["load_failures"] == 0
            assert prefill.worker.stats["sends"] == 1
            assert "d1" in decode.finished
            assert prefill.free_blocks() == p_free and decode.free_blocks() == d_free
        finally:
            prefill.shutdown()
            decode.shutdown()
            kv.register_embedded_daemon("p", None)
            kv.register_embedded_daemon("d", None)


def test_offload_hit_after_engine_restart(tmp_path):
    """kv_both with offload: the first engine's finished request is stored in kvd's pool under
    vLLM's sha256 block hashes; a new engine on the same kvd gets a synchronous hit of 32
    tokens from get_num_new_matched_tokens, loads them layer by layer and computes the rest."""
    with kvd.Daemon(name="node", transport="local", offload_bytes=8 << 20) as node:
        kv.register_embedded_daemon("node", node)
        extra = {"kvd_embedded": "node", "offload": True}
        first = Engine(tmp_path, "first", "kv_both", extra)
        try:
            free = first.free_blocks()
            first.scheduler.add_request(_request("a", 1, None, hashed=True))
            drive([first], lambda: "a" in first.finished and not first.busy())
            assert first.worker.stats["stores"] == 1
            assert first.free_blocks() == free
        finally:
            first.shutdown()
        second = Engine(tmp_path, "second", "kv_both", extra)
        try:
            free = second.free_blocks()
            second.scheduler.add_request(_request("b", 2, None, hashed=True))
            so = second.step()
            assert so.has_sync_kv_loads
            assert second.computed_here["b"] == len(PROMPT) - 32
            assert second.worker.stats["offload_loads"] == 1
            for l, name in enumerate(LAYERS):
                ids = second.ids("b", name)
                v = second.views[name].view(torch.int16)
                for t in range(len(PROMPT)):
                    assert torch.equal(v[ids[t // BLOCK], :, t % BLOCK], _value(l, t)), \
                        f"layer {l} token {t} differs"
            drive([second], lambda: "b" in second.finished and not second.busy())
            assert second.free_blocks() == free
        finally:
            second.shutdown()
            kv.register_embedded_daemon("node", None)


def test_connector_is_the_real_subclass():
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                   SupportsHMA)
    assert kv.HAVE_VLLM and issubclass(kv.KvdConnector, KVConnectorBase_V1)
    assert issubclass(kv.KvdConnector, SupportsHMA)
    assert os.environ.get("KVD_VLLM_STANDIN") in (None, "", "0")
