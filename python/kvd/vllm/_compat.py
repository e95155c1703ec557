"""vLLM, imported lazily and guardedly.

When vLLM is importable its KVConnectorBase_V1, SupportsHMA, KVConnectorRole and metadata base
classes are used; a vLLM older than MIN_VLLM is refused with a message naming both versions.
When it is not, minimal stand-ins with the same names and signatures are defined here, so
`import kvd.vllm` works (and the CPU call-sequence harness runs) without vLLM.

Set KVD_VLLM_STANDIN=1 to use the stand-ins even where vLLM is installed (tests)."""

from __future__ import annotations

import enum
import logging
import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

# The oldest vLLM this connector supports: the three-argument constructor (kv_cache_config),
# handle_preemptions(metadata), KVConnectorOutput.failed_recving and the 2026 layout RPC are all
# there; about six months before 0.33.0. Older ones are refused.
MIN_VLLM = (0, 27, 0)
TESTED_VLLM = "0.33.0"

logger = logging.getLogger("kvd.vllm")


def _parse_version(text: str) -> tuple:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not m:
        return ()
    return tuple(int(x or 0) for x in m.groups())


def check_version(text: str) -> None:
    """Raises RuntimeError for a vLLM older than MIN_VLLM. Development versions ("0.0.x", "dev")
    pass."""
    v = _parse_version(text)
    if not v or v[:2] == (0, 0):
        return
    if v < MIN_VLLM:
        raise RuntimeError(
            f"kvd.vllm.KvdConnector needs vLLM >= {'.'.join(map(str, MIN_VLLM))} (tested with "
            f"{TESTED_VLLM}); this is vLLM {text}. Upgrade vLLM, or use an older kvd release.")


def _import_vllm():
    if os.environ.get("KVD_VLLM_STANDIN", "").lower() in ("1", "true", "yes"):
        return None
    try:
        import vllm  # noqa: F401
        from vllm.distributed.kv_transfer.kv_connector.v1 import base
    except ImportError:
        return None
    version = getattr(vllm, "__version__", "")
    check_version(version)
    return base, version


_real = _import_vllm()

if _real is not None:
    _base, VLLM_VERSION = _real
    HAVE_VLLM = True
    KVConnectorBase_V1 = _base.KVConnectorBase_V1
    KVConnectorRole = _base.KVConnectorRole
    KVConnectorMetadata = _base.KVConnectorMetadata
    KVConnectorHandshakeMetadata = _base.KVConnectorHandshakeMetadata
    SupportsHMA = getattr(_base, "SupportsHMA", None)
    KVConnectorTransferResults = getattr(_base, "KVConnectorTransferResults", None)
    if SupportsHMA is None:  # pre-HMA vLLM: a harmless mixin with the same name
        class SupportsHMA(ABC):  # type: ignore[no-redef]
            pass
else:
    HAVE_VLLM = False
    VLLM_VERSION = None

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata(ABC):  # type: ignore[no-redef]  # noqa: B024
        pass

    class KVConnectorHandshakeMetadata(ABC):  # type: ignore[no-redef]  # noqa: B024
        pass

    @dataclass
    class KVConnectorTransferResults:  # type: ignore[no-redef]
        finished_sending: set = field(default_factory=set)
        finished_recving: set = field(default_factory=set)
        failed_recving: set = field(default_factory=set)

    class SupportsHMA(ABC):  # type: ignore[no-redef]
        @abstractmethod
        def request_finished_all_groups(self, request, block_ids):
            raise NotImplementedError

    class KVConnectorBase_V1(ABC):  # type: ignore[no-redef]
        """The stand-in: vLLM 0.33's constructor and metadata binding, nothing else."""

        def __init__(self, vllm_config, role, kv_cache_config):
            if getattr(vllm_config, "kv_transfer_config", None) is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._kv_cache_manager = None
            self._role = role

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self):
            return self._connector_metadata is not None

        def bind_kv_cache_manager(self, kv_cache_manager):
            self._kv_cache_manager = kv_cache_manager


try:
    if not HAVE_VLLM:
        raise ImportError
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
except ImportError:
    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        data: dict = field(default_factory=dict)


@dataclass
class KvdStats(KVConnectorStats):
    """Counters of one worker for one logging interval (summed across workers)."""

    def reset(self):
        self.data = {}

    def aggregate(self, other):
        for k, v in (getattr(other, "data", None) or {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self):
        return dict(self.data)

    def is_empty(self):
        return not any(self.data.values())


def base_has(name: str) -> bool:
    """Whether the installed base class defines `name` (hooks come and go between releases)."""
    return hasattr(KVConnectorBase_V1, name)


__all__ = ["HAVE_VLLM", "VLLM_VERSION", "MIN_VLLM", "TESTED_VLLM", "KVConnectorBase_V1",
           "KVConnectorRole", "KVConnectorMetadata", "KVConnectorHandshakeMetadata",
           "KVConnectorTransferResults", "KvdStats", "SupportsHMA", "check_version",
           "base_has", "logger"]
