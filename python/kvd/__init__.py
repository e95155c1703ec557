"""kvd: the KV-cache transfer daemon's connector from Python.

ctypes bindings over libkvconnector.so's C API (no compilation against Python or torch) and
the layout model that turns an engine's KV-cache tensors into kvd regions. Importing the
package loads neither torch nor the library; the library is loaded on first use (see
kvd._lib.candidate_paths for where it is looked for)."""

from .describe import KvCacheRegion, describe_kv_caches
from .errors import (AbortedError, AlreadyExistsError, IncompatibleError, InternalError,
                     InvalidArgumentError, IoError, KvdError, LibraryNotFoundError,
                     NotFoundError, OutOfRangeError, ResourceExhaustedError, TimeoutError,
                     UnavailableError, UnsupportedError)
from .layout import VLLM_ORDERS, KvLayout
from .connector import (ClosedError, Connector, Daemon, OffloadOp, TransferParams, allocate_host_kv_cache,
                        library_path, version)

__all__ = [
    "AbortedError", "AlreadyExistsError", "ClosedError", "Connector", "Daemon", "IncompatibleError",
    "InternalError", "InvalidArgumentError", "IoError", "KvCacheRegion", "KvLayout", "KvdError",
    "LibraryNotFoundError", "NotFoundError", "OffloadOp", "OutOfRangeError",
    "ResourceExhaustedError", "TimeoutError", "TransferParams", "UnavailableError",
    "UnsupportedError", "VLLM_ORDERS", "allocate_host_kv_cache", "describe_kv_caches",
    "library_path", "version",
]
