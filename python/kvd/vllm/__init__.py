"""kvd's vLLM connector: `kv_connector_module_path: "kvd.vllm"`, `kv_connector: "KvdConnector"`.

Imports vLLM lazily and guardedly (kvd.vllm._compat): with vLLM installed KvdConnector subclasses
its KVConnectorBase_V1 and SupportsHMA (vLLM older than MIN_VLLM is refused); without it the
module still imports, over minimal stand-ins, so the CPU call-sequence harness runs."""

from ._compat import HAVE_VLLM, MIN_VLLM, TESTED_VLLM, VLLM_VERSION
from .config import ConfigError, EXTRA_KEYS, PROTOCOL_VERSION, parse_config
from .connector import KvdConnector, register_embedded_daemon
from .metadata import KvdConnectorMetadata, KvdHandshakeMetadata, LoadSpec, OffloadSpec

__all__ = ["ConfigError", "EXTRA_KEYS", "HAVE_VLLM", "KvdConnector", "KvdConnectorMetadata",
           "KvdHandshakeMetadata", "LoadSpec", "MIN_VLLM", "OffloadSpec", "PROTOCOL_VERSION",
           "TESTED_VLLM", "VLLM_VERSION", "parse_config", "register_embedded_daemon"]
