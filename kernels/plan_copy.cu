// The plan copy kernel, its run-table owner and the copy-engine path. Contract: plan_copy.h.
#include <algorithm>
#include <deque>
#include <memory>
#include <vector>

#include "kernels/cuda_util.cuh"
#include "kernels/plan_copy.h"

namespace kv::kernels {
namespace {

constexpr int kCopyThreads = 1024;
constexpr uint64_t kOffsetMask = kPlanCopyMaxOffset - 1;

// A launch of fewer chunks than the grid has warps would leave most SMs idle (a layer of one
// TP 1 -> 2 request is 8 CTAs' worth; benchmarks/pd_gpu.md, ninth session). So such a launch
// gives each chunk 2^log2_parts warps,
// each copying a slice of its vectors; the slices are cut at 512-byte steps, a warp's width of
// 16-byte vectors, so every warp's accesses stay aligned and coalesced.
constexpr int kMaxLog2Parts = 4;

__device__ __forceinline__ unsigned SliceStart(unsigned units, unsigned part, unsigned parts) {
  return part == parts ? units : (units * part / parts) & ~31u;
}

// Warp w copies chunks [C·w / W, C·(w + 1) / W): balanced to one chunk, and the warp reads the
// descriptors of 32 chunks with one 16-byte load per lane, then hands them round by shuffles, so
// between two chunks it waits on no memory. With parts, it copies slices of chunks instead.
__global__ void __launch_bounds__(kCopyThreads)
    PlanCopyKernel(const unsigned char* src, unsigned char* dst, const uint4* chunks,
                   uint64_t num_chunks, int log2_parts) {
  const int lane = threadIdx.x & 31;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const uint64_t warp = (blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x) / 32;
  if (log2_parts > 0) {
    const unsigned parts = 1u << log2_parts;
    const uint64_t items = num_chunks << log2_parts, end = items * (warp + 1) / warps;
    for (uint64_t item = items * warp / warps; item < end; ++item) {
      const uint4 c = chunks[item >> log2_parts];
      const uint64_t s = c.x | uint64_t{c.y} << 32, d = c.z | uint64_t{c.w} << 32;
      // In 16-byte units: a slice starts on a 512-byte step from the chunk's start.
      const unsigned length = static_cast<unsigned>(d >> 48) + 1, units = (length + 15) / 16;
      const unsigned part = static_cast<unsigned>(item) & (parts - 1);
      const unsigned from = SliceStart(units, part, parts) * 16;
      const unsigned to = min(length, SliceStart(units, part + 1, parts) * 16);
      if (from < to) {
        detail::WarpCopy(src + s + from, dst + (d & kOffsetMask) + from, to - from, lane);
      }
    }
    return;
  }
  const uint64_t end = num_chunks * (warp + 1) / warps;
  for (uint64_t base = num_chunks * warp / warps; base < end; base += 32) {
    const uint4 mine = base + lane < end ? chunks[base + lane] : make_uint4(0, 0, 0, 0);
    const uint64_t src_offset = mine.x | uint64_t{mine.y} << 32;
    const uint64_t dst_word = mine.z | uint64_t{mine.w} << 32;
    const int count = static_cast<int>(min(uint64_t{32}, end - base));
    for (int i = 0; i < count; ++i) {
      const uint64_t s = __shfl_sync(0xffffffffu, src_offset, i);
      const uint64_t d = __shfl_sync(0xffffffffu, dst_word, i);
      detail::WarpCopy(src + s, dst + (d & kOffsetMask), (d >> 48) + 1, lane);
    }
  }
}

// Slice `part` of `parts` of one group chunk. A chunk whose rows are all 16-byte aligned on both
// sides is copied as one flat range of vectors over its rows, kUnroll loads in flight per lane
// (a 2 KiB row alone gives a lane 4); any other chunk row by row, by its first slice alone.
__device__ __forceinline__ void CopyGroupChunk(const unsigned char* src, unsigned char* dst,
                                               uint64_t sw, uint64_t dw, uint64_t ss, uint64_t ds,
                                               unsigned part, unsigned parts, int lane) {
  constexpr int kUnroll = 8;
  const unsigned rows = static_cast<unsigned>(sw >> 48) + 1;
  const unsigned length = static_cast<unsigned>(dw >> 48) + 1;
  const unsigned char* s = src + (sw & kOffsetMask);
  unsigned char* d = dst + (dw & kOffsetMask);
  const uintptr_t align = reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d) | length |
                          (rows > 1 ? (ss | ds) : 0);
  if ((align & 15) != 0) {
    if (part != 0) return;
    for (unsigned r = 0; r < rows; ++r) detail::WarpCopy(s + r * ss, d + r * ds, length, lane);
    return;
  }
  const unsigned per_row = length / 16, vectors = rows * per_row;
  const unsigned end = SliceStart(vectors, part + 1, parts);
  unsigned v = SliceStart(vectors, part, parts) + lane;
  for (; v + 32 * (kUnroll - 1) < end; v += 32 * kUnroll) {
    uint4 r[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const unsigned at = v + 32 * u, row = at / per_row, col = at - row * per_row;
      r[u] = reinterpret_cast<const uint4*>(s + row * ss)[col];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const unsigned at = v + 32 * u, row = at / per_row, col = at - row * per_row;
      reinterpret_cast<uint4*>(d + row * ds)[col] = r[u];
    }
  }
  for (; v < end; v += 32) {
    const unsigned row = v / per_row, col = v - row * per_row;
    reinterpret_cast<uint4*>(d + row * ds)[col] = reinterpret_cast<const uint4*>(s + row * ss)[col];
  }
}

// The group kernel: warps split the chunk table as above, two 16-byte loads per lane for 32
// descriptors; with parts, slices of chunks as PlanCopyKernel.
__global__ void __launch_bounds__(kCopyThreads)
    PlanCopyGroupKernel(const unsigned char* src, unsigned char* dst, const uint4* chunks,
                        uint64_t num_chunks, int log2_parts) {
  const int lane = threadIdx.x & 31;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const uint64_t warp = (blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x) / 32;
  if (log2_parts > 0) {
    const unsigned parts = 1u << log2_parts;
    const uint64_t items = num_chunks << log2_parts, end = items * (warp + 1) / warps;
    for (uint64_t item = items * warp / warps; item < end; ++item) {
      const uint64_t c = item >> log2_parts;
      const uint4 a = chunks[2 * c], b = chunks[2 * c + 1];
      CopyGroupChunk(src, dst, a.x | uint64_t{a.y} << 32, a.z | uint64_t{a.w} << 32,
                     b.x | uint64_t{b.y} << 32, b.z | uint64_t{b.w} << 32,
                     static_cast<unsigned>(item) & (parts - 1), parts, lane);
    }
    return;
  }
  const uint64_t end = num_chunks * (warp + 1) / warps;
  for (uint64_t base = num_chunks * warp / warps; base < end; base += 32) {
    const bool have = base + lane < end;
    const uint4 a = have ? chunks[2 * (base + lane)] : make_uint4(0, 0, 0, 0);
    const uint4 b = have ? chunks[2 * (base + lane) + 1] : make_uint4(0, 0, 0, 0);
    const uint64_t src_word = a.x | uint64_t{a.y} << 32, dst_word = a.z | uint64_t{a.w} << 32;
    const uint64_t src_step = b.x | uint64_t{b.y} << 32, dst_step = b.z | uint64_t{b.w} << 32;
    const int count = static_cast<int>(min(uint64_t{32}, end - base));
    for (int i = 0; i < count; ++i) {
      CopyGroupChunk(src, dst, __shfl_sync(0xffffffffu, src_word, i),
                     __shfl_sync(0xffffffffu, dst_word, i), __shfl_sync(0xffffffffu, src_step, i),
                     __shfl_sync(0xffffffffu, dst_step, i), 0, 1, lane);
    }
  }
}

// The block kernel: as the group kernel, each descriptor a group chunk repeated `blocks` times
// at the outer strides (four 16-byte loads per lane for 32 descriptors). With parts, a warp
// copies its slice of every block of its chunk.
__global__ void __launch_bounds__(kCopyThreads)
    PlanCopyBlockKernel(const unsigned char* src, unsigned char* dst, const uint4* chunks,
                        uint64_t num_chunks, int log2_parts) {
  const int lane = threadIdx.x & 31;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const uint64_t warp = (blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x) / 32;
  auto word = [](const uint4& v, int high) {
    return high ? (v.z | uint64_t{v.w} << 32) : (v.x | uint64_t{v.y} << 32);
  };
  auto copy = [&](uint64_t sw, uint64_t dw, uint64_t ss, uint64_t ds, uint64_t oss, uint64_t ods,
                  uint64_t blocks, unsigned part, unsigned parts) {
    for (uint64_t b = 0; b < blocks; ++b) {
      CopyGroupChunk(src + b * oss, dst + b * ods, sw, dw, ss, ds, part, parts, lane);
    }
  };
  if (log2_parts > 0) {
    const unsigned parts = 1u << log2_parts;
    const uint64_t items = num_chunks << log2_parts, end = items * (warp + 1) / warps;
    for (uint64_t item = items * warp / warps; item < end; ++item) {
      const uint4* c = chunks + 4 * (item >> log2_parts);
      const uint4 a = c[0], b = c[1], o = c[2], n = c[3];
      copy(word(a, 0), word(a, 1), word(b, 0), word(b, 1), word(o, 0), word(o, 1), word(n, 0),
           static_cast<unsigned>(item) & (parts - 1), parts);
    }
    return;
  }
  const uint64_t end = num_chunks * (warp + 1) / warps;
  for (uint64_t base = num_chunks * warp / warps; base < end; base += 32) {
    const bool have = base + lane < end;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const uint4* c = chunks + 4 * (base + lane);
    const uint4 a = have ? c[0] : zero, b = have ? c[1] : zero;
    const uint4 o = have ? c[2] : zero, n = have ? c[3] : zero;
    const uint64_t w[7] = {word(a, 0), word(a, 1), word(b, 0), word(b, 1),
                           word(o, 0), word(o, 1), word(n, 0)};
    const int count = static_cast<int>(min(uint64_t{32}, end - base));
    for (int i = 0; i < count; ++i) {
      copy(__shfl_sync(0xffffffffu, w[0], i), __shfl_sync(0xffffffffu, w[1], i),
           __shfl_sync(0xffffffffu, w[2], i), __shfl_sync(0xffffffffu, w[3], i),
           __shfl_sync(0xffffffffu, w[4], i), __shfl_sync(0xffffffffu, w[5], i),
           __shfl_sync(0xffffffffu, w[6], i), 0, 1);
    }
  }
}

// Warps per chunk (as a power of two): the fewest that give the grid's warps work.
int Log2PartsFor(uint64_t num_chunks, int max_ctas) {
  const uint64_t warps = static_cast<uint64_t>(max_ctas) * (kCopyThreads / 32);
  int log2_parts = 0;
  while (log2_parts < kMaxLog2Parts && (num_chunks << (log2_parts + 1)) <= warps) ++log2_parts;
  return log2_parts;
}

int CtasFor(uint64_t items, int max_ctas) {
  const uint64_t ctas_needed = (items + kCopyThreads / 32 - 1) / (kCopyThreads / 32);
  return static_cast<int>(std::min<uint64_t>(max_ctas, ctas_needed));
}

// A copy kernel's launch: a grid for the table's chunks, or for their slices.
using TableKernel = void (*)(const unsigned char*, unsigned char*, const uint4*, uint64_t, int);
Status LaunchTable(TableKernel kernel, const char* name, const void* src_base, void* dst_base,
                   const void* device_table, uint64_t num_chunks, const PlanCopyOptions& options,
                   void* stream) {
  if (num_chunks == 0) return Status::Ok();
  int max_ctas = options.max_ctas;
  if (max_ctas <= 0) {
    KV_ASSIGN_OR_RETURN(max_ctas, detail::SmCount());
  }
  const int log2_parts = Log2PartsFor(num_chunks, max_ctas);
  kernel<<<CtasFor(num_chunks << log2_parts, max_ctas), kCopyThreads, 0,
           static_cast<cudaStream_t>(stream)>>>(
      static_cast<const unsigned char*>(src_base), static_cast<unsigned char*>(dst_base),
      static_cast<const uint4*>(device_table), num_chunks, log2_parts);
  return detail::LaunchStatus(name);
}

}  // namespace

Status LaunchPlanCopyGroups(const void* src_base, void* dst_base, const void* device_table,
                            uint64_t num_chunks, const PlanCopyOptions& options, void* stream) {
  return LaunchTable(PlanCopyGroupKernel, "plan copy group kernel", src_base, dst_base,
                     device_table, num_chunks, options, stream);
}

Status LaunchPlanCopyBlocks(const void* src_base, void* dst_base, const void* device_table,
                            uint64_t num_chunks, const PlanCopyOptions& options, void* stream) {
  return LaunchTable(PlanCopyBlockKernel, "plan copy block kernel", src_base, dst_base,
                     device_table, num_chunks, options, stream);
}

Status LaunchPlanCopy(const void* src_base, void* dst_base, const void* device_table,
                      size_t /*num_runs*/, uint64_t num_chunks, const PlanCopyOptions& options,
                      void* stream) {
  return LaunchTable(PlanCopyKernel, "plan copy kernel", src_base, dst_base, device_table,
                     num_chunks, options, stream);
}

// ---- PlanCopier ------------------------------------------------------------------------------

namespace {

// One device table and its pinned staging buffer.
struct TableSlot {
  void* device_table = nullptr;
  void* staging = nullptr;
  uint64_t capacity = 0;
  cudaEvent_t uploaded = nullptr;   // staging may be rewritten once this fires
  cudaEvent_t copy_done = nullptr;  // device_table may be rewritten once this fires
  // copy_done was seen fired (or never recorded) since the slot was last handed out: Acquire
  // asks the driver no more (a cudaEventQuery costs 1.3-2.1 µs on the GPU hosts, and the scan
  // asked up to kSlotsScanned of them per copy: benchmarks/pd_gpu.md, twenty-seventh session).
  bool idle = true;

  ~TableSlot() {
    // Nothing may still read the buffers we free.
    if (copy_done) cudaEventSynchronize(copy_done);
    if (uploaded) cudaEventSynchronize(uploaded);
    if (device_table) cudaFree(device_table);
    if (staging) cudaFreeHost(staging);
    if (uploaded) cudaEventDestroy(uploaded);
    if (copy_done) cudaEventDestroy(copy_done);
  }

  Status Init() {
    KV_RETURN_IF_ERROR(
        detail::CudaStatus(cudaEventCreateWithFlags(&uploaded, cudaEventDisableTiming), "event"));
    KV_RETURN_IF_ERROR(
        detail::CudaStatus(cudaEventCreateWithFlags(&copy_done, cudaEventDisableTiming), "event"));
    std::vector<std::pair<void*, void*>> none;
    return Reserve(64 << 10, none);
  }

  // Makes the slot hold `bytes`. Only for a slot whose last copy finished (Acquire hands out no
  // other; the copy waited for its upload, so the staging buffer is free too). Outgrown buffers
  // go to `outgrown`, freed with the copier: cudaFree waits for the whole device, every copy
  // queued behind an engine's event included.
  Status Reserve(uint64_t bytes, std::vector<std::pair<void*, void*>>& outgrown) {
    if (bytes <= capacity) return Status::Ok();
    if (device_table || staging) {
      outgrown.emplace_back(std::exchange(device_table, nullptr), std::exchange(staging, nullptr));
    }
    capacity = 0;
    const uint64_t want = std::max<uint64_t>(bytes * 2, 64 << 10);
    KV_RETURN_IF_ERROR(detail::CudaStatus(cudaMalloc(&device_table, want), "run table"));
    KV_RETURN_IF_ERROR(detail::CudaStatus(cudaMallocHost(&staging, want), "run table staging"));
    capacity = want;
    return Status::Ok();
  }
};

}  // namespace

// Slots in flight beyond which Copy() fails (kUnavailable) instead of adding one: bounds the
// pinned and device memory of a pipeline whose copies are held back on the device (each slot is
// at least 128 KiB of each: Reserve doubles the 64 KiB Init asks for), and Copy() never waits on
// the device for a slot: a copy held behind an event that never fires would hold its caller
// forever.
constexpr size_t kMaxTableSlots = 256;
constexpr int kInitialTableSlots = 16;
// Finished slots Acquire() looks through for one big enough: a few event queries at most.
constexpr size_t kSlotsScanned = 16;

struct PlanCopier::Impl {
  PlanCopyOptions options;
  std::deque<std::unique_ptr<TableSlot>> slots;  // least recently used first
  cudaStream_t upload = nullptr;

  std::vector<std::pair<void*, void*>> outgrown;  // device table, pinned staging

  ~Impl() {
    if (upload) cudaStreamDestroy(upload);  // returns at once; the slots wait for its work
    slots.clear();  // waits for every slot's last copy: nothing reads the outgrown tables now
    for (auto [table, staging] : outgrown) {
      cudaFree(table);
      cudaFreeHost(staging);
    }
  }

  // A slot whose copy finished, else a new one: a copy held back on the device, e.g. behind an
  // engine's event, never makes the next Copy() wait for it. The copies of one copier run in
  // order on its stream, so the finished slots lead the deque (least recently used first); of
  // those the smallest with room for `bytes` is taken, and only without one does a finished
  // slot grow (a cudaMalloc and a cudaMallocHost, on the caller's thread).
  Result<TableSlot*> Acquire(uint64_t bytes) {
    size_t pick = slots.size(), fit = slots.size();
    for (size_t i = 0; i < slots.size() && i < kSlotsScanned; ++i) {
      if (!slots[i]->idle) {
        const cudaError_t state = cudaEventQuery(slots[i]->copy_done);
        if (state == cudaErrorNotReady) break;
        if (state != cudaSuccess) return detail::CudaStatus(state, "table slot");
        slots[i]->idle = true;
      }
      if (pick == slots.size()) pick = i;  // the oldest finished one, should none be big enough
      // The smallest that fits: big slots stay free for big pieces.
      if (slots[i]->capacity >= bytes &&
          (fit == slots.size() || slots[i]->capacity < slots[fit]->capacity)) {
        fit = i;
      }
    }
    if (fit < slots.size()) pick = fit;
    if (pick < slots.size()) {
      std::unique_ptr<TableSlot> slot = std::move(slots[pick]);
      slots.erase(slots.begin() + static_cast<std::ptrdiff_t>(pick));
      slot->idle = false;  // its copy is about to be staged
      slots.push_back(std::move(slot));
      return slots.back().get();
    }
    if (slots.size() >= kMaxTableSlots) {
      return Status::Unavailable("plan copy: " + std::to_string(kMaxTableSlots) +
                                 " copies still in flight, the oldest not yet run");
    }
    auto slot = std::make_unique<TableSlot>();
    KV_RETURN_IF_ERROR(slot->Init());
    slot->idle = false;
    slots.push_back(std::move(slot));
    return slots.back().get();
  }

  // Encodes into a free slot's staging buffer (`encode` returns the prefix and its table bytes),
  // uploads it on the copier's stream and launches (`launch`) on `stream` behind the upload.
  template <typename Encode, typename Launch>
  Result<PlanCopyPrefix> StageAndLaunch(uint64_t max_bytes, const Encode& encode,
                                        const Launch& launch, void* stream) {
    KV_ASSIGN_OR_RETURN(TableSlot * acquired, Acquire(max_bytes));
    TableSlot& slot = *acquired;
    KV_RETURN_IF_ERROR(slot.Reserve(max_bytes, outgrown));
    KV_ASSIGN_OR_RETURN(const auto encoded, encode(slot.staging));
    const auto [prefix, bytes] = encoded;
    if (prefix.chunks == 0) return prefix;  // entries of no bytes only
    KV_RETURN_IF_ERROR(
        detail::CudaStatus(cudaStreamWaitEvent(upload, slot.copy_done, 0), "order upload"));
    KV_RETURN_IF_ERROR(detail::CudaStatus(
        cudaMemcpyAsync(slot.device_table, slot.staging, bytes, cudaMemcpyHostToDevice, upload),
        "run table upload"));
    KV_RETURN_IF_ERROR(detail::CudaStatus(cudaEventRecord(slot.uploaded, upload), "record"));
    auto s = static_cast<cudaStream_t>(stream);
    KV_RETURN_IF_ERROR(detail::CudaStatus(cudaStreamWaitEvent(s, slot.uploaded, 0), "order copy"));
    KV_RETURN_IF_ERROR(launch(slot.device_table, prefix, s));
    KV_RETURN_IF_ERROR(detail::CudaStatus(cudaEventRecord(slot.copy_done, s), "record"));
    return prefix;
  }
};

PlanCopier::PlanCopier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PlanCopier::~PlanCopier() = default;

Result<std::unique_ptr<PlanCopier>> PlanCopier::Create(const PlanCopyOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  // Resolved once here (the streams belong to this device), not by two CUDA calls per Copy().
  if (impl->options.max_ctas <= 0) {
    KV_ASSIGN_OR_RETURN(impl->options.max_ctas, detail::SmCount());
  }
  KV_RETURN_IF_ERROR(detail::CudaStatus(
      cudaStreamCreateWithFlags(&impl->upload, cudaStreamNonBlocking), "upload stream"));
  // A new slot costs a cudaMalloc and a cudaMallocHost on the caller's thread, so the pool
  // starts with as many as kvd's cuda_ipc channels keep in flight (benchmarks/pd_gpu.md).
  for (int i = 0; i < kInitialTableSlots; ++i) {
    impl->slots.push_back(std::make_unique<TableSlot>());
    KV_RETURN_IF_ERROR(impl->slots.back()->Init());
  }
  return std::unique_ptr<PlanCopier>(new PlanCopier(std::move(impl)));
}

namespace {

// Copies `entries` (runs or groups, `chunks` chunks in all) by `copy_prefix(rest, max_chunks)`,
// which copies the longest prefix of `rest` that fits max_chunks (at least its first entry).
// On an idle stream the GPU would wait for the whole table to be encoded before the first
// byte moves (a fifth of a TP 1->2 request's copy: benchmarks/gpu.md, run 3). So such a copy
// goes in pieces, each
// kPieceGrowth times the last: the GPU starts after the first small piece, and the host
// encodes each later piece while the earlier ones run. On a busy stream the encoding already
// overlaps queued work, and every piece adds a kernel boundary, so the copy stays whole.
template <typename Entry, typename ChunksOf, typename PrefixFn>
Status CopyInPieces(std::span<const Entry> entries, uint64_t chunks, void* stream,
                    const ChunksOf& chunks_of, const PrefixFn& copy_prefix) {
  if (chunks == 0) return Status::Ok();
  const bool whole = chunks <= PlanCopier::kFirstPieceChunks * 2 ||
                     cudaStreamQuery(static_cast<cudaStream_t>(stream)) != cudaSuccess;
  uint64_t limit = whole ? chunks : PlanCopier::kFirstPieceChunks, left = chunks;
  for (size_t at = 0;; limit *= PlanCopier::kPieceGrowth) {
    // Entries of no bytes have no chunks: skipped, so that `most` fits the first entry with any
    // (a piece led by an empty entry could not hold a large one behind it).
    while (at < entries.size() && chunks_of(entries[at]) == 0) ++at;
    if (at == entries.size()) break;
    const uint64_t most = std::max(std::min(limit, left), chunks_of(entries[at]));
    KV_ASSIGN_OR_RETURN(PlanCopyPrefix done, copy_prefix(entries.subspan(at), most));
    at += done.runs;
    left -= done.chunks;
  }
  return Status::Ok();
}

}  // namespace

Status PlanCopier::Copy(const void* src_base, void* dst_base, std::span<const Run> runs,
                        void* stream) {
  return CopyInPieces(
      runs, PlanCopyChunks(runs), stream, [](const Run& r) { return PlanCopyRunChunks(r); },
      [&](std::span<const Run> rest, uint64_t most) {
        return CopyPrefix(src_base, dst_base, rest, most, stream);
      });
}

Result<PlanCopyPrefix> PlanCopier::CopyPrefix(const void* src_base, void* dst_base,
                                              std::span<const Run> runs, uint64_t max_chunks,
                                              void* stream) {
  using Encoded = std::pair<PlanCopyPrefix, uint64_t>;
  auto encode = [&](void* staging) -> Result<Encoded> {
    KV_ASSIGN_OR_RETURN(PlanCopyPrefix prefix, EncodePlanCopyPrefix(runs, max_chunks, staging));
    return Encoded{prefix, PlanCopyTableBytes(prefix.runs, prefix.chunks)};
  };
  auto launch = [&](const void* table, const PlanCopyPrefix& prefix, cudaStream_t s) {
    return LaunchPlanCopy(src_base, dst_base, table, prefix.runs, prefix.chunks, impl_->options, s);
  };
  return impl_->StageAndLaunch(PlanCopyTableBytes(runs.size(), max_chunks), encode, launch, stream);
}

Status PlanCopier::CopyGroups(const void* src_base, void* dst_base,
                              std::span<const RunGroup> groups, void* stream) {
  uint64_t chunks = 0;
  for (const RunGroup& g : groups) chunks += PlanCopyGroupChunks(g);
  return CopyInPieces(
      groups, chunks, stream, [](const RunGroup& g) { return PlanCopyGroupChunks(g); },
      [&](std::span<const RunGroup> rest, uint64_t most) {
        return CopyGroupPrefix(src_base, dst_base, rest, most, stream);
      });
}

Result<PlanCopyPrefix> PlanCopier::CopyGroupPrefix(const void* src_base, void* dst_base,
                                                   std::span<const RunGroup> groups,
                                                   uint64_t max_chunks, void* stream) {
  using Encoded = std::pair<PlanCopyPrefix, uint64_t>;
  auto encode = [&](void* staging) -> Result<Encoded> {
    KV_ASSIGN_OR_RETURN(PlanCopyPrefix prefix,
                        EncodePlanCopyGroupPrefix(groups, max_chunks, staging));
    return Encoded{prefix, prefix.chunks * sizeof(PlanCopyGroupChunk)};
  };
  auto launch = [&](const void* table, const PlanCopyPrefix& prefix, cudaStream_t s) {
    return LaunchPlanCopyGroups(src_base, dst_base, table, prefix.chunks, impl_->options, s);
  };
  return impl_->StageAndLaunch(max_chunks * sizeof(PlanCopyGroupChunk), encode, launch, stream);
}

Status PlanCopier::CopyBlocks(const void* src_base, void* dst_base,
                              std::span<const GroupBlocks> entries, void* stream) {
  uint64_t chunks = 0;
  for (const GroupBlocks& e : entries) chunks += PlanCopyBlockChunks(e);
  return CopyInPieces(
      entries, chunks, stream, [](const GroupBlocks& e) { return PlanCopyBlockChunks(e); },
      [&](std::span<const GroupBlocks> rest, uint64_t most) {
        return CopyBlockPrefix(src_base, dst_base, rest, most, stream);
      });
}

Result<PlanCopyPrefix> PlanCopier::CopyBlockPrefix(const void* src_base, void* dst_base,
                                                   std::span<const GroupBlocks> entries,
                                                   uint64_t max_chunks, void* stream) {
  using Encoded = std::pair<PlanCopyPrefix, uint64_t>;
  auto encode = [&](void* staging) -> Result<Encoded> {
    KV_ASSIGN_OR_RETURN(PlanCopyPrefix prefix,
                        EncodePlanCopyBlockPrefix(entries, max_chunks, staging));
    return Encoded{prefix, prefix.chunks * sizeof(PlanCopyBlockChunk)};
  };
  auto launch = [&](const void* table, const PlanCopyPrefix& prefix, cudaStream_t s) {
    return LaunchPlanCopyBlocks(src_base, dst_base, table, prefix.chunks, impl_->options, s);
  };
  return impl_->StageAndLaunch(max_chunks * sizeof(PlanCopyBlockChunk), encode, launch, stream);
}

// ---- The copy engine -------------------------------------------------------------------------

Status LaunchBatchCopy(const void* src_base, void* dst_base, std::span<const Run> runs,
                       void* stream) {
  if (stream == nullptr) {
    return Status::InvalidArgument("cudaMemcpyBatchAsync does not take the legacy default stream");
  }
  const auto* src = static_cast<const unsigned char*>(src_base);
  auto* dst = static_cast<unsigned char*>(dst_base);
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  dsts.reserve(std::min(runs.size(), kMaxBatchRuns));
  srcs.reserve(dsts.capacity());
  sizes.reserve(dsts.capacity());
  cudaMemcpyAttributes attributes{};
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attributes.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  size_t attribute_index = 0;
  for (size_t at = 0; at < runs.size();) {
    dsts.clear();
    srcs.clear();
    sizes.clear();
    for (; at < runs.size() && dsts.size() < kMaxBatchRuns; ++at) {
      if (runs[at].length == 0) continue;
      dsts.push_back(dst + runs[at].dst_offset);
      srcs.push_back(src + runs[at].src_offset);
      sizes.push_back(runs[at].length);
    }
    if (dsts.empty()) break;
    KV_RETURN_IF_ERROR(detail::CudaStatus(
        cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attributes,
                             &attribute_index, 1, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyBatchAsync"));
  }
  return Status::Ok();
}

}  // namespace kv::kernels
