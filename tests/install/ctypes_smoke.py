#!/usr/bin/env python3
"""Loads an installed libkvconnector.so with ctypes (standard library only): the library is usable
without a C++ compiler. Checks kv_version() and kv_strerror(KV_TIMEOUT), starts an embedded
daemon, registers a host cache and saves a layer, and checks that bad arguments come back as
error codes with messages."""
import ctypes
import sys

KV_INVALID_ARGUMENT, KV_TIMEOUT = 1, 7


class Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("message", ctypes.c_char * 512)]


class DaemonOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p),
                ("listen", ctypes.c_char_p), ("transport", ctypes.c_char_p),
                ("offload_bytes", ctypes.c_uint64)]


class ConnectorOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("instance", ctypes.c_char_p),
                ("tp_rank", ctypes.c_int), ("tp_size", ctypes.c_int), ("timeout_ms", ctypes.c_int)]


class Layout(ctypes.Structure):
    _fields_ = [("order", ctypes.c_char_p), ("layers", ctypes.c_int64), ("blocks", ctypes.c_int64),
                ("heads", ctypes.c_int64), ("block_size", ctypes.c_int64),
                ("content_bytes", ctypes.c_int64), ("strides", ctypes.c_int64 * 6),
                ("tp_rank", ctypes.c_int), ("tp_size", ctypes.c_int),
                ("total_heads", ctypes.c_int64), ("replicated", ctypes.c_int),
                ("region_bytes", ctypes.c_int64)]


class CacheDesc(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("layout", Layout), ("memory", ctypes.c_int),
                ("device", ctypes.c_int), ("base", ctypes.c_void_p)]


def main(path):
    lib = ctypes.CDLL(path)
    lib.kv_version.restype = ctypes.c_char_p
    lib.kv_strerror.restype = ctypes.c_char_p
    lib.kv_strerror.argtypes = [ctypes.c_int]
    version = lib.kv_version().decode()
    assert version.count(".") == 2, version
    assert lib.kv_strerror(KV_TIMEOUT) == b"timeout", lib.kv_strerror(KV_TIMEOUT)
    assert lib.kv_strerror(99) == b"unknown"

    err = Error()
    daemon = ctypes.c_void_p()
    opts = DaemonOptions(ctypes.sizeof(DaemonOptions), b"smoke", b"127.0.0.1:0", b"local", 0)
    rc = lib.kv_daemon_start(ctypes.byref(opts), ctypes.byref(daemon), ctypes.byref(err))
    assert rc == 0, err.message
    bad = DaemonOptions(0, None, None, None, 0)  # struct_size unset
    rc = lib.kv_daemon_start(ctypes.byref(bad), ctypes.byref(ctypes.c_void_p()), ctypes.byref(err))
    assert rc == KV_INVALID_ARGUMENT and b"struct_size" in err.message, err.message

    conn = ctypes.c_void_p()
    copts = ConnectorOptions(ctypes.sizeof(ConnectorOptions), b"engine", 0, 1, 5000)
    rc = lib.kv_connector_open_embedded(daemon, ctypes.byref(copts), ctypes.byref(conn),
                                        ctypes.byref(err))
    assert rc == 0, err.message
    desc = CacheDesc(struct_size=ctypes.sizeof(CacheDesc), memory=0, device=0, base=None)
    desc.layout = Layout(order=b"LBNHC", layers=2, blocks=8, heads=2, block_size=4,
                         content_bytes=16, tp_size=1)
    base = ctypes.c_void_p()
    rc = lib.kv_register_kv_caches(conn, ctypes.byref(desc), ctypes.c_size_t(1), ctypes.byref(base),
                                   ctypes.byref(err))
    assert rc == 0 and base.value, err.message
    blocks = (ctypes.c_int64 * 2)(1, 2)
    rc = lib.kv_save_layer(conn, b"req", 0, blocks, ctypes.c_size_t(2), None, ctypes.byref(err))
    assert rc == 0, err.message
    rc = lib.kv_save_layer(conn, b"x" * 257, 0, blocks, ctypes.c_size_t(2), None,
                           ctypes.byref(err))
    assert rc == KV_INVALID_ARGUMENT and b"256" in err.message, err.message
    lib.kv_connector_close(conn)
    lib.kv_daemon_stop(daemon)
    print(f"ctypes smoke: libkvconnector {version} loaded from {path}; registered, saved, refused")


if __name__ == "__main__":
    main(sys.argv[1])
