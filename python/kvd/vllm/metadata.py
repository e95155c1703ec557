"""What KvdConnector's scheduler side tells its workers each step, and what the workers tell
the scheduler side once (handshake). Plain dataclasses of str/int/list/dict: picklable and
msgspec-friendly, as vLLM's executors need."""

from __future__ import annotations

from dataclasses import dataclass, field

from ._compat import KVConnectorHandshakeMetadata, KVConnectorMetadata


@dataclass
class LoadSpec:
    """Decode side: load `req_id` from the prefill side described by `params` (the request's
    kv_transfer_params) into `block_ids` (one list per transfer group), `tokens` prompt
    tokens."""
    req_id: str
    params: dict
    block_ids: list
    tokens: int


@dataclass
class OffloadSpec:
    """A store (finished request) or a load (prefix hit) of whole blocks through kvd's pool:
    keys[i] names block_ids[i] of transfer group `group`."""
    req_id: str
    group: int
    block_hashes: list
    block_ids: list


@dataclass
class KvdConnectorMetadata(KVConnectorMetadata):
    # prefill: requests whose prompt is complete after this step -> block ids per transfer group
    # (save_kv_layer hands each layer of them to kvd)
    saves: dict = field(default_factory=dict)
    # prefill: requests finished and handed off -> the transfer token the scheduler side put in
    # their kv_transfer_params (kvd_transfer_token): finish them in kvd with it (their blocks
    # stay held until kvd reports them sent)
    sends: dict = field(default_factory=dict)
    # prefill: aborted requests kvd may hold state for (dropped, nothing is sent)
    drops: list = field(default_factory=list)
    # decode: loads to start (asynchronous; reported through get_finished)
    loads: list = field(default_factory=list)
    # decode: requests aborted while their load is in flight: report them in finished_sending
    # once kvd no longer writes into their blocks
    abort_loads: list = field(default_factory=list)
    offload_stores: list = field(default_factory=list)
    offload_loads: list = field(default_factory=list)  # synchronous, waited per layer
    preempted: list = field(default_factory=list)


@dataclass
class KvdHandshakeMetadata(KVConnectorHandshakeMetadata):
    """One worker's facts for the scheduler side: its kvd's name and address, and the layout
    of its first offloadable region (the scheduler side registers a one-block twin of it to
    look keys up in kvd's pool)."""
    tp_rank: int = 0
    peer_name: str = ""
    peer_address: str = ""
    offload_layout: dict | None = None
