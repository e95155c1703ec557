// The small host cache the C API tests register, where its pages lie, and short forms of the C
// API's option structs.
#pragma once

#include <cstdio>

#include "kv/kv_connector.h"

namespace kv::c_api_test {

// 2 layers × 8 blocks × 2 heads × 4 tokens × 16 B, LBNHC: a block is 128 bytes per layer, a
// layer 1024.
inline kv_layout SmallCLayout() {
  kv_layout l{};
  l.order = "LBNHC";
  l.layers = 2;
  l.blocks = 8;
  l.heads = 2;
  l.block_size = 4;
  l.content_bytes = 16;
  l.tp_size = 1;
  return l;
}

// The bytes of (layer, block) in a cache of SmallCLayout().
inline char* SmallPage(void* base, int layer, int block) {
  return static_cast<char*>(base) + layer * 1024 + block * 128;
}

// A host cache the library allocates (base NULL), or one at `base`.
inline kv_cache_desc HostDesc(const kv_layout& layout, void* base = nullptr) {
  kv_cache_desc d;
  KV_INIT(d);
  d.layout = layout;
  d.memory = KV_MEMORY_HOST;
  d.base = base;
  return d;
}

inline int StartDaemon(const char* name, const char* listen, const char* transport,
                       uint64_t offload_bytes, kv_daemon** out, kv_error* err) {
  kv_daemon_options o;
  KV_INIT(o);
  o.name = name;
  o.listen = listen;
  o.transport = transport;
  o.offload_bytes = offload_bytes;
  return kv_daemon_start(&o, out, err);
}

inline kv_connector_options ConnectorOptions(const char* instance, int timeout_ms = 5000) {
  kv_connector_options o;
  KV_INIT(o);
  o.instance = instance;
  o.tp_size = 1;
  o.timeout_ms = timeout_ms;
  return o;
}

inline int OpenEmbedded(kv_daemon* d, const char* instance, kv_connector** out, kv_error* err) {
  const kv_connector_options o = ConnectorOptions(instance);
  return kv_connector_open_embedded(d, &o, out, err);
}

inline int RegisterOne(kv_connector* c, const kv_layout& layout, void** base, kv_error* err) {
  const kv_cache_desc d = HostDesc(layout);
  return kv_register_kv_caches(c, &d, 1, base, err);
}

// Params naming the daemon at `address` as the source.
inline kv_transfer_params ParamsFrom(const char* address, int64_t tokens) {
  kv_transfer_params p;
  KV_INIT(p);
  std::snprintf(p.peer_address, sizeof(p.peer_address), "%s", address);
  p.tokens = tokens;
  p.mode = KV_MODE_PUSH;
  return p;
}

}  // namespace kv::c_api_test
