// The C API (<kv/kv_connector.h>) over the C++ connector: argument checks, conversions, and a
// catch-all at each entry so that nothing throws across the boundary (std::bad_alloc included).
#include "kv/kv_connector.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "connector/connector.h"
#include "connector/connector_core.h"
#include "connector/token_hex.h"

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

// The C codes are kv::Code's values; a new code must be added to both.
static_assert(KV_OK == static_cast<int>(kv::Code::kOk));
static_assert(KV_INVALID_ARGUMENT == static_cast<int>(kv::Code::kInvalidArgument));
static_assert(KV_OUT_OF_RANGE == static_cast<int>(kv::Code::kOutOfRange));
static_assert(KV_INCOMPATIBLE == static_cast<int>(kv::Code::kIncompatible));
static_assert(KV_NOT_FOUND == static_cast<int>(kv::Code::kNotFound));
static_assert(KV_ALREADY_EXISTS == static_cast<int>(kv::Code::kAlreadyExists));
static_assert(KV_RESOURCE_EXHAUSTED == static_cast<int>(kv::Code::kResourceExhausted));
static_assert(KV_TIMEOUT == static_cast<int>(kv::Code::kTimeout));
static_assert(KV_UNAVAILABLE == static_cast<int>(kv::Code::kUnavailable));
static_assert(KV_ABORTED == static_cast<int>(kv::Code::kAborted));
static_assert(KV_UNSUPPORTED == static_cast<int>(kv::Code::kUnsupported));
static_assert(KV_IO_ERROR == static_cast<int>(kv::Code::kIoError));
static_assert(KV_INTERNAL == static_cast<int>(kv::Code::kInternal));
static_assert(KV_MAX_ID_BYTES == kv::connector::kMaxIdBytes);
static_assert(KV_MAX_LOADS_PER_CALL == kv::connector::kMaxLoadsPerCall);
static_assert(KV_MAX_FINISHES_PER_CALL == kv::connector::kMaxFinishesPerCall);
static_assert(KV_MAX_KEY_BYTES == kv::offload::BlockKey::kMaxBytes);

namespace {

using kv::Status;

int Report(const Status& s, kv_error* err) {
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
    return Report(Status::Internal(std::string("exception: ") + e.what()), err);
  } catch (...) {
    return Report(Status::Internal("unknown exception"), err);
  }
}

Status NeedNonNull(const void* p, const char* what) {
  return p != nullptr ? Status::Ok() : Status::InvalidArgument(std::string(what) + " is NULL");
}

// A NUL-terminated id of 1 to KV_MAX_ID_BYTES bytes; reads at most one byte past the limit.
kv::Result<std::string> Id(const char* s, const char* what) {
  KV_RETURN_IF_ERROR(NeedNonNull(s, what));
  const size_t n = strnlen(s, KV_MAX_ID_BYTES + 1);
  if (n == 0 || n > KV_MAX_ID_BYTES) {
    return Status::InvalidArgument(std::string(what) + (n == 0 ? " is empty" : " is longer than ") +
                                   (n == 0 ? "" : std::to_string(KV_MAX_ID_BYTES) + " bytes"));
  }
  return std::string(s, n);
}

// An option struct's size: known fields only are read, so a newer caller's larger struct is
// refused rather than half-read, and an older caller's smaller one is read as far as it goes.
template <typename T>
Status CheckStructSize(size_t size, const char* what) {
  if (size == 0 || size > sizeof(T)) {
    return Status::InvalidArgument(std::string(what) + ".struct_size is " + std::to_string(size) +
                                   "; set it to sizeof(" + what + ") (this library knows " +
                                   std::to_string(sizeof(T)) + " bytes)");
  }
  return Status::Ok();
}

// Copies the first `size` bytes of the caller's struct over a zeroed one.
template <typename T>
T Widen(const T* in) {
  T out;
  std::memset(&out, 0, sizeof(out));
  std::memcpy(&out, in, std::min(in->struct_size, sizeof(T)));
  return out;
}

Status CopyOut(const std::string& from, char* to, size_t capacity, const char* what) {
  if (from.size() >= capacity) {
    return Status::Internal(std::string(what) + " of " + std::to_string(from.size()) +
                            " bytes does not fit kv_transfer_params");
  }
  std::memcpy(to, from.c_str(), from.size() + 1);
  return Status::Ok();
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
  s.region_bytes = l.region_bytes;
  return s;
}

kv::Result<kv::connector::TransferParams> Params(const kv_transfer_params* in) {
  KV_RETURN_IF_ERROR(NeedNonNull(in, "params"));
  KV_RETURN_IF_ERROR(CheckStructSize<kv_transfer_params>(in->struct_size, "kv_transfer_params"));
  const kv_transfer_params p = Widen(in);
  kv::connector::TransferParams out;
  out.peer_name = std::string(p.peer_name, strnlen(p.peer_name, sizeof(p.peer_name)));
  KV_ASSIGN_OR_RETURN(out.peer_address, Id(p.peer_address, "params.peer_address"));
  // The source's id of the request: informational (the decode side names the request itself).
  out.request_id = std::string(p.request_id, strnlen(p.request_id, sizeof(p.request_id)));
  KV_ASSIGN_OR_RETURN(out.transfer_token,
                      kv::connector::TokenFromHex(p.transfer_token, sizeof(p.transfer_token) - 1));
  if (p.peer_name[sizeof(p.peer_name) - 1] != '\0' ||
      p.peer_address[sizeof(p.peer_address) - 1] != '\0' ||
      p.request_id[sizeof(p.request_id) - 1] != '\0') {
    return Status::InvalidArgument("a kv_transfer_params string is not NUL-terminated");
  }
  if (p.mode != KV_MODE_PUSH && p.mode != KV_MODE_PULL) {
    return Status::InvalidArgument("params.mode " + std::to_string(p.mode) +
                                   " is neither KV_MODE_PUSH nor KV_MODE_PULL");
  }
  out.tokens = p.tokens;
  out.mode = p.mode == KV_MODE_PULL ? kv::connector::Mode::kPull : kv::connector::Mode::kPush;
  return out;
}

kv::Result<kv::connector::LoadSpec> Load(const kv_load& load) {
  kv::connector::LoadSpec out;
  KV_ASSIGN_OR_RETURN(out.request, Id(load.request, "request"));
  KV_ASSIGN_OR_RETURN(out.params, Params(load.params));
  if (load.count == 0) return Status::InvalidArgument("a load names no blocks (count is 0)");
  KV_RETURN_IF_ERROR(NeedNonNull(load.block_ids, "block_ids"));
  out.block_ids = {load.block_ids, load.count};
  return out;
}

kv::Result<kv::connector::ConnectorOptions> Options(const kv_connector_options* in) {
  KV_RETURN_IF_ERROR(NeedNonNull(in, "options"));
  KV_RETURN_IF_ERROR(
      CheckStructSize<kv_connector_options>(in->struct_size, "kv_connector_options"));
  const kv_connector_options o = Widen(in);
  kv::connector::ConnectorOptions out;
  if (o.instance != nullptr) {
    KV_ASSIGN_OR_RETURN(out.instance, Id(o.instance, "instance"));
  }
  if (o.offload_namespace != nullptr) {
    KV_ASSIGN_OR_RETURN(out.offload_namespace, Id(o.offload_namespace, "offload_namespace"));
  }
  out.tp_rank = o.tp_rank;
  out.tp_size = o.tp_size == 0 ? 1 : o.tp_size;
  if (o.timeout_ms < 0) {
    return Status::InvalidArgument("timeout_ms " + std::to_string(o.timeout_ms) +
                                   " is negative (0 means the default, 30000)");
  }
  out.timeout = std::chrono::milliseconds(o.timeout_ms > 0 ? o.timeout_ms : 30000);
  out.busy_poll = o.busy_poll != 0;
  return out;
}

kv::Result<std::vector<kv::offload::BlockKey>> Keys(const uint8_t* keys, size_t key_bytes,
                                                    size_t count) {
  if (count == 0) return Status::InvalidArgument("no keys (count is 0)");
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

kv::Result<kv::connector::Connector*> Live(kv_connector* c) {
  KV_RETURN_IF_ERROR(NeedNonNull(c, "connector"));
  return c->impl.get();
}

// A batch call's size: 1 to `most` entries.
Status CheckBatchSize(size_t n, size_t most, const char* call, const char* entries) {
  if (n >= 1 && n <= most) return Status::Ok();
  return Status::InvalidArgument(std::string(call) + " takes 1 to " + std::to_string(most) + " " +
                                 entries + ", not " + std::to_string(n));
}

// The C form of `params` into *out (its struct_size the caller's, checked before).
Status ParamsOut(const kv::connector::TransferParams& params, kv_transfer_params* out) {
  kv_transfer_params p;
  std::memset(&p, 0, sizeof(p));
  p.struct_size = out->struct_size;
  KV_RETURN_IF_ERROR(CopyOut(params.peer_name, p.peer_name, sizeof(p.peer_name), "peer name"));
  KV_RETURN_IF_ERROR(
      CopyOut(params.peer_address, p.peer_address, sizeof(p.peer_address), "peer address"));
  KV_RETURN_IF_ERROR(CopyOut(params.request_id, p.request_id, sizeof(p.request_id), "request id"));
  KV_RETURN_IF_ERROR(CopyOut(kv::connector::TokenToHex(params.transfer_token), p.transfer_token,
                             sizeof(p.transfer_token), "transfer token"));
  p.tokens = 0;
  p.mode = KV_MODE_PUSH;
  std::memcpy(out, &p, std::min(out->struct_size, sizeof(p)));
  return Status::Ok();
}

// kv_request_finished and kv_request_finished_with_token (token: NULL for kvd's own).
Status RequestFinishedInto(kv_connector* c, const char* request, const char* token,
                           kv_transfer_params* out, int64_t* remote_block_ids, size_t capacity,
                           size_t* count) {
  KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
  KV_ASSIGN_OR_RETURN(auto id, Id(request, "request"));
  KV_RETURN_IF_ERROR(NeedNonNull(out, "out"));
  KV_RETURN_IF_ERROR(CheckStructSize<kv_transfer_params>(out->struct_size, "kv_transfer_params"));
  if (capacity > 0) KV_RETURN_IF_ERROR(NeedNonNull(remote_block_ids, "remote_block_ids"));
  std::string raw;
  if (token != nullptr) {
    KV_ASSIGN_OR_RETURN(raw, kv::connector::TokenFromHex(token, 64));
  }
  KV_ASSIGN_OR_RETURN(auto params, token != nullptr ? connector->RequestFinished(id, raw)
                                                    : connector->RequestFinished(id));
  KV_RETURN_IF_ERROR(ParamsOut(params, out));
  const size_t n = std::min(capacity, params.remote_block_ids.size());
  std::copy_n(params.remote_block_ids.begin(), n, remote_block_ids);
  if (count != nullptr) *count = params.remote_block_ids.size();
  return Status::Ok();
}

}  // namespace

extern "C" {

const char* kv_strerror(int code) {
  if (code < 0 || code > KV_INTERNAL) return "unknown";
  return kv::CodeName(static_cast<kv::Code>(code)).data();  // static literals, NUL-terminated
}

const char* kv_version(void) {
  return kv::connector::Version();
}

int kv_daemon_start(const kv_daemon_options* options, kv_daemon** out, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_RETURN_IF_ERROR(NeedNonNull(out, "out"));
    *out = nullptr;
    KV_RETURN_IF_ERROR(NeedNonNull(options, "options"));
    KV_RETURN_IF_ERROR(
        CheckStructSize<kv_daemon_options>(options->struct_size, "kv_daemon_options"));
    const kv_daemon_options o = Widen(options);
    kv::connector::EmbeddedDaemonOptions d;
    if (o.name != nullptr) {
      KV_ASSIGN_OR_RETURN(d.name, Id(o.name, "name"));
    }
    if (o.listen != nullptr) d.listen = o.listen;
    if (o.transport != nullptr) d.transport = o.transport;
    d.offload_bytes = o.offload_bytes;
    if (o.auth_secret_file != nullptr) d.auth_secret_file = o.auth_secret_file;
    d.insecure_peers = o.insecure_peers != 0;
    KV_ASSIGN_OR_RETURN(auto daemon, kv::connector::StartEmbeddedDaemon(d));
    const std::string address = kv::connector::EmbeddedDaemonAddress(*daemon);
    *out = new kv_daemon{std::move(daemon), address};
    return Status::Ok();
  });
}

const char* kv_daemon_address(const kv_daemon* daemon) {
  return daemon != nullptr ? daemon->address.c_str() : "";
}

void kv_daemon_stop(kv_daemon* daemon) {
  delete daemon;
}

int kv_connector_open(const char* socket_path, const kv_connector_options* options,
                      kv_connector** out, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_RETURN_IF_ERROR(NeedNonNull(out, "out"));
    *out = nullptr;
    KV_RETURN_IF_ERROR(NeedNonNull(socket_path, "socket_path"));
    KV_ASSIGN_OR_RETURN(auto o, Options(options));
    KV_ASSIGN_OR_RETURN(auto c, kv::connector::Connector::Open(socket_path, std::move(o)));
    *out = new kv_connector{std::move(c)};
    return Status::Ok();
  });
}

int kv_connector_open_embedded(kv_daemon* daemon, const kv_connector_options* options,
                               kv_connector** out, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_RETURN_IF_ERROR(NeedNonNull(out, "out"));
    *out = nullptr;
    KV_RETURN_IF_ERROR(NeedNonNull(daemon, "daemon"));
    KV_ASSIGN_OR_RETURN(auto o, Options(options));
    KV_ASSIGN_OR_RETURN(auto c, kv::connector::Connector::OpenEmbedded(daemon->impl, std::move(o)));
    *out = new kv_connector{std::move(c)};
    return Status::Ok();
  });
}

void kv_connector_close(kv_connector* connector) {
  delete connector;
}

int kv_register_kv_caches(kv_connector* c, const kv_cache_desc* caches, size_t count, void** bases,
                          kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    if (count == 0) return Status::InvalidArgument("no KV caches to register (count is 0)");
    KV_RETURN_IF_ERROR(NeedNonNull(caches, "caches"));
    KV_RETURN_IF_ERROR(NeedNonNull(bases, "bases"));
    KV_RETURN_IF_ERROR(CheckStructSize<kv_cache_desc>(caches->struct_size, "kv_cache_desc"));
    const size_t stride = caches->struct_size;  // the caller's sizeof, see the header
    std::vector<kv::connector::KvCacheDesc> descs(count);
    for (size_t i = 0; i < count; ++i) {
      const auto* raw = reinterpret_cast<const kv_cache_desc*>(
          reinterpret_cast<const char*>(caches) + i * stride);
      if (raw->struct_size != stride) {
        return Status::InvalidArgument("caches[" + std::to_string(i) + "].struct_size " +
                                       std::to_string(raw->struct_size) + " differs from " +
                                       "caches[0]'s " + std::to_string(stride));
      }
      const kv_cache_desc d = Widen(raw);
      descs[i].layout = Spec(d.layout);
      descs[i].base = d.base;
      if (d.memory == KV_MEMORY_HOST) {
        descs[i].location = kv::MemoryLocation::Host();
      } else if (d.memory == KV_MEMORY_CUDA && d.device >= 0) {
        descs[i].location = kv::MemoryLocation::Cuda(d.device);
      } else {
        return Status::InvalidArgument(
            "caches[" + std::to_string(i) + "]: memory " + std::to_string(d.memory) + ", device " +
            std::to_string(d.device) + " (KV_MEMORY_HOST, or KV_MEMORY_CUDA with device >= 0)");
      }
    }
    KV_ASSIGN_OR_RETURN(auto registered, connector->RegisterKvCaches(descs));
    for (size_t i = 0; i < registered.size(); ++i) bases[i] = registered[i].base;
    return Status::Ok();
  });
}

int kv_host_memory_alloc(uint64_t bytes, void** out, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_RETURN_IF_ERROR(NeedNonNull(out, "out"));
    *out = nullptr;
    KV_ASSIGN_OR_RETURN(*out, kv::connector::AllocateHostMemory(bytes));
    return Status::Ok();
  });
}

int kv_host_memory_free(void* base, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_RETURN_IF_ERROR(NeedNonNull(base, "base"));
    return kv::connector::FreeHostMemory(base);
  });
}

int kv_save_layer(kv_connector* c, const char* request, int layer, const int64_t* block_ids,
                  size_t count, void* cuda_stream, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    KV_ASSIGN_OR_RETURN(auto id, Id(request, "request"));
    if (count == 0) return Status::InvalidArgument("save_layer names no blocks (count is 0)");
    KV_RETURN_IF_ERROR(NeedNonNull(block_ids, "block_ids"));
    return connector->SaveLayer(id, layer, {block_ids, count}, cuda_stream);
  });
}

int kv_save_layers(kv_connector* c, int layer, const kv_save* saves, size_t n, void* cuda_stream,
                   kv_error* results, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    if (n == 0) return Status::InvalidArgument("save_layers names no saves (n is 0)");
    KV_RETURN_IF_ERROR(NeedNonNull(saves, "saves"));
    KV_RETURN_IF_ERROR(NeedNonNull(results, "results"));
    std::vector<kv::connector::SaveSpec> specs(n);
    std::vector<Status> refused(n);
    for (size_t i = 0; i < n; ++i) {
      auto id = Id(saves[i].request, "request");
      if (!id.ok()) {
        refused[i] = id.status();
      } else if (saves[i].count == 0 || saves[i].block_ids == nullptr) {
        refused[i] = Status::InvalidArgument("save " + std::to_string(i) + " names no blocks");
      } else {
        specs[i] = {std::move(id).value(), {saves[i].block_ids, saves[i].count}};
      }
    }
    // Only the well-formed saves go out; the others keep their own error.
    std::vector<kv::connector::SaveSpec> good;
    std::vector<size_t> where;
    for (size_t i = 0; i < n; ++i) {
      if (refused[i].ok()) {
        good.push_back(specs[i]);
        where.push_back(i);
      }
    }
    if (!good.empty()) {
      KV_ASSIGN_OR_RETURN(auto done, connector->SaveLayers(layer, good, cuda_stream));
      for (size_t k = 0; k < where.size(); ++k) refused[where[k]] = done[k];
    }
    for (size_t i = 0; i < n; ++i) Report(refused[i], &results[i]);
    return Status::Ok();
  });
}

int kv_set_transfer_token(kv_connector* c, const char* request, const char* transfer_token,
                          kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    KV_ASSIGN_OR_RETURN(auto id, Id(request, "request"));
    KV_RETURN_IF_ERROR(NeedNonNull(transfer_token, "transfer_token"));
    KV_ASSIGN_OR_RETURN(std::string raw, kv::connector::TokenFromHex(transfer_token, 64));
    return connector->SetTransferToken(id, raw);
  });
}

int kv_request_finished(kv_connector* c, const char* request, kv_transfer_params* out,
                        int64_t* remote_block_ids, size_t capacity, size_t* count, kv_error* err) {
  return Guarded(err, [&] {
    return RequestFinishedInto(c, request, nullptr, out, remote_block_ids, capacity, count);
  });
}

int kv_request_finished_with_token(kv_connector* c, const char* request, const char* token,
                                   kv_transfer_params* out, int64_t* remote_block_ids,
                                   size_t capacity, size_t* count, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_RETURN_IF_ERROR(NeedNonNull(token, "transfer_token"));
    return RequestFinishedInto(c, request, token, out, remote_block_ids, capacity, count);
  });
}

int kv_requests_finished(kv_connector* c, const kv_finish* finishes, size_t n,
                         kv_transfer_params* out, kv_error* results, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    KV_RETURN_IF_ERROR(
        CheckBatchSize(n, KV_MAX_FINISHES_PER_CALL, "requests_finished", "requests"));
    KV_RETURN_IF_ERROR(NeedNonNull(finishes, "finishes"));
    KV_RETURN_IF_ERROR(NeedNonNull(results, "results"));
    for (size_t i = 0; out != nullptr && i < n; ++i) {
      Status size = CheckStructSize<kv_transfer_params>(out[i].struct_size, "kv_transfer_params");
      if (!size.ok()) return size.WithContext("out " + std::to_string(i));
    }
    // A request whose id or token is refused here is not sent; the others go in one round trip.
    std::vector<Status> checks(n);
    std::vector<kv::connector::FinishSpec> specs;
    std::vector<size_t> sent;
    for (size_t i = 0; i < n; ++i) {
      auto id = Id(finishes[i].request, "request");
      checks[i] = id.status();
      kv::connector::FinishSpec spec;
      if (id.ok()) spec.request = *id;
      if (checks[i].ok() && finishes[i].transfer_token != nullptr) {
        auto raw = kv::connector::TokenFromHex(finishes[i].transfer_token, 64);
        checks[i] = raw.status();
        if (raw.ok()) spec.transfer_token = *raw;
      }
      if (!checks[i].ok()) continue;
      specs.push_back(std::move(spec));
      sent.push_back(i);
    }
    std::vector<kv::Result<kv::connector::TransferParams>> finished;
    if (!specs.empty()) {
      KV_ASSIGN_OR_RETURN(finished, connector->RequestsFinished(specs));
    }
    for (size_t k = 0; k < sent.size(); ++k) {
      const size_t i = sent[k];
      checks[i] = finished[k].status();
      if (finished[k].ok() && out != nullptr) checks[i] = ParamsOut(*finished[k], &out[i]);
    }
    for (size_t i = 0; i < n; ++i) Report(checks[i], &results[i]);
    return Status::Ok();
  });
}

int kv_start_load(kv_connector* c, const char* request, const kv_transfer_params* params,
                  const int64_t* block_ids, size_t count, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    KV_ASSIGN_OR_RETURN(auto load, Load({request, params, block_ids, count}));
    return connector->StartLoad(load.request, load.params, load.block_ids);
  });
}

int kv_start_loads(kv_connector* c, const kv_load* loads, size_t n, kv_error* results,
                   kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    KV_RETURN_IF_ERROR(CheckBatchSize(n, KV_MAX_LOADS_PER_CALL, "start_loads", "loads"));
    KV_RETURN_IF_ERROR(NeedNonNull(loads, "loads"));
    KV_RETURN_IF_ERROR(NeedNonNull(results, "results"));
    std::vector<kv::connector::LoadSpec> specs;
    specs.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      auto load = Load(loads[i]);
      if (!load.ok()) return load.status().WithContext("load " + std::to_string(i));
      specs.push_back(std::move(load).value());
    }
    KV_ASSIGN_OR_RETURN(auto started, connector->StartLoads(specs));
    for (size_t i = 0; i < n; ++i) Report(started[i], &results[i]);
    return Status::Ok();
  });
}

int kv_wait_layer(kv_connector* c, const char* request, int layer, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    KV_ASSIGN_OR_RETURN(auto id, Id(request, "request"));
    return connector->WaitLayer(id, layer);
  });
}

int kv_get_finished(kv_connector* c, kv_request_callback on_request, void* ctx, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    KV_RETURN_IF_ERROR(NeedNonNull(reinterpret_cast<void*>(on_request), "on_request"));
    auto finished = connector->GetFinished();
    for (const auto& id : finished.sent) on_request(ctx, id.c_str(), 1);
    for (const auto& id : finished.received) on_request(ctx, id.c_str(), 0);
    return Status::Ok();
  });
}

int kv_get_failed_blocks(kv_connector* c, int64_t* block_ids, size_t capacity, size_t* count,
                         kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    KV_RETURN_IF_ERROR(NeedNonNull(count, "count"));
    if (capacity > 0) KV_RETURN_IF_ERROR(NeedNonNull(block_ids, "block_ids"));
    return connector->core().TakeFailedBlocksInto({block_ids, capacity}, count);
  });
}

int kv_load_error(kv_connector* c, const char* request, kv_error* load_error, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    KV_ASSIGN_OR_RETURN(auto id, Id(request, "request"));
    KV_RETURN_IF_ERROR(NeedNonNull(load_error, "load_error"));
    Report(connector->core().LoadError(id), load_error);
    return Status::Ok();
  });
}

int kv_daemon_status_json(kv_connector* c, char* buf, size_t capacity, size_t* length,
                          kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    if (capacity > 0) KV_RETURN_IF_ERROR(NeedNonNull(buf, "buf"));
    KV_ASSIGN_OR_RETURN(std::string json, connector->DaemonStatusJson());
    if (length != nullptr) *length = json.size();
    if (json.size() >= capacity) {
      return Status::ResourceExhausted("kvd's status is " + std::to_string(json.size() + 1) +
                                       " bytes with its NUL; the buffer holds " +
                                       std::to_string(capacity));
    }
    std::memcpy(buf, json.c_str(), json.size() + 1);
    return Status::Ok();
  });
}

int kv_offload_store(kv_connector* c, uint32_t region, const uint8_t* keys, size_t key_bytes,
                     const int64_t* block_ids, size_t count, void* cuda_stream, kv_offload_op** op,
                     kv_offload_store_info* info, kv_block_key* evicted, size_t evicted_capacity,
                     kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_RETURN_IF_ERROR(NeedNonNull(op, "op"));
    *op = nullptr;
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    KV_RETURN_IF_ERROR(NeedNonNull(block_ids, "block_ids"));
    if (evicted_capacity > 0) KV_RETURN_IF_ERROR(NeedNonNull(evicted, "evicted"));
    if (info != nullptr) {
      KV_RETURN_IF_ERROR(
          CheckStructSize<kv_offload_store_info>(info->struct_size, "kv_offload_store_info"));
    }
    KV_ASSIGN_OR_RETURN(auto parsed, Keys(keys, key_bytes, count));
    KV_ASSIGN_OR_RETURN(auto stored,
                        connector->OffloadStore(parsed, {block_ids, count}, region, cuda_stream));
    if (info != nullptr) {
      kv_offload_store_info i{info->struct_size,     stored.stored, stored.already_present,
                              stored.evicted.size(), stored.bytes,  stored.runs};
      std::memcpy(info, &i, std::min(info->struct_size, sizeof(i)));
    }
    for (size_t k = 0; k < std::min(evicted_capacity, stored.evicted.size()); ++k) {
      const auto bytes = stored.evicted[k].bytes();
      std::memset(&evicted[k], 0, sizeof(evicted[k]));
      std::memcpy(evicted[k].bytes, bytes.data(), bytes.size());
      evicted[k].size = static_cast<uint32_t>(bytes.size());
    }
    *op = new kv_offload_op{std::move(stored.op)};
    return Status::Ok();
  });
}

int kv_offload_lookup(kv_connector* c, uint32_t region, const uint8_t* keys, size_t key_bytes,
                      size_t count, size_t* hits, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    KV_RETURN_IF_ERROR(NeedNonNull(hits, "hits"));
    KV_ASSIGN_OR_RETURN(auto parsed, Keys(keys, key_bytes, count));
    KV_ASSIGN_OR_RETURN(*hits, connector->OffloadLookup(parsed, region));
    return Status::Ok();
  });
}

int kv_offload_load(kv_connector* c, uint32_t region, const uint8_t* keys, size_t key_bytes,
                    const int64_t* block_ids, size_t count, int per_layer, kv_offload_op** op,
                    kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_RETURN_IF_ERROR(NeedNonNull(op, "op"));
    *op = nullptr;
    KV_ASSIGN_OR_RETURN(auto* connector, Live(c));
    KV_RETURN_IF_ERROR(NeedNonNull(block_ids, "block_ids"));
    KV_ASSIGN_OR_RETURN(auto parsed, Keys(keys, key_bytes, count));
    KV_ASSIGN_OR_RETURN(auto loaded,
                        connector->OffloadLoad(parsed, {block_ids, count}, per_layer != 0, region));
    *op = new kv_offload_op{std::move(loaded.op)};
    return Status::Ok();
  });
}

int kv_offload_wait(kv_offload_op* op, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_RETURN_IF_ERROR(NeedNonNull(op, "op"));
    return op->impl.Wait();
  });
}

int kv_offload_wait_layer(kv_offload_op* op, int layer, kv_error* err) {
  return Guarded(err, [&]() -> Status {
    KV_RETURN_IF_ERROR(NeedNonNull(op, "op"));
    return op->impl.WaitLayer(layer);
  });
}

void kv_offload_op_free(kv_offload_op* op) {
  delete op;
}

}  // extern "C"
