// CudaPdEngines: the P/D simulator's engines on GPUs. Contract: pd_gpu.h.
#include "tools/kvbench/pd/pd_gpu.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "tools/kvbench/pd/pd_gpu_kernels.h"
#include "kernels/decode_attention.h"
#include "kernels/write_tokens.h"

namespace kv::connector {
namespace {

using Clock = std::chrono::steady_clock;
using kernels::DType;

Status Cuda(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::Ok();
  std::string message = std::string(what) + ": " + cudaGetErrorString(error);
  if (error == cudaErrorMemoryAllocation) return Status::ResourceExhausted(std::move(message));
  return Status::Internal(std::move(message));
}

// cudaMalloc'd (or, pinned, cudaMallocHost'd) bytes, freed on destruction. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    std::swap(p_, other.p_);
    std::swap(device_, other.device_);
    std::swap(pinned_, other.pinned_);
    return *this;
  }
  ~Buffer() {
    if (p_ == nullptr) return;
    if (pinned_) {
      cudaFreeHost(p_);
    } else {
      cudaSetDevice(device_);
      cudaFree(p_);
    }
  }
  // On `device`, which the calling thread has current.
  static Result<Buffer> Device(int device, uint64_t bytes) {
    Buffer b;
    b.device_ = device;
    KV_RETURN_IF_ERROR(Cuda(cudaMalloc(&b.p_, std::max<uint64_t>(bytes, 1)), "cudaMalloc"));
    KV_RETURN_IF_ERROR(Cuda(cudaMemset(b.p_, 0, bytes), "cudaMemset"));
    return b;
  }
  static Result<Buffer> Pinned(uint64_t bytes) {
    Buffer b;
    b.pinned_ = true;
    KV_RETURN_IF_ERROR(Cuda(cudaMallocHost(&b.p_, std::max<uint64_t>(bytes, 1)), "cudaMallocHost"));
    return b;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  int device_ = 0;
  bool pinned_ = false;
};

class Stream {
 public:
  Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (s_ != nullptr) cudaStreamDestroy(s_);
  }
  Status Create() { return Cuda(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "stream"); }
  cudaStream_t get() const { return s_; }

  // Until everything queued so far ran, or kTimeout at `deadline`.
  Status Synchronize(Clock::time_point deadline) const {
    for (;;) {
      const cudaError_t e = cudaStreamQuery(s_);
      if (e == cudaSuccess) return Status::Ok();
      if (e != cudaErrorNotReady) return Cuda(e, "stream");
      if (Clock::now() > deadline) return Status::Timeout("GPU work did not finish in time");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  cudaStream_t s_ = nullptr;
};

float Bf16ToFloat(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &word, sizeof(f));
  return f;
}

// One engine: its cache, stream and the scratch its kernels use. Touched by its rank's thread,
// and by the driver between waves.
struct Rank {
  Connector* connector = nullptr;
  int device = 0;
  KvRegion region;
  kernels::StridedKv strided;
  kernels::PagedKv paged;
  int64_t q_head0 = 0, q_heads = 0;  // global query heads this rank attends with
  int64_t table_width = 0;           // blocks per request
  Buffer cache;
  Stream stream;
  Buffer tables, host_tables;  // per wave slot: [window][table_width] int32 block ids
  Buffer slots, host_slots;    // prefill, per wave slot: [window][tokens] int64 slot ids
  std::vector<bool> uploaded;  // per wave slot: tables (and slots) hold this wave's blocks
  Buffer key, value;           // prefill: [tokens][heads][head_dim] bf16
  Buffer seq_len, query, workspace;
  uint64_t workspace_bytes = 0;
  Buffer out;         // [window][layers][q_heads][head_dim] bf16 attention outputs
  Buffer mismatches;  // decode: [window] elements that differed; then one guard-byte counter

  void* layer_base(int64_t layer) const { return cache.get<char>() + layer * strided.layer_stride; }
};

class Engines final : public CudaPdEngines {
 public:
  Engines(const PdConfig& config, int prefill_device, int decode_device)
      : c_(config),
        prefill_device_(prefill_device),
        decode_device_(decode_device),
        saved_ns_(new std::atomic<int64_t>[config.window]()) {}

  Result<KvCache> Register(Connector& connector, const LayoutSpec& spec, bool prefill) override {
    auto rank = std::make_unique<Rank>();
    Rank& r = *rank;
    r.connector = &connector;
    r.device = prefill ? prefill_device_ : decode_device_;
    KV_RETURN_IF_ERROR(Cuda(cudaSetDevice(r.device), "cudaSetDevice"));
    KV_ASSIGN_OR_RETURN(r.region, KvRegion::Create(spec));
    r.strided = kernels::DescribeRegion(r.region);
    KV_ASSIGN_OR_RETURN(r.paged, kernels::SplitKv(r.strided, c_.head_dim, DType::kBFloat16));
    r.q_head0 = r.region.first_global_head() * kQueryHeadsPerKvHead;
    r.q_heads = r.paged.heads * kQueryHeadsPerKvHead;
    r.table_width = (c_.tokens + r.paged.block_size - 1) / r.paged.block_size;
    const int64_t window = c_.window, tokens = c_.tokens, dim = c_.head_dim;
    KV_ASSIGN_OR_RETURN(r.cache, Buffer::Device(r.device, r.region.span_bytes()));
    KV_RETURN_IF_ERROR(r.stream.Create());
    KV_ASSIGN_OR_RETURN(r.tables, Buffer::Device(r.device, window * r.table_width * 4));
    KV_ASSIGN_OR_RETURN(r.host_tables, Buffer::Pinned(window * r.table_width * 4));
    r.uploaded.assign(window, false);
    if (prefill) {
      KV_ASSIGN_OR_RETURN(r.slots, Buffer::Device(r.device, window * tokens * 8));
      KV_ASSIGN_OR_RETURN(r.host_slots, Buffer::Pinned(window * tokens * 8));
      const uint64_t kv_bytes = tokens * r.paged.heads * dim * kernels::kDTypeBytes;
      KV_ASSIGN_OR_RETURN(r.key, Buffer::Device(r.device, kv_bytes));
      KV_ASSIGN_OR_RETURN(r.value, Buffer::Device(r.device, kv_bytes));
    }
    KV_ASSIGN_OR_RETURN(r.seq_len, Buffer::Device(r.device, 4));
    const int32_t len = static_cast<int32_t>(tokens);
    KV_RETURN_IF_ERROR(Cuda(cudaMemcpy(r.seq_len.get(), &len, 4, cudaMemcpyHostToDevice), "copy"));
    KV_ASSIGN_OR_RETURN(r.query, Buffer::Device(r.device, r.q_heads * dim * kernels::kDTypeBytes));
    r.workspace_bytes = kernels::DecodeAttentionWorkspaceBytes(r.paged, AttentionArgs(r, 0, 0));
    KV_ASSIGN_OR_RETURN(r.workspace, Buffer::Device(r.device, r.workspace_bytes));
    KV_ASSIGN_OR_RETURN(r.out, Buffer::Device(r.device, window * c_.layers * r.q_heads * dim *
                                                            kernels::kDTypeBytes));
    KV_ASSIGN_OR_RETURN(r.mismatches, Buffer::Device(r.device, (window + 1) * 8));
    // cudaMemset runs on the legacy stream, which the rank's non-blocking stream does not wait
    // for: the zeros must be in place before anything is queued there.
    KV_RETURN_IF_ERROR(Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));

    const KvCacheDesc gpu{spec, MemoryLocation::Cuda(r.device), r.cache.get()};
    KV_ASSIGN_OR_RETURN(auto caches, connector.RegisterKvCaches({&gpu, 1}));
    (prefill ? prefill_ : decode_).push_back(std::move(rank));
    return caches.front();
  }

  Status Forward(int rank, std::chrono::microseconds time) override {
    KV_RETURN_IF_ERROR(broken_);
    Rank& r = *prefill_[rank];
    KV_RETURN_IF_ERROR(Cuda(cudaSetDevice(r.device), "cudaSetDevice"));
    return gpu::LaunchWait(std::chrono::nanoseconds(time).count(), r.stream.get());
  }

  Status Write(int rank, int slot, uint64_t seed, int64_t layer,
               std::span<const int64_t> blocks) override {
    KV_RETURN_IF_ERROR(broken_);
    Rank& r = *prefill_[rank];
    KV_RETURN_IF_ERROR(Cuda(cudaSetDevice(r.device), "cudaSetDevice"));
    KV_RETURN_IF_ERROR(Upload(r, slot, blocks));
    const gpu::PatternSlice slice{seed, layer, r.region.first_global_head(), c_.tokens};
    KV_RETURN_IF_ERROR(gpu::LaunchGenerateKv(r.paged, slice, r.key.get<uint16_t>(),
                                             r.value.get<uint16_t>(), r.stream.get()));
    kernels::NewTokens input;
    input.key = r.key.get();
    input.value = r.value.get();
    input.slots = r.slots.get<int64_t>() + slot * c_.tokens;
    input.tokens = c_.tokens;
    KV_RETURN_IF_ERROR(
        kernels::LaunchWriteTokens(r.paged, r.layer_base(layer), input, r.stream.get()));
    return Attend(r, slot, seed, layer);
  }

  Result<std::vector<Status>> SaveLayers(int rank, int layer,
                                         std::span<const SaveSpec> saves) override {
    Rank& r = *prefill_[rank];
    return r.connector->SaveLayers(layer, saves, r.stream.get());
  }

  Status MarkSaved(int rank, int slot) override {
    Rank& r = *prefill_[rank];
    KV_RETURN_IF_ERROR(Cuda(cudaSetDevice(r.device), "cudaSetDevice"));
    auto mark = [](void* latest) {
      StoreMax(*static_cast<std::atomic<int64_t>*>(latest),
               Clock::now().time_since_epoch().count());
    };
    // A stream with nothing left to run is marked now. A host function queued there can wait
    // milliseconds behind kvd's copy kernels (as the engine's event records did,
    // layer_events.h), and the saves queued behind it could then no longer skip their events.
    const cudaError_t idle = cudaStreamQuery(r.stream.get());
    if (idle == cudaSuccess) {
      mark(&saved_ns_[slot]);
      return Status::Ok();
    }
    if (idle != cudaErrorNotReady) return Cuda(idle, "cudaStreamQuery");
    return Cuda(cudaLaunchHostFunc(r.stream.get(), mark, &saved_ns_[slot]), "cudaLaunchHostFunc");
  }

  Status Flush(int rank) override {
    Rank& r = *prefill_[rank];
    KV_RETURN_IF_ERROR(Cuda(cudaSetDevice(r.device), "cudaSetDevice"));
    return r.stream.Synchronize(Clock::now() + c_.timeout);
  }

  Status Check(int rank, int slot, const std::string&, uint64_t seed, int64_t layer,
               std::span<const int64_t> blocks) override {
    KV_RETURN_IF_ERROR(broken_);
    Rank& r = *decode_[rank];
    KV_RETURN_IF_ERROR(Cuda(cudaSetDevice(r.device), "cudaSetDevice"));
    KV_RETURN_IF_ERROR(Upload(r, slot, blocks));
    const gpu::PatternSlice slice{seed, layer, r.region.first_global_head(), c_.tokens};
    KV_RETURN_IF_ERROR(gpu::LaunchCheckKv(r.paged, r.layer_base(layer), Table(r, slot), slice,
                                          r.mismatches.get<unsigned long long>() + slot,
                                          r.stream.get()));
    return Attend(r, slot, seed, layer);
  }

  WaveOutcome FinishWave(const std::vector<std::string>& ids) override {
    const int slots = static_cast<int>(ids.size());
    WaveOutcome outcome{Checks(ids), std::vector<int64_t>(slots)};
    for (int j = 0; j < slots; ++j) outcome.saved_ns[j] = saved_ns_[j].exchange(0);
    return outcome;
  }

  // FinishWave's checks, once every rank's stream is idle.
  std::vector<Status> Checks(const std::vector<std::string>& ids) {
    const int slots = static_cast<int>(ids.size());
    std::vector<Status> result(slots);
    if (!broken_.ok()) return std::vector<Status>(slots, broken_);
    const auto deadline = Clock::now() + c_.timeout;
    for (auto* side : {&prefill_, &decode_}) {
      for (auto& r : *side) {
        Status s = Cuda(cudaSetDevice(r->device), "cudaSetDevice");
        if (s.ok()) s = r->stream.Synchronize(deadline);
        if (!s.ok()) {
          broken_ = s;  // work still queued may read the pinned tables: nothing may rewrite them
          return std::vector<Status>(slots, s);
        }
        r->uploaded.assign(c_.window, false);
      }
    }
    for (size_t rank = 0; rank < decode_.size(); ++rank) {
      Rank& r = *decode_[rank];
      std::vector<unsigned long long> wrong(slots);
      Status s =
          Cuda(cudaMemcpy(wrong.data(), r.mismatches.get(), slots * 8, cudaMemcpyDeviceToHost),
               "copy mismatches");
      if (s.ok()) {
        s = Cuda(cudaMemsetAsync(r.mismatches.get(), 0, slots * 8, r.stream.get()),
                 "cudaMemsetAsync");
      }
      if (!s.ok()) return std::vector<Status>(slots, s);
      for (int j = 0; j < slots; ++j) {
        if (wrong[j] != 0 && result[j].ok()) {
          result[j] =
              Status::Internal("request " + ids[j] + ": " + std::to_string(wrong[j]) +
                               " K/V elements differ on decode rank " + std::to_string(rank));
        }
      }
    }
    CompareAttention(slots, ids, &result);
    return result;
  }

  Result<uint64_t> GuardBytes(int rank, int64_t first_block) override {
    Rank& r = *decode_[rank];
    KV_RETURN_IF_ERROR(Cuda(cudaSetDevice(r.device), "cudaSetDevice"));
    auto* count = r.mismatches.get<unsigned long long>() + c_.window;
    KV_RETURN_IF_ERROR(Cuda(cudaMemsetAsync(count, 0, 8, r.stream.get()), "cudaMemsetAsync"));
    KV_RETURN_IF_ERROR(gpu::LaunchCountNonZero(r.strided, r.paged, r.cache.get(), first_block,
                                               count, r.stream.get()));
    KV_RETURN_IF_ERROR(r.stream.Synchronize(Clock::now() + c_.timeout));
    unsigned long long found = 0;
    KV_RETURN_IF_ERROR(Cuda(cudaMemcpy(&found, count, 8, cudaMemcpyDeviceToHost), "copy count"));
    return found;
  }

  AttentionCheck attention() const override { return attention_; }

 private:
  kernels::DecodeAttentionArgs AttentionArgs(const Rank& r, int slot, int64_t layer) const {
    kernels::DecodeAttentionArgs a;
    a.query = r.query.get();
    a.out = r.out.get<uint16_t>() + ((slot * c_.layers + layer) * r.q_heads) * c_.head_dim;
    a.block_table = Table(r, slot);
    a.block_table_stride = r.table_width;
    a.seq_lens = r.seq_len.get<int32_t>();
    a.num_seqs = 1;
    a.num_q_heads = r.q_heads;
    a.max_seq_len = c_.tokens;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
    return a;
  }

  static const int32_t* Table(const Rank& r, int slot) {
    return r.tables.get<int32_t>() + slot * r.table_width;
  }

  // This wave's block table (and, prefill, slot ids) of `slot`, copied once per wave through
  // pinned memory that nothing rewrites before FinishWave.
  Status Upload(Rank& r, int slot, std::span<const int64_t> blocks) {
    if (r.uploaded[slot]) return Status::Ok();
    if (static_cast<int64_t>(blocks.size()) < r.table_width) {
      return Status::InvalidArgument("fewer blocks than the request's tokens need");
    }
    int32_t* table = r.host_tables.get<int32_t>() + slot * r.table_width;
    for (int64_t i = 0; i < r.table_width; ++i) table[i] = static_cast<int32_t>(blocks[i]);
    KV_RETURN_IF_ERROR(
        Cuda(cudaMemcpyAsync(const_cast<int32_t*>(Table(r, slot)), table, r.table_width * 4,
                             cudaMemcpyHostToDevice, r.stream.get()),
             "copy block table"));
    if (r.slots.get() != nullptr) {
      const int64_t n = r.paged.block_size;
      int64_t* ids = r.host_slots.get<int64_t>() + slot * c_.tokens;
      for (int64_t t = 0; t < c_.tokens; ++t) ids[t] = blocks[t / n] * n + t % n;
      KV_RETURN_IF_ERROR(
          Cuda(cudaMemcpyAsync(r.slots.get<int64_t>() + slot * c_.tokens, ids, c_.tokens * 8,
                               cudaMemcpyHostToDevice, r.stream.get()),
               "copy slots"));
    }
    r.uploaded[slot] = true;
    return Status::Ok();
  }

  // The decode attention of (slot's request, layer) with the rank's query heads.
  Status Attend(Rank& r, int slot, uint64_t seed, int64_t layer) {
    KV_RETURN_IF_ERROR(gpu::LaunchGenerateQuery(seed, layer, r.q_head0, r.q_heads, c_.head_dim,
                                                r.query.get<uint16_t>(), r.stream.get()));
    return kernels::LaunchDecodeAttention(r.paged, r.layer_base(layer),
                                          AttentionArgs(r, slot, layer), r.workspace.get(),
                                          r.workspace_bytes, r.stream.get());
  }

  // Every decode rank's attention outputs against those of the prefill rank holding the same
  // query head, after the wave's work finished.
  void CompareAttention(int slots, const std::vector<std::string>& ids,
                        std::vector<Status>* result) {
    auto fetch = [&](const Rank& r, std::vector<uint16_t>* host) {
      host->resize(slots * c_.layers * r.q_heads * c_.head_dim);
      return Cuda(cudaMemcpy(host->data(), r.out.get(), host->size() * 2, cudaMemcpyDeviceToHost),
                  "copy attention output");
    };
    std::vector<std::vector<uint16_t>> prefill_out(prefill_.size());
    for (size_t p = 0; p < prefill_.size(); ++p) {
      if (Status s = fetch(*prefill_[p], &prefill_out[p]); !s.ok()) {
        result->assign(slots, s);
        return;
      }
    }
    std::vector<uint16_t> decode_out;
    for (size_t d = 0; d < decode_.size(); ++d) {
      const Rank& dr = *decode_[d];
      if (Status s = fetch(dr, &decode_out); !s.ok()) {
        result->assign(slots, s);
        return;
      }
      for (int64_t q = 0; q < dr.q_heads; ++q) {
        const int64_t global_q = dr.q_head0 + q;
        const int64_t kv_head = global_q / kQueryHeadsPerKvHead;
        size_t p = 0;
        while (p < prefill_.size() && prefill_[p]->region.local_head(kv_head) < 0) ++p;
        if (p == prefill_.size()) continue;  // a head no prefill rank holds: nothing to compare
        const Rank& pr = *prefill_[p];
        const int64_t pq = global_q - pr.q_head0;
        for (int j = 0; j < slots; ++j) {
          for (int64_t l = 0; l < c_.layers; ++l) {
            const uint16_t* got = &decode_out[((j * c_.layers + l) * dr.q_heads + q) * c_.head_dim];
            const uint16_t* want =
                &prefill_out[p][((j * c_.layers + l) * pr.q_heads + pq) * c_.head_dim];
            for (int64_t e = 0; e < c_.head_dim; ++e) {
              const float a = Bf16ToFloat(got[e]), b = Bf16ToFloat(want[e]);
              const double diff = std::fabs(static_cast<double>(a) - b);
              ++attention_.values;
              attention_.exact += got[e] == want[e];
              if (!(diff <= attention_.max_abs_diff)) attention_.max_abs_diff = diff;
              if (!(diff <= std::ldexp(std::fabs(b), -7) + std::ldexp(1.0, -10)) &&
                  (*result)[j].ok()) {
                (*result)[j] = Status::Internal(
                    "request " + ids[j] + ": decode attention of layer " + std::to_string(l) +
                    " query head " + std::to_string(global_q) + " element " + std::to_string(e) +
                    " is " + std::to_string(a) + " on decode rank " + std::to_string(d) + ", " +
                    std::to_string(b) + " on the prefill side");
              }
            }
          }
        }
      }
    }
  }

  const PdConfig c_;
  const int prefill_device_, decode_device_;
  // Per wave slot, written by MarkSaved's host functions. Declared before the ranks so it is
  // destroyed after them: freeing their memory waits for their streams, host functions included.
  std::unique_ptr<std::atomic<int64_t>[]> saved_ns_;
  std::vector<std::unique_ptr<Rank>> prefill_, decode_;
  AttentionCheck attention_;
  Status broken_;  // a wave's GPU work that did not finish: every later call fails with it
};

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

Result<std::unique_ptr<CudaPdEngines>> CudaPdEngines::Create(const PdConfig& config,
                                                             int prefill_device,
                                                             int decode_device) {
  if (config.head_dim != 64 && config.head_dim != 128 && config.head_dim != 256) {
    return Status::Unsupported(
        "--memory cuda checks the decode attention, whose kernel takes "
        "head_dim 64, 128 or 256, not " +
        std::to_string(config.head_dim));
  }
  const int count = CudaDeviceCount();
  if (count == 0) {
    return Status::Unavailable("--memory cuda needs a CUDA device; this process sees none");
  }
  for (int device : {prefill_device, decode_device}) {
    if (device < 0 || device >= count) {
      return Status::Unavailable("--memory cuda: CUDA device " + std::to_string(device) +
                                 " is not present (this process sees " + std::to_string(count) +
                                 ")");
    }
  }
  return std::unique_ptr<CudaPdEngines>(new Engines(config, prefill_device, decode_device));
}

}  // namespace kv::connector
