"""Daemon (an embedded kvd core) and Connector (the engine side), over the C API."""

from __future__ import annotations

import ctypes
import json
import struct
import threading
import weakref
from ctypes import byref, c_size_t, c_void_p, sizeof

from . import _lib
from ._arrays import Int64Ids
from .describe import KvCacheRegion, describe_kv_caches
from .errors import InvalidArgumentError, KvdError, UnavailableError, RESOURCE_EXHAUSTED
from .host_memory import allocate_host_kv_cache, host_allocation_of  # noqa: F401 (re-export)
from .offload import OffloadOp, OffloadMixin
from .params import PARAMS_SIZE, TransferParams

# kv_load: request, params, block_ids (pointers) and count.
_LOAD_PACKER = struct.Struct("=QQQQ")
assert _LOAD_PACKER.size == sizeof(_lib.KvLoadStruct)


def version() -> str:
    """The loaded library's version, "MAJOR.MINOR.PATCH"."""
    return _lib.load().version


def library_path() -> str:
    return str(_lib.load().path)


def _cstr(value, what):
    if isinstance(value, str):
        value = value.encode()
    elif not isinstance(value, bytes):
        raise InvalidArgumentError(f"{what} must be a str, got {type(value).__name__}")
    return value


def _opt_cstr(value, what):
    return None if value is None else _cstr(value, what)


class ClosedError(UnavailableError):
    """A call on a Connector or Daemon after close()."""


class Daemon:
    """A kvd core inside this process (embedded mode): Connector(daemon=d) attaches to it, peers
    reach it at `address`. stop() (or the end of a with block) stops it once every connector
    opened on it is closed too."""

    def __init__(self, name: str = None, listen: str = "127.0.0.1:0", transport: str = "auto",
                 offload_bytes: int = 0, auth_secret_file: str = None,
                 insecure_peers: bool = False):
        lib = _lib.load()
        if isinstance(offload_bytes, bool) or not isinstance(offload_bytes, int) \
                or offload_bytes < 0:
            raise InvalidArgumentError(f"offload_bytes must be an int >= 0, got {offload_bytes!r}")
        opts = _lib.KvDaemonOptions(sizeof(_lib.KvDaemonOptions), _opt_cstr(name, "name"),
                                    _opt_cstr(listen, "listen"),
                                    _opt_cstr(transport, "transport"), offload_bytes,
                                    _opt_cstr(auth_secret_file, "auth_secret_file"),
                                    1 if insecure_peers else 0)
        handle, err = c_void_p(), _lib.KvErrorStruct()
        lib.check(lib.kv_daemon_start(byref(opts), byref(handle), byref(err)), err,
                  "starting the embedded kvd")
        self._lib, self._h, self.name = lib, handle.value, name or "kvd"
        self.address = lib.kv_daemon_address(self._h).decode()

    @property
    def handle(self) -> int:
        if self._h is None:
            raise ClosedError("the embedded kvd is stopped")
        return self._h

    def stop(self):
        h, self._h = self._h, None
        if h is not None:
            self._lib.kv_daemon_stop(h)

    close = stop

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            self.stop()

    def __repr__(self):
        return f"kvd.Daemon({self.name!r}, address={self.address!r})"


def _stream_handle(stream):
    if stream is None:
        return None
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
    if isinstance(handle, int):
        return handle
    raise InvalidArgumentError(f"stream: a {type(stream).__name__}; pass a torch.cuda.Stream, "
                               "a cudaStream_t as int, or None")


class Connector(OffloadMixin):
    """The engine side of kvd for one engine process and TP rank.

    Connector(socket="/run/kvd.sock", instance=..., tp_rank=0, tp_size=1, timeout=30.0) talks to
    a kvd process; Connector(daemon=d, ...) to an embedded one. Every blocking call ends after
    `timeout` seconds at the latest (TimeoutError). busy_poll=True spins instead of sleeping: the
    connection's reader on kvd's socket (a core), and each waiting call while it waits
    (microseconds per hand-off from kvd instead of a thread's wake-up; pair with kvd --busy-poll). Calls may come from any thread, but close()
    must not race another call on the same connector."""

    REMOTE_IDS_CAPACITY = 1 << 16
    # The most entries one start_loads or requests_finished call takes (kvd's bound).
    MAX_LOADS_PER_CALL = _lib.MAX_LOADS_PER_CALL
    MAX_FINISHES_PER_CALL = _lib.MAX_FINISHES_PER_CALL

    def __init__(self, socket: str = None, *, daemon: Daemon = None, instance: str = "engine",
                 tp_rank: int = 0, tp_size: int = 1, timeout: float = 30.0,
                 offload_namespace: str = None, busy_poll: bool = False):
        if (socket is None) == (daemon is None):
            raise InvalidArgumentError("Connector needs exactly one of socket= (a kvd's unix "
                                       "socket) and daemon= (a kvd.Daemon)")
        for what, v in (("tp_rank", tp_rank), ("tp_size", tp_size)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise InvalidArgumentError(f"{what} must be an int, got {v!r}")
        if not 0 <= tp_rank < tp_size:
            raise InvalidArgumentError(f"tp_rank {tp_rank} is outside [0, tp_size {tp_size})")
        try:
            timeout_ms = int(round(float(timeout) * 1000))
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"timeout must be seconds, got {timeout!r}") from None
        if not 0 < timeout_ms < 2 ** 31:
            raise InvalidArgumentError(f"timeout must be in (0, 2147483) seconds, got {timeout!r}")
        lib = self._lib = _lib.load()
        self._h = None
        opts = _lib.KvConnectorOptions(
            sizeof(_lib.KvConnectorOptions), _cstr(instance, "instance"), tp_rank, tp_size,
            timeout_ms,
            None if offload_namespace is None else _cstr(offload_namespace, "offload_namespace"),
            1 if busy_poll else 0)
        handle, err = c_void_p(), _lib.KvErrorStruct()
        if daemon is not None:
            if not isinstance(daemon, Daemon):
                raise InvalidArgumentError(f"daemon must be a kvd.Daemon, got {daemon!r}")
            rc = lib.kv_connector_open_embedded(daemon.handle, byref(opts), byref(handle),
                                                byref(err))
            where = f"embedded kvd {daemon.name}"
        else:
            rc = lib.kv_connector_open(_cstr(str(socket), "socket"), byref(opts), byref(handle),
                                       byref(err))
            where = f"kvd at {socket}"
        lib.check(rc, err, f"connecting to the {where}")
        self._h = handle.value
        self._daemon = daemon  # kept alive while the connector lives
        self.instance, self.tp_rank, self.tp_size, self.timeout = instance, tp_rank, tp_size, \
            timeout
        self.regions: list = []
        self.layer_index: dict = {}  # layer name -> layer index (save_layer / wait_layer)
        self._ops = weakref.WeakSet()
        self._remote_ids = None
        # The callback holds the lists, not the connector: no reference cycle keeps an unclosed
        # connector alive.
        finished = self._finished = ([], [])
        self._finished_lock = threading.Lock()

        def on_request(_ctx, request_id, sent):
            finished[0 if sent else 1].append(request_id.decode())
        self._on_request = _lib.REQUEST_CALLBACK(on_request)

    # ---- plumbing ------------------------------------------------------------------------------

    def _handle(self) -> int:
        h = self._h
        if h is None:
            raise ClosedError("the connector is closed")
        return h

    def _layer(self, layer) -> int:
        if isinstance(layer, str):
            try:
                return self.layer_index[layer]
            except KeyError:
                raise InvalidArgumentError(f"layer '{layer}' is not a registered layer") from None
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < 2 ** 31:
            raise InvalidArgumentError(f"layer must be an index >= 0 or a layer name, "
                                       f"got {layer!r}")
        return layer

    def close(self):
        """Frees the offload ops still open and closes the connection; loads still running are
        abandoned (kvd fails them). Idempotent."""
        h, self._h = self._h, None
        if h is None:
            return
        for op in list(self._ops):
            op.free()
        self._lib.kv_connector_close(h)
        self.regions = []

    @property
    def closed(self) -> bool:
        return self._h is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            self.close()

    # ---- registration --------------------------------------------------------------------------

    def register_kv_caches(self, caches, kv_cache_config=None, *, dims=None, layout=None,
                           total_heads=None, replicated=None) -> list:
        """Registers the engine's KV caches, once: describe_kv_caches(caches, ...) with this
        connector's TP rank and size, then one kvd region per described region (host tensors
        must be views of kvd.allocate_host_kv_cache memory; CUDA tensors register through CUDA
        IPC). Returns the regions (KvCacheRegion); `layer_index` maps each layer name to the
        layer index save_layer and wait_layer take (they also accept the name)."""
        h = self._handle()
        regions = describe_kv_caches(caches, kv_cache_config, dims=dims, layout=layout,
                                     tp_rank=self.tp_rank, tp_size=self.tp_size,
                                     total_heads=total_heads, replicated=replicated)
        return self._register(h, regions)

    def _register(self, h, regions: list) -> list:
        if self.regions:
            raise InvalidArgumentError("register_kv_caches: this connector registered its "
                                       "caches already (once per connector)")
        layers = {r.layout.layers for r in regions}
        if len(layers) > 1:
            raise InvalidArgumentError(
                "register_kv_caches: every region of an engine has the same layer count, these "
                "have " + ", ".join(f"{r.layout.layers} ({r.layer_names[0]})" for r in regions))
        memories = {r.memory for r in regions}
        if len(memories) > 1:
            raise InvalidArgumentError("register_kv_caches: host caches or CUDA caches, not both")
        descs = (_lib.KvCacheDescStruct * len(regions))()
        orders = []
        for d, r in zip(descs, regions):
            if r.memory == "host" and host_allocation_of(r.base, r.nbytes) is None:
                raise InvalidArgumentError(
                    f"kv cache '{r.layer_names[0]}': host memory at 0x{r.base:x} ({r.nbytes} "
                    "bytes) is not inside memory from kvd.allocate_host_kv_cache; kvd maps only "
                    "that shared memory: allocate the buffer with kvd.allocate_host_kv_cache("
                    "nbytes) and build the views on it (as_strided)")
            lay = r.layout
            orders.append(lay.order.encode())
            d.struct_size = sizeof(_lib.KvCacheDescStruct)
            d.layout = _lib.KvLayoutStruct(
                orders[-1], lay.layers, lay.blocks, lay.heads, lay.block_size,
                lay.content_bytes, (ctypes.c_int64 * 6)(*lay.strides), lay.tp_rank,
                lay.tp_size, lay.total_heads, int(lay.replicated), lay.region_bytes)
            d.memory = _lib.MEMORY_CUDA if r.memory == "cuda" else _lib.MEMORY_HOST
            d.device = r.device
            d.base = r.base
        bases = (c_void_p * len(regions))()
        err = _lib.KvErrorStruct()
        self._lib.check(self._lib.kv_register_kv_caches(h, descs, len(regions), bases,
                                                        byref(err)), err, "register_kv_caches")
        self.regions = list(regions)
        self.layer_index = {}
        for r in regions:
            for i, name in enumerate(r.layer_names):
                self.layer_index.setdefault(name, i)
        return self.regions

    # ---- prefill -------------------------------------------------------------------------------

    def save_layer(self, request: str, layer, block_ids, stream=None):
        """`layer` (index or name) of `request` is written in `block_ids`; kvd may send it now.
        Returns once kvd has the message. CUDA caches: records the layer's event on `stream`
        (torch.cuda.Stream, a cudaStream_t int, or None: the legacy default stream) first."""
        lib = self._lib
        ids = Int64Ids(block_ids)
        err = lib.err()
        rc = lib.kv_save_layer(self._handle(), _cstr(request, "request"), self._layer(layer),
                               ids.ptr, ids.count, _stream_handle(stream), err)
        if rc:
            raise lib.error(rc, err, f"save_layer({request!r}, {layer!r})")

    def save_layers(self, layer, saves, stream=None) -> list:
        """save_layer of `layer` for every (request, block_ids) of `saves` in one call (a forward
        pass's saves of one layer): the event is recorded once. Returns one entry per save: None
        when it went out, else its KvdError; one refused does not stop the others."""
        saves = list(saves)
        n = len(saves)
        if n == 0:
            raise InvalidArgumentError("save_layers needs at least one (request, block_ids)")
        lib = self._lib
        arr = (_lib.KvSaveStruct * n)()
        keep = []
        for i, (request, block_ids) in enumerate(saves):
            ids = Int64Ids(block_ids)
            keep.append(ids)
            arr[i].request = _cstr(request, "request")
            arr[i].block_ids = ids.ptr
            arr[i].count = ids.count
        results = (_lib.KvErrorStruct * n)()
        err = lib.err()
        rc = lib.kv_save_layers(self._handle(), self._layer(layer), arr, n,
                                _stream_handle(stream), results, err)
        if rc:
            raise lib.error(rc, err, f"save_layers({layer!r})")
        return [None if r.code == 0 else lib.error(r.code, r, f"save of {saves[i][0]!r}")
                for i, r in enumerate(results)]

    def set_transfer_token(self, request: str, transfer_token: str):
        """Fixes `request`'s transfer token before it finishes (32 to 64 hex digits, e.g.
        secrets.token_hex(16)), for a router or engine that mints it when the prefill starts and
        hands it to the decode side then: a decode's Want presenting it is served at once, so
        layers stream while the prefill runs, with tokens required. Every rank calls it before
        (or after) its first save_layer and before request_finished; the first fixes it, the
        others must pass the same. One-way, as save_layer: a token kvd refuses later fails the
        request, and request_finished raises that error."""
        if not isinstance(transfer_token, str):
            raise InvalidArgumentError(f"transfer_token must be a str of hex digits, got "
                                       f"{transfer_token!r}")
        err = self._lib.err()
        rc = self._lib.kv_set_transfer_token(self._handle(), _cstr(request, "request"),
                                             transfer_token.encode(), err)
        self._lib.check(rc, err, f"set_transfer_token({request!r})")

    def request_finished(self, request: str, transfer_token: str = None) -> TransferParams:
        """Finishes `request` on the prefill side: the TransferParams the decode side loads it
        with (to_dict() for the router). Their transfer_token is kvd's random capability for
        the request, or `transfer_token` where the engine chose it (32 to 64 hex digits, e.g.
        secrets.token_hex(16)): for engines whose scheduler hands the params to the decode side
        before the ranks finish the request in kvd (vLLM). Every rank must pass the same token,
        else the request fails; a decode's Want that presents it first waits for it."""
        if self._remote_ids is None:
            self._remote_ids = (ctypes.c_int64 * self.REMOTE_IDS_CAPACITY)()
        out = _lib.KvTransferParamsStruct()
        out.struct_size = sizeof(out)
        count, err = c_size_t(), _lib.KvErrorStruct()
        if transfer_token is None:
            rc = self._lib.kv_request_finished(
                self._handle(), _cstr(request, "request"), byref(out), self._remote_ids,
                self.REMOTE_IDS_CAPACITY, byref(count), byref(err))
        else:
            if not isinstance(transfer_token, str):
                raise InvalidArgumentError(f"transfer_token must be a str of hex digits, got "
                                           f"{transfer_token!r}")
            rc = self._lib.kv_request_finished_with_token(
                self._handle(), _cstr(request, "request"), transfer_token.encode(), byref(out),
                self._remote_ids, self.REMOTE_IDS_CAPACITY, byref(count), byref(err))
        self._lib.check(rc, err, f"request_finished({request!r})")
        n = min(count.value, self.REMOTE_IDS_CAPACITY)
        return TransferParams.from_c(out, self._remote_ids[:n])

    def requests_finished(self, finishes) -> list:
        """request_finished for many requests in one round trip to kvd instead of one per
        request. `finishes`: request ids, or (request, transfer_token) pairs (token
        None for kvd's own). Returns one entry per request: its TransferParams (without
        remote_block_ids: request_finished returns those), or its KvdError (one failing does not
        stop the others). Raises the batch's error when none was sent."""
        finishes = [(f, None) if isinstance(f, str) else f for f in finishes]
        for i, f in enumerate(finishes):
            if not isinstance(f, (tuple, list)) or len(f) != 2:
                raise InvalidArgumentError(f"finishes[{i}]: a request id or a (request, "
                                           f"transfer_token) pair, got {f!r}")
        n = len(finishes)
        if not 0 < n <= _lib.MAX_FINISHES_PER_CALL:
            raise InvalidArgumentError(f"requests_finished takes 1 to "
                                       f"{_lib.MAX_FINISHES_PER_CALL} requests, got {n}")
        specs = (_lib.KvFinishStruct * n)()
        for i, (request, token) in enumerate(finishes):
            if token is not None and not isinstance(token, str):
                raise InvalidArgumentError(f"finishes[{i}]: transfer_token must be a str of hex "
                                           f"digits, got {token!r}")
            specs[i].request = _cstr(request, "request")
            specs[i].transfer_token = None if token is None else token.encode()
        out = (_lib.KvTransferParamsStruct * n)()
        for p in out:
            p.struct_size = sizeof(p)
        results = (_lib.KvErrorStruct * n)()
        err = _lib.KvErrorStruct()
        self._lib.check(self._lib.kv_requests_finished(self._handle(), specs, n, out, results,
                                                       byref(err)),
                        err, "requests_finished")
        return [TransferParams.from_c(out[i], []) if r.code == 0 else
                self._lib.error(r.code, r, f"requests_finished({finishes[i][0]!r})")
                for i, r in enumerate(results)]

    # ---- decode --------------------------------------------------------------------------------

    @staticmethod
    def _params(params, tokens, mode):
        if isinstance(params, dict):
            params = TransferParams.from_dict(params)
        if not isinstance(params, TransferParams):
            raise InvalidArgumentError(f"params must be kvd.TransferParams or its dict, got "
                                       f"{type(params).__name__}")
        s = params.to_c(tokens, mode)
        if s.tokens <= 0:
            raise InvalidArgumentError(
                f"request {params.request_id!r}: the decode side sets the tokens to load "
                "(TransferParams.tokens or tokens=), got 0")
        return s

    def start_load(self, request: str, params, block_ids, tokens: int = None, mode: str = None):
        """Loads `request` (params from the prefill side; tokens and mode override its fields)
        into the local `block_ids`. Then wait_layer per layer."""
        s = self._params(params, tokens, mode)
        ids = Int64Ids(block_ids)
        err = self._lib.err()
        rc = self._lib.kv_start_load(self._handle(), _cstr(request, "request"), byref(s), ids.ptr,
                                     ids.count, err)
        if rc:
            raise self._lib.error(rc, err, f"start_load({request!r})")

    def start_loads(self, loads) -> list:
        """start_load for many requests in one round trip to kvd. `loads`: (request, params,
        block_ids) or (request, params, block_ids, tokens) tuples, or dicts with those keys (and
        optionally mode). Returns one entry per load: None when it started, else its KvdError
        (one refused does not stop the others). Raises the batch's error when none started."""
        loads = list(loads)
        n = len(loads)
        if not 0 < n <= _lib.MAX_LOADS_PER_CALL:
            raise InvalidArgumentError(f"start_loads takes 1 to {_lib.MAX_LOADS_PER_CALL} "
                                       f"loads, got {n}")
        # One buffer: n kv_load, n kv_transfer_params, n request ids (NUL-terminated), packed
        # with struct rather than ctypes field by field (the per-load cost is what a scheduler
        # step of many loads pays).
        load_size, id_size = sizeof(_lib.KvLoadStruct), _lib.MAX_ID_BYTES + 1
        p_at, r_at = n * load_size, n * (load_size + PARAMS_SIZE)
        buf = bytearray(r_at + n * id_size)
        view = (ctypes.c_char * len(buf)).from_buffer(buf)
        base = ctypes.addressof(view)
        keep = [view]
        pack_load = _LOAD_PACKER.pack_into
        for i, load in enumerate(loads):
            if isinstance(load, dict):
                request, params, ids = load["request"], load["params"], load["block_ids"]
                tokens, mode = load.get("tokens"), load.get("mode")
            else:
                request, params, ids, *rest = load
                tokens = rest[0] if rest else None
                mode = rest[1] if len(rest) > 1 else None
            if isinstance(params, dict):
                params = TransferParams.from_dict(params)
            if not isinstance(params, TransferParams):
                raise InvalidArgumentError(f"loads[{i}]: params must be kvd.TransferParams or "
                                           f"its dict, got {type(params).__name__}")
            if params.pack_into(buf, p_at + i * PARAMS_SIZE, tokens, mode) <= 0:
                raise InvalidArgumentError(
                    f"loads[{i}] ({request!r}): the decode side sets the tokens to load "
                    "(TransferParams.tokens or tokens=), got 0")
            req = _cstr(request, "request")
            if not 0 < len(req) <= _lib.MAX_ID_BYTES:
                raise InvalidArgumentError(f"loads[{i}]: a request id of {len(req)} bytes "
                                           f"(1 to {_lib.MAX_ID_BYTES})")
            buf[r_at + i * id_size:r_at + i * id_size + len(req)] = req
            ids = Int64Ids(ids)
            keep.append(ids)
            pack_load(buf, i * load_size, base + r_at + i * id_size,
                      base + p_at + i * PARAMS_SIZE, ids.ptr, ids.count)
        results = (_lib.KvErrorStruct * n)()
        err = _lib.KvErrorStruct()
        self._lib.check(self._lib.kv_start_loads(self._handle(), base, n, results, byref(err)),
                        err, "start_loads")
        del keep
        return [None if r.code == 0 else self._lib.error(r.code, r, f"start_loads[{i}]")
                for i, r in enumerate(results)]

    def wait_layer(self, request: str, layer):
        """Until `layer` (index or name) of `request` is in place; raises the request's error or
        TimeoutError."""
        err = self._lib.err()
        rc = self._lib.kv_wait_layer(self._handle(), _cstr(request, "request"),
                                     self._layer(layer), err)
        if rc:
            raise self._lib.error(rc, err, f"wait_layer({request!r}, {layer!r})")

    # ---- completion ----------------------------------------------------------------------------

    def get_finished(self):
        """(sent, received): requests finished since the last call: sent on the source side
        (blocks released), received on the destination side (every layer in place)."""
        sent, received = self._finished
        err = _lib.KvErrorStruct()
        with self._finished_lock:
            try:
                self._lib.check(self._lib.kv_get_finished(self._handle(), self._on_request,
                                                          None, byref(err)), err, "get_finished")
                return list(sent), list(received)
            finally:
                sent.clear()
                received.clear()

    def get_failed_blocks(self) -> list:
        """Local blocks of loads that failed since the last call (their content is undefined)."""
        h = self._handle()
        capacity = 1024
        while True:
            buf = (ctypes.c_int64 * capacity)()
            count, err = c_size_t(), _lib.KvErrorStruct()
            rc = self._lib.kv_get_failed_blocks(h, buf, capacity, byref(count), byref(err))
            if rc == RESOURCE_EXHAUSTED and count.value > capacity:
                capacity = count.value
                continue
            self._lib.check(rc, err, "get_failed_blocks")
            return list(buf[:count.value])

    def load_error(self, request: str):
        """Why the load of `request` failed, as a KvdError (also after get_failed_blocks returned
        its blocks, for the last 4096 failed loads), or None: it did not fail, is still running
        or is not known."""
        why, err = _lib.KvErrorStruct(), _lib.KvErrorStruct()
        self._lib.check(self._lib.kv_load_error(self._handle(), _cstr(request, "request"),
                                                byref(why), byref(err)), err,
                        f"load_error({request!r})")
        return None if why.code == 0 else self._lib.error(why.code, why)

    def status(self) -> dict:
        """kvd's status (kv_daemon_status_json) as a dict."""
        h = self._handle()
        capacity = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(capacity)
            length, err = c_size_t(), _lib.KvErrorStruct()
            rc = self._lib.kv_daemon_status_json(h, buf, capacity, byref(length), byref(err))
            if rc == RESOURCE_EXHAUSTED and length.value >= capacity:
                capacity = 2 * length.value + 4096  # its figures may grow meanwhile
                continue
            self._lib.check(rc, err, "status")
            return json.loads(buf.raw[:length.value].decode())

    def __repr__(self):
        state = "closed" if self._h is None else f"{len(self.regions)} regions"
        return (f"kvd.Connector(instance={self.instance!r}, tp {self.tp_rank}/{self.tp_size}, "
                f"{state})")


__all__ = ["ClosedError", "Connector", "Daemon", "KvCacheRegion", "KvdError", "OffloadOp",
           "TransferParams", "allocate_host_kv_cache", "library_path", "version"]
