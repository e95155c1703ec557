// The C API over Connector: conversions, and a catch-all at each entry so that nothing throws
// across the boundary (std::bad_alloc included).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "connector/connector.h"
#include "connector/kv_connector.h"
#include "daemon/daemon.h"

struct kv_connector {
  std::unique_ptr<kv::connector::Connector> impl;
};

struct kv_offload_op {
  kv::connector::OffloadOp impl;
};

struct kv_daemon {
  std::shared_ptr<kv::daemon::Daemon> impl;
  std::string address;
};

namespace {

int Report(const kv::Status& s, kv_error* err) {
  if (err != nullptr) {
    err->code = static_cast<int>(s.code());
    std::snprintf(err->message, sizeof(err->message), "%s", s.ToString().c_str());
  }
  return static_cast<int>(s.code());
}

template <typename F>
int Guarded(kv_error* err, F&& body) {
  try {
    return Report(body(), err);
  } catch (const std::exception& e) {
    return Report(kv::Status::Internal(std::string("exception: ") + e.what()), err);
  } catch (...) {
    return Report(kv::Status::Internal("unknown exception"), err);
  }
}

kv::Status NeedNonNull(const void* p, const char* what) {
  return p != nullptr ? kv::Status::Ok()
                      : kv::Status::InvalidArgument(std::string(what) + " is NULL");
}

void Copy(const std::string& from, char (&to)[256]) {
  std::snprintf(to, sizeof(to), "%s", from.c_str());
}

kv::LayoutSpec Spec(const kv_layout& l) {
  kv::LayoutSpec s;
  s.order = l.order != nullptr ? l.order : "LBNHC";
  s.layers = l.layers;
  s.blocks = l.blocks;
  s.heads = l.heads;
  s.block_size = l.block_size;
  s.content_bytes = l.content_bytes;
  std::copy(std::begin(l.strides), std::end(l.strides), s.strides.begin());
  s.tp_rank = l.tp_rank;
  s.tp_size = l.tp_size;
  s.total_heads = l.total_heads;
  s.replicated = l.replicated != 0;
  return s;
}

kv::Result<kv::connector::LoadSpec> Load(const kv_load& load) {
  KV_RETURN_IF_ERROR(NeedNonNull(load.request, "request"));
  KV_RETURN_IF_ERROR(NeedNonNull(load.params, "params"));
  KV_RETURN_IF_ERROR(NeedNonNull(load.block_ids, "block_ids"));
  const kv_transfer_params& params = *load.params;
  kv::connector::LoadSpec out;
  out.request = load.request;
  out.params.peer_name = std::string(params.peer_name, strnlen(params.peer_name, 256));
  out.params.peer_address = std::string(params.peer_address, strnlen(params.peer_address, 256));
  out.params.request_id = std::string(params.request_id, strnlen(params.request_id, 256));
  out.params.tokens = params.tokens;
  out.params.mode =
      params.mode == KV_MODE_PULL ? kv::connector::Mode::kPull : kv::connector::Mode::kPush;
  out.block_ids = {load.block_ids, load.count};
  return out;
}

kv::connector::ConnectorOptions Options(const char* instance, int rank, int size, int timeout_ms) {
  kv::connector::ConnectorOptions o;
  o.instance = instance;
  o.tp_rank = rank;
  o.tp_size = size;
  o.timeout = std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : 30000);
  return o;
}

kv::Result<std::vector<kv::offload::BlockKey>> Keys(const uint8_t* keys, size_t key_bytes,
                                                    size_t count) {
  KV_RETURN_IF_ERROR(NeedNonNull(keys, "keys"));
  std::vector<kv::offload::BlockKey> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    auto key = kv::offload::BlockKey::FromBytes({keys + i * key_bytes, key_bytes});
    if (!key.ok()) return key.status().WithContext("key " + std::to_string(i));
    out.push_back(*key);
  }
  return out;
}

}  // namespace

extern "C" {

int kv_daemon_start(const char* name, const char* listen, const char* transport, kv_daemon** out,
                    kv_error* err) {
  return kv_daemon_start_with_offload(name, listen, transport, 0, out, err);
}

int kv_daemon_start_with_offload(const char* name, const char* listen, const char* transport,
                                 uint64_t offload_bytes, kv_daemon** out, kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(out, "out"));
    kv::daemon::DaemonOptions o;
    if (name) o.name = name;
    if (listen) o.listen = listen;
    if (transport) o.transport_name = transport;
    o.offload_bytes = offload_bytes;
    KV_ASSIGN_OR_RETURN(auto d, kv::daemon::Daemon::Start(std::move(o)));
    *out = new kv_daemon{d, d->listen_address()};
    return kv::Status::Ok();
  });
}

const char* kv_daemon_address(const kv_daemon* daemon) {
  return daemon != nullptr ? daemon->address.c_str() : "";
}

void kv_daemon_stop(kv_daemon* daemon) {
  delete daemon;
}

int kv_connector_open(const char* socket_path, const char* instance, int tp_rank, int tp_size,
                      int timeout_ms, kv_connector** out, kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(out, "out"));
    KV_RETURN_IF_ERROR(NeedNonNull(socket_path, "socket_path"));
    KV_RETURN_IF_ERROR(NeedNonNull(instance, "instance"));
    KV_ASSIGN_OR_RETURN(auto c, kv::connector::Connector::Open(
                                    socket_path, Options(instance, tp_rank, tp_size, timeout_ms)));
    *out = new kv_connector{std::move(c)};
    return kv::Status::Ok();
  });
}

int kv_connector_open_embedded(kv_daemon* daemon, const char* instance, int tp_rank, int tp_size,
                               int timeout_ms, kv_connector** out, kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(out, "out"));
    KV_RETURN_IF_ERROR(NeedNonNull(daemon, "daemon"));
    KV_RETURN_IF_ERROR(NeedNonNull(instance, "instance"));
    KV_ASSIGN_OR_RETURN(auto c, kv::connector::Connector::OpenEmbedded(
                                    daemon->impl, Options(instance, tp_rank, tp_size, timeout_ms)));
    *out = new kv_connector{std::move(c)};
    return kv::Status::Ok();
  });
}

void kv_connector_close(kv_connector* connector) {
  delete connector;
}

int kv_register_kv_caches(kv_connector* c, const kv_layout* layouts, size_t count, void** bases,
                          kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
    KV_RETURN_IF_ERROR(NeedNonNull(layouts, "layouts"));
    KV_RETURN_IF_ERROR(NeedNonNull(bases, "bases"));
    std::vector<kv::LayoutSpec> specs(count);
    for (size_t i = 0; i < count; ++i) specs[i] = Spec(layouts[i]);
    KV_ASSIGN_OR_RETURN(auto caches, c->impl->RegisterKvCaches(specs));
    for (size_t i = 0; i < caches.size(); ++i) bases[i] = caches[i].base;
    return kv::Status::Ok();
  });
}

int kv_register_gpu_kv_caches(kv_connector* c, const kv_layout* layouts, void* const* bases,
                              int device, size_t count, kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
    KV_RETURN_IF_ERROR(NeedNonNull(layouts, "layouts"));
    KV_RETURN_IF_ERROR(NeedNonNull(bases, "bases"));
    std::vector<kv::connector::GpuKvCache> caches(count);
    for (size_t i = 0; i < count; ++i) {
      caches[i].base = bases[i];
      caches[i].device = device;
      caches[i].layout = Spec(layouts[i]);
    }
    return c->impl->RegisterGpuKvCaches(caches).status();
  });
}

int kv_save_layer(kv_connector* c, const char* request, int layer, const int64_t* block_ids,
                  size_t count, kv_error* err) {
  return kv_save_layer_on_stream(c, request, layer, block_ids, count, nullptr, err);
}

int kv_save_layer_on_stream(kv_connector* c, const char* request, int layer,
                            const int64_t* block_ids, size_t count, void* cuda_stream,
                            kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
    KV_RETURN_IF_ERROR(NeedNonNull(request, "request"));
    KV_RETURN_IF_ERROR(NeedNonNull(block_ids, "block_ids"));
    return c->impl->SaveLayer(request, layer, {block_ids, count}, cuda_stream);
  });
}

int kv_request_finished_with_blocks(kv_connector* c, const char* request, kv_transfer_params* out,
                                    int64_t* remote_block_ids, size_t capacity, size_t* count,
                                    kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
    KV_RETURN_IF_ERROR(NeedNonNull(request, "request"));
    KV_RETURN_IF_ERROR(NeedNonNull(out, "out"));
    if (capacity > 0) KV_RETURN_IF_ERROR(NeedNonNull(remote_block_ids, "remote_block_ids"));
    KV_ASSIGN_OR_RETURN(auto params, c->impl->RequestFinished(request));
    Copy(params.peer_name, out->peer_name);
    Copy(params.peer_address, out->peer_address);
    Copy(params.request_id, out->request_id);
    out->tokens = 0;
    out->mode = KV_MODE_PUSH;
    const size_t n = std::min(capacity, params.remote_block_ids.size());
    std::copy_n(params.remote_block_ids.begin(), n, remote_block_ids);
    if (count != nullptr) *count = params.remote_block_ids.size();
    return kv::Status::Ok();
  });
}

int kv_request_finished(kv_connector* c, const char* request, kv_transfer_params* out,
                        kv_error* err) {
  return kv_request_finished_with_blocks(c, request, out, nullptr, 0, nullptr, err);
}

int kv_start_load(kv_connector* c, const char* request, const kv_transfer_params* params,
                  const int64_t* block_ids, size_t count, kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
    KV_ASSIGN_OR_RETURN(auto load, Load({request, params, block_ids, count}));
    return c->impl->StartLoad(load.request, load.params, load.block_ids);
  });
}

int kv_start_loads(kv_connector* c, const kv_load* loads, size_t n, kv_error* results,
                   kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
    KV_RETURN_IF_ERROR(NeedNonNull(loads, "loads"));
    KV_RETURN_IF_ERROR(NeedNonNull(results, "results"));
    std::vector<kv::connector::LoadSpec> specs;
    for (size_t i = 0; i < n; ++i) {
      auto load = Load(loads[i]);
      if (!load.ok()) return load.status().WithContext("load " + std::to_string(i));
      specs.push_back(std::move(load).value());
    }
    KV_ASSIGN_OR_RETURN(auto started, c->impl->StartLoads(specs));
    for (size_t i = 0; i < n; ++i) Report(started[i], &results[i]);
    return kv::Status::Ok();
  });
}

int kv_wait_layer(kv_connector* c, const char* request, int layer, kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
    KV_RETURN_IF_ERROR(NeedNonNull(request, "request"));
    return c->impl->WaitLayer(request, layer);
  });
}

int kv_get_finished(kv_connector* c, kv_request_callback on_request, void* ctx, kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
    KV_RETURN_IF_ERROR(NeedNonNull(reinterpret_cast<void*>(on_request), "on_request"));
    auto finished = c->impl->GetFinished();
    for (const auto& id : finished.sent) on_request(ctx, id.c_str(), 1);
    for (const auto& id : finished.received) on_request(ctx, id.c_str(), 0);
    return kv::Status::Ok();
  });
}

int kv_get_failed_blocks(kv_connector* c, kv_blocks_callback on_blocks, void* ctx, kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
    KV_RETURN_IF_ERROR(NeedNonNull(reinterpret_cast<void*>(on_blocks), "on_blocks"));
    auto blocks = c->impl->GetFailedBlocks();
    on_blocks(ctx, blocks.data(), blocks.size());
    return kv::Status::Ok();
  });
}

int kv_offload_store(kv_connector* c, uint32_t region, const uint8_t* keys, size_t key_bytes,
                     const int64_t* block_ids, size_t count, kv_offload_op** op,
                     kv_offload_store_info* info, kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
    KV_RETURN_IF_ERROR(NeedNonNull(block_ids, "block_ids"));
    KV_RETURN_IF_ERROR(NeedNonNull(op, "op"));
    *op = nullptr;
    KV_ASSIGN_OR_RETURN(auto parsed, Keys(keys, key_bytes, count));
    KV_ASSIGN_OR_RETURN(auto stored, c->impl->OffloadStore(parsed, {block_ids, count}, region));
    if (info != nullptr) {
      *info = {stored.stored, stored.already_present, stored.evicted.size(), stored.bytes,
               stored.runs};
    }
    *op = new kv_offload_op{std::move(stored.op)};
    return kv::Status::Ok();
  });
}

int kv_offload_lookup(kv_connector* c, uint32_t region, const uint8_t* keys, size_t key_bytes,
                      size_t count, size_t* hits, kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
    KV_RETURN_IF_ERROR(NeedNonNull(hits, "hits"));
    KV_ASSIGN_OR_RETURN(auto parsed, Keys(keys, key_bytes, count));
    KV_ASSIGN_OR_RETURN(*hits, c->impl->OffloadLookup(parsed, region));
    return kv::Status::Ok();
  });
}

int kv_offload_load(kv_connector* c, uint32_t region, const uint8_t* keys, size_t key_bytes,
                    const int64_t* block_ids, size_t count, int per_layer, kv_offload_op** op,
                    kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
    KV_RETURN_IF_ERROR(NeedNonNull(block_ids, "block_ids"));
    KV_RETURN_IF_ERROR(NeedNonNull(op, "op"));
    *op = nullptr;
    KV_ASSIGN_OR_RETURN(auto parsed, Keys(keys, key_bytes, count));
    KV_ASSIGN_OR_RETURN(auto loaded,
                        c->impl->OffloadLoad(parsed, {block_ids, count}, per_layer != 0, region));
    *op = new kv_offload_op{std::move(loaded.op)};
    return kv::Status::Ok();
  });
}

int kv_offload_wait(kv_offload_op* op, kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(op, "op"));
    return op->impl.Wait();
  });
}

int kv_offload_wait_layer(kv_offload_op* op, int layer, kv_error* err) {
  return Guarded(err, [&]() -> kv::Status {
    KV_RETURN_IF_ERROR(NeedNonNull(op, "op"));
    return op->impl.WaitLayer(layer);
  });
}

void kv_offload_op_free(kv_offload_op* op) {
  delete op;
}

}  // extern "C"
