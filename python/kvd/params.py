"""TransferParams: what the decode side needs to load a request (kv_transfer_params)."""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass, field

from . import _lib
from .errors import InvalidArgumentError

_MODES = {"push": _lib.MODE_PUSH, "pull": _lib.MODE_PULL}


def _packer():
    """A struct.Struct writing a kv_transfer_params in one call (start_loads' hot path), its
    padding taken from the ctypes declaration."""
    S = _lib.KvTransferParamsStruct
    fmt, at = "=", 0
    for name, kind in S._fields_:
        off, size = getattr(S, name).offset, ctypes.sizeof(kind)
        fmt += "x" * (off - at)
        fmt += {"struct_size": "Q", "tokens": "q", "mode": "i"}.get(name, f"{size}s")
        at = off + size
    fmt += "x" * (ctypes.sizeof(S) - at)
    packer = struct.Struct(fmt)
    assert packer.size == ctypes.sizeof(S)
    return packer


PARAMS_PACKER = _packer()
PARAMS_SIZE = PARAMS_PACKER.size


def _text(value, what, limit):
    if not isinstance(value, str):
        raise InvalidArgumentError(f"TransferParams.{what} must be a str, got {value!r}")
    data = value.encode()
    if len(data) > limit:
        raise InvalidArgumentError(f"TransferParams.{what} is {len(data)} bytes, at most {limit}")
    return data


@dataclass
class TransferParams:
    """Returned by Connector.request_finished on the prefill side; handed to the decode side
    (as vLLM's kv_transfer_params), which sets `tokens` (the prompt tokens to load) and `mode`
    ("push": the source sends layer by layer as it saves them; "pull": the decode side reads the
    whole request once the prefill finished). transfer_token is the source's capability for the
    request: a secret, keep it within the deployment."""

    peer_name: str = ""
    peer_address: str = ""
    request_id: str = ""
    transfer_token: str = ""
    tokens: int = 0
    mode: str = "push"
    remote_block_ids: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-safe: str, int and a list of int."""
        return {"peer_name": self.peer_name, "peer_address": self.peer_address,
                "request_id": self.request_id, "transfer_token": self.transfer_token,
                "tokens": int(self.tokens), "mode": self.mode,
                "remote_block_ids": [int(b) for b in self.remote_block_ids]}

    @classmethod
    def from_dict(cls, d: dict) -> "TransferParams":
        if not isinstance(d, dict):
            raise InvalidArgumentError(f"TransferParams.from_dict needs a dict, got {d!r}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise InvalidArgumentError(f"TransferParams.from_dict: unknown keys "
                                       f"{sorted(unknown)} (known: {sorted(known)})")
        p = cls(**d)
        p.to_c()  # validates
        return p

    def pack_into(self, buf, offset, tokens=None, mode=None) -> int:
        """Writes the C struct into buf at offset (what to_c builds, without ctypes); returns
        the tokens it wrote."""
        tokens = self.tokens if tokens is None else tokens
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise InvalidArgumentError(f"TransferParams.tokens must be an int >= 0, got {tokens!r}")
        m = _MODES.get(self.mode if mode is None else mode)
        if m is None:
            raise InvalidArgumentError(f"TransferParams.mode must be 'push' or 'pull', "
                                       f"got {self.mode if mode is None else mode!r}")
        PARAMS_PACKER.pack_into(
            buf, offset, PARAMS_SIZE, _text(self.peer_name, "peer_name", _lib.MAX_ID_BYTES),
            _text(self.peer_address, "peer_address", _lib.MAX_ID_BYTES),
            _text(self.request_id, "request_id", _lib.MAX_ID_BYTES),
            _text(self.transfer_token, "transfer_token", 64), tokens, m)
        return tokens

    def to_c(self, tokens=None, mode=None) -> _lib.KvTransferParamsStruct:
        s = _lib.KvTransferParamsStruct()
        s.struct_size = ctypes.sizeof(s)
        s.peer_name = _text(self.peer_name, "peer_name", _lib.MAX_ID_BYTES)
        s.peer_address = _text(self.peer_address, "peer_address", _lib.MAX_ID_BYTES)
        s.request_id = _text(self.request_id, "request_id", _lib.MAX_ID_BYTES)
        s.transfer_token = _text(self.transfer_token, "transfer_token", 64)
        tokens = self.tokens if tokens is None else tokens
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise InvalidArgumentError(f"TransferParams.tokens must be an int >= 0, got {tokens!r}")
        s.tokens = tokens
        mode = self.mode if mode is None else mode
        if mode not in _MODES:
            raise InvalidArgumentError(f"TransferParams.mode must be 'push' or 'pull', "
                                       f"got {mode!r}")
        s.mode = _MODES[mode]
        return s

    @classmethod
    def from_c(cls, s: _lib.KvTransferParamsStruct, remote_block_ids=()) -> "TransferParams":
        return cls(peer_name=s.peer_name.decode(), peer_address=s.peer_address.decode(),
                   request_id=s.request_id.decode(), transfer_token=s.transfer_token.decode(),
                   tokens=int(s.tokens), mode="pull" if s.mode == _lib.MODE_PULL else "push",
                   remote_block_ids=list(remote_block_ids))
