"""Minimal stand-ins for vLLM 0.33's types (field names as in its source) and a mini engine that
drives KvdConnector exactly in vLLM's order:

scheduler step: add_request -> on_new_request; schedule(): get_num_new_matched_tokens ->
update_state_after_alloc (async loads wait in WAITING_FOR_REMOTE_KVS) -> build_connector_meta;
worker forward per rank: handle_preemptions -> bind_connector_metadata -> start_load_kv -> per
layer wait_for_layer_load / (model writes K/V) / save_kv_layer -> wait_for_save -> get_finished ->
get_block_ids_with_load_errors -> clear_connector_metadata; update_from_output:
update_connector_output -> invalid blocks (kv_load_failure_policy "fail") -> finished_recving ->
finished_sending frees blocks -> request_finished_all_groups for requests that finished.

The "model" writes, for token t of a request, K/V bytes that are a function of (prompt, layer,
global head, t) only, so a decode engine's loaded cache can be checked against what the prefill
engine computed, element by element, with torch indexing."""

from __future__ import annotations

import enum
import hashlib
import importlib
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

import kvd
from kvd import testing as kt


# ---- vLLM's types ----

@dataclass
class KVTransferConfig:
    kv_connector: str = None
    kv_connector_module_path: str = None
    kv_role: str = None
    engine_id: str = "engine"
    kv_connector_extra_config: dict = field(default_factory=dict)
    kv_load_failure_policy: str = "fail"


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    rank: int = 0


@dataclass
class VllmConfig:
    kv_transfer_config: KVTransferConfig
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)


@dataclass
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype = torch.float16
    sliding_window: int = None


class SlidingWindowSpec(FullAttentionSpec):
    pass


class MLAAttentionSpec(FullAttentionSpec):
    pass


@dataclass
class KVCacheTensor:
    size: int
    layers: list
    layer_stride: int
    block_stride: int
    offset: int = 0


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: object
    enable_kv_transfer: bool = True


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list
    kv_cache_layout: str = "LBNHC"


class RequestStatus(enum.Enum):
    WAITING = 1
    WAITING_FOR_REMOTE_KVS = 2
    RUNNING = 3
    FINISHED_STOPPED = 4
    FINISHED_LENGTH_CAPPED = 5
    FINISHED_ABORTED = 6
    FINISHED_ERROR = 7


class Request:
    def __init__(self, request_id, prompt_token_ids, max_tokens=1, kv_transfer_params=None,
                 hash_block_size=16):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.max_tokens = max_tokens
        self.kv_transfer_params = kv_transfer_params
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.output_token_ids = []
        h, self.block_hashes = b"", []
        for i in range(self.num_prompt_tokens // hash_block_size):
            chunk = self.prompt_token_ids[i * hash_block_size:(i + 1) * hash_block_size]
            h = hashlib.sha256(h + repr(chunk).encode()).digest()
            self.block_hashes.append(h)

    def is_finished(self):
        return self.status.name.startswith("FINISHED")

    @property
    def num_tokens(self):
        return self.num_prompt_tokens + len(self.output_token_ids)


class KVCacheBlocks:
    def __init__(self, blocks):
        self.blocks = tuple(list(b) for b in blocks)

    def get_block_ids(self, allow_none=False):
        return tuple(list(b) for b in self.blocks)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    block_ids: tuple
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: list = field(default_factory=list)
    resumed_req_ids: set = field(default_factory=set)
    new_block_ids: list = field(default_factory=list)
    num_computed_tokens: list = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    finished_req_ids: set
    preempted_req_ids: set = None
    kv_connector_metadata: object = None
    has_sync_kv_loads: bool = False


@dataclass
class KVConnectorOutput:
    finished_sending: set = None
    finished_recving: set = None
    invalid_block_ids: set = field(default_factory=set)
    failed_recving: set = field(default_factory=set)


# ---- the "model" ----

_EXPECTED = {}


def expected_kv(prompt, layer, tokens, total_heads, c_elems):
    """int16 (tokens, total_heads, c_elems): what every engine computes for the first `tokens`
    tokens of `prompt` in `layer` (a function of the prompt and the layer only)."""
    key = (tuple(prompt), layer, total_heads, c_elems)
    if key not in _EXPECTED:
        seed = int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:7], "little")
        g = torch.Generator().manual_seed(seed)
        _EXPECTED[key] = torch.randint(-30000, 30000, (len(prompt), total_heads, c_elems),
                                       dtype=torch.int16, generator=g)
    return _EXPECTED[key][:tokens]


@dataclass
class Group:
    """One KV-cache group: its spec and layer names; kind "full", "swa" or "mla"."""
    kind: str = "full"
    layers: int = 2
    heads: int = 4   # total KV heads (MLA: 1)
    head_dim: int = 8
    block_size: int = 16
    order: str = "LBNHC"
    window: int = 32

    def names(self, g):
        return [f"model.g{g}.layers.{l}.attn" for l in range(self.layers)]

    def c_elems(self):
        return self.head_dim if self.kind == "mla" else 2 * self.head_dim

    def spec(self, tp):
        cls = {"full": FullAttentionSpec, "swa": SlidingWindowSpec, "mla": MLAAttentionSpec}
        heads = 1 if self.kind == "mla" else self.heads // tp
        return cls[self.kind](self.block_size, heads, self.head_dim,
                              sliding_window=self.window if self.kind == "swa" else None)


def _raw(nbytes, device):
    """A cache's raw bytes: kvd's shared host memory, or a CUDA buffer on `device`."""
    if device is None:
        return kvd.allocate_host_kv_cache(nbytes)
    return torch.zeros(nbytes, dtype=torch.uint8, device=device)


def build_caches(groups, tp, blocks, device=None):
    """Per rank of tp: (raws, views dict, KVCacheConfig), CPU caches in kvd's shared memory (or,
    with `device`, CUDA caches there)."""
    out = []
    for _ in range(tp):
        raws, views, tensors, specs = [], {}, [], []
        for g, grp in enumerate(groups):
            names = grp.names(g)
            if grp.kind == "mla":
                raw = _raw(grp.layers * blocks * grp.block_size * grp.head_dim * 2, device)
                v = kt.mla_kv_caches(raw, grp.layers, blocks, grp.block_size, grp.head_dim,
                                     prefix="tmp")
                v = {n: v[f"tmp.{l}"] for l, n in enumerate(names)}
            else:
                raw = _raw(kt.kv_nbytes(grp.order, grp.layers, blocks, grp.heads // tp,
                                        grp.block_size, grp.head_dim), device)
                v, cfg = kt.vllm_kv_caches(raw, grp.order, grp.layers, blocks, grp.heads // tp,
                                           grp.block_size, grp.head_dim, prefix="tmp")
                v = {n: v[f"tmp.{l}"] for l, n in enumerate(names)}
                t = cfg.kv_cache_tensors[0]
                tensors.append(KVCacheTensor(t.size, names, t.layer_stride, t.block_stride,
                                             t.offset))
            raws.append(raw)
            views.update(v)
            specs.append(KVCacheGroupSpec(names, grp.spec(tp)))
        out.append((raws, views, KVCacheConfig(blocks, tensors, specs, groups[0].order)))
    return out


# ---- the mini engine ----

def load_connector_class(ktc):
    module = importlib.import_module(ktc.kv_connector_module_path)
    return getattr(module, ktc.kv_connector)


class Engine:
    """A vLLM-like engine: one scheduler-role connector, `tp` worker-role connectors (one per
    rank, run in turn), a block pool (block 0 is the null block) and CPU caches."""

    def __init__(self, name, role, extra, groups, tp=1, blocks=40, policy="fail", device=None):
        from kvd.vllm._compat import KVConnectorRole
        self.name, self.groups, self.tp, self.num_blocks = name, groups, tp, blocks
        ktc = KVTransferConfig("KvdConnector", "kvd.vllm", role, name, dict(extra), policy)
        cls = load_connector_class(ktc)
        self.ranks = build_caches(groups, tp, blocks, device)
        self.workers, handshake = [], {}
        for r in range(tp):
            w = cls(VllmConfig(ktc, ParallelConfig(tp, r)), KVConnectorRole.WORKER,
                    self.ranks[r][2])
            w.register_kv_caches(self.ranks[r][1])
            handshake[r] = w.get_handshake_metadata()
            self.workers.append(w)
        self.connector = cls(VllmConfig(ktc, ParallelConfig(tp, 0)), KVConnectorRole.SCHEDULER,
                             self.ranks[0][2])
        self.connector.set_xfer_handshake_metadata(handshake)
        self.free = list(range(1, blocks))
        self.requests, self.waiting, self.running = {}, [], []
        self.blocks = {}         # req -> [list per group]
        self.held = set()        # finished, blocks held for the connector
        self.ready = set()       # finished_recving
        self.finished_prev = set()
        self.counts = {"sending": {}, "recving": {}}
        self.outputs = {}        # req -> kv_transfer_params returned by request_finished
        self.errors = {}         # req -> finish status
        self.steps = 0

    # -- scheduler ---------------------------------------------------------------------------------

    def add_request(self, req):
        self.requests[req.request_id] = req
        self.connector.on_new_request(req)
        self.waiting.append(req)

    def _alloc(self, req, tokens):
        have = self.blocks.setdefault(req.request_id, [[] for _ in self.groups])
        new = []
        for g, grp in enumerate(self.groups):
            need = -(-tokens // grp.block_size) - len(have[g])
            assert need <= len(self.free), f"{self.name}: out of blocks"
            add = [self.free.pop(0) for _ in range(max(0, need))]
            have[g].extend(add)
            new.append(add)
        return new

    def _free(self, rid):
        for ids in self.blocks.pop(rid, []):
            self.free.extend(b for b in ids if b != 0)

    def abort(self, rid):
        req = self.requests[rid]
        req.status = RequestStatus.FINISHED_ABORTED
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        self._finish(req)

    def _finish(self, req):
        ids = self.blocks.get(req.request_id, [[] for _ in self.groups])
        delay, params = self.connector.request_finished_all_groups(req, tuple(ids))
        self.outputs[req.request_id] = params
        self.finished_prev.add(req.request_id)
        if delay:
            self.held.add(req.request_id)
        else:
            self._free(req.request_id)

    def schedule(self):
        new, cached, scheduled = [], CachedRequestData(), {}
        for req in list(self.running):
            new_ids = self._alloc(req, req.num_tokens)
            cached.req_ids.append(req.request_id)
            cached.new_block_ids.append(tuple(new_ids))
            cached.num_computed_tokens.append(req.num_computed_tokens)
            scheduled[req.request_id] = req.num_tokens - req.num_computed_tokens
        sync = False
        for req in list(self.waiting):
            rid = req.request_id
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if rid not in self.ready:
                    continue
                self.ready.discard(rid)
                # vLLM recomputes the last prompt token of a full hit
                req.num_computed_tokens = min(req.num_computed_tokens, req.num_prompt_tokens - 1)
                req.status = RequestStatus.WAITING
            else:
                ext, load_async = self.connector.get_num_new_matched_tokens(req, 0)
                if ext is None:
                    continue
                if load_async:
                    self._alloc(req, ext)
                    self.connector.update_state_after_alloc(
                        req, KVCacheBlocks(self.blocks[rid]), ext)
                    req.num_computed_tokens = ext
                    req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    continue
                self._alloc(req, req.num_prompt_tokens)
                self.connector.update_state_after_alloc(req, KVCacheBlocks(self.blocks[rid]),
                                                        ext)
                req.num_computed_tokens = ext
                sync = sync or ext > 0
            self._alloc(req, req.num_prompt_tokens)
            self.waiting.remove(req)
            self.running.append(req)
            req.status = RequestStatus.RUNNING
            new.append(NewRequestData(rid, req.prompt_token_ids,
                                      tuple(list(b) for b in self.blocks[rid]),
                                      req.num_computed_tokens))
            scheduled[rid] = req.num_prompt_tokens - req.num_computed_tokens
        so = SchedulerOutput(new, cached, scheduled, sum(scheduled.values()),
                             self.finished_prev, set(), has_sync_kv_loads=sync)
        self.finished_prev = set()
        so.kv_connector_metadata = self.connector.build_connector_meta(so)
        return so

    # -- workers -----------------------------------------------------------------------------------

    def _write(self, rank, req, start, end, g, l, name):
        grp = self.groups[g]
        views = self.ranks[rank][1]
        ids = self.blocks[req.request_id][g]
        t = torch.arange(start, end)
        b = torch.as_tensor(ids, dtype=torch.int64)[t // grp.block_size]
        n = t % grp.block_size
        want = expected_kv(req.prompt_token_ids, (g, l), end, grp.heads if grp.kind != "mla"
                           else 1, grp.c_elems())[start:end]
        v = views[name].view(torch.int16)
        b, n, want = b.to(v.device), n.to(v.device), want.to(v.device)
        if grp.kind == "mla":
            v[b, n] = want[:, 0]
        else:
            h = grp.heads // self.tp
            v[b, :, n] = want[:, rank * h:(rank + 1) * h]

    def forward(self, so):
        outs = []
        for r, w in enumerate(self.workers):
            md = so.kv_connector_metadata
            w.handle_preemptions(md)
            w.bind_connector_metadata(md)
            w.start_load_kv(SimpleNamespace())
            if so.total_num_scheduled_tokens:
                reqs = [(self.requests[rid], n) for rid, n in so.num_scheduled_tokens.items()]
                for g, grp in enumerate(self.groups):
                    for l, name in enumerate(grp.names(g)):
                        w.wait_for_layer_load(name)
                        for req, n in reqs:
                            s = req.num_computed_tokens
                            if s < req.num_prompt_tokens:
                                self._write(r, req, s, min(s + n, req.num_prompt_tokens), g, l,
                                            name)
                        w.save_kv_layer(name, self.ranks[r][1][name], None)
            w.wait_for_save()
            sending, recving = w.get_finished(so.finished_req_ids)
            errors = w.get_block_ids_with_load_errors()
            w.clear_connector_metadata()
            outs.append((sending or set(), recving or set(), errors))
        return outs

    # -- update_from_output ------------------------------------------------------------------------

    def update(self, so, outs):
        done = {"sending": set(), "recving": set()}
        for kind, i in (("sending", 0), ("recving", 1)):
            for o in outs:
                for rid in o[i]:
                    c = self.counts[kind][rid] = self.counts[kind].get(rid, 0) + 1
                    if c == self.tp:
                        done[kind].add(rid)
                        del self.counts[kind][rid]
        invalid = set().union(*(o[2] for o in outs))
        self.connector.update_connector_output(
            KVConnectorOutput(done["sending"] or None, done["recving"] or None, invalid))
        for rid in done["recving"]:
            req = self.requests[rid]
            if any(b in invalid for ids in self.blocks.get(rid, []) for b in ids):
                req.status = RequestStatus.FINISHED_ERROR  # kv_load_failure_policy "fail"
                self.errors[rid] = "load failed"
                self.waiting.remove(req)
                self._finish(req)
            elif req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.ready.add(rid)
        for rid in done["sending"]:
            if rid in self.held:
                self.held.discard(rid)
                self._free(rid)
        for rid, n in so.num_scheduled_tokens.items():
            req = self.requests[rid]
            if req.is_finished():
                continue
            req.num_computed_tokens += n
            req.output_token_ids.append(7)
            if len(req.output_token_ids) >= req.max_tokens:
                req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                self.running.remove(req)
                self._finish(req)

    def step(self):
        so = self.schedule()
        self.update(so, self.forward(so))
        self.steps += 1
        return so

    def busy(self):
        return bool(self.waiting or self.running or self.held or
                    self.connector.has_pending_push_work())

    def assert_empty(self):
        """No request left and every block back in the pool (vLLM's assert_scheduler_empty)."""
        assert not (self.waiting or self.running or self.held), (self.waiting, self.running,
                                                                 self.held)
        assert sorted(self.free) == list(range(1, self.num_blocks)), \
            f"{self.name}: {self.num_blocks - 1 - len(self.free)} blocks not freed"

    def shutdown(self):
        for w in self.workers:
            w.shutdown()
        self.connector.shutdown()


def check_loaded(engine, req, tokens, skips=None):
    """Every element of the first `tokens` tokens of `req` (from skips[g] on in group g) in
    every layer, head and rank of `engine` equals what the model computes (torch indexing)."""
    for r in range(engine.tp):
        views = engine.ranks[r][1]
        for g, grp in enumerate(engine.groups):
            ids = engine.blocks[req.request_id][g]
            t = torch.arange(skips[g] if skips else 0, tokens)
            b = torch.as_tensor(ids, dtype=torch.int64)[t // grp.block_size]
            n = t % grp.block_size
            for l, name in enumerate(grp.names(g)):
                want = expected_kv(req.prompt_token_ids, (g, l), tokens,
                                   grp.heads if grp.kind != "mla" else 1, grp.c_elems())[t]
                v = views[name].view(torch.int16)
                if grp.kind == "mla":
                    got = v[b, n].unsqueeze(1)
                    exp = want
                else:
                    h = grp.heads // engine.tp
                    got = v[b, :, n]
                    exp = want[:, r * h:(r + 1) * h]
                assert torch.equal(got.cpu(), exp), \
                    f"{engine.name} rank {r} group {g} layer {l}: loaded K/V differ"
