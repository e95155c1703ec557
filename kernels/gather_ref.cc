#include <cstring>
#include <string>

#include "kernels/gather.h"

namespace kv::kernels {
namespace {

Status CheckBlocks(const StridedKv& kv, std::span<const int64_t> blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (blocks[i] < 0 || blocks[i] >= kv.blocks) {
      return Status::OutOfRange("block id " + std::to_string(blocks[i]) + " at index " +
                                std::to_string(i) + " outside [0, " + std::to_string(kv.blocks) +
                                ")");
    }
  }
  return Status::Ok();
}

// Visits every (staging offset, cache offset) pair of C-byte rows in staging order.
template <typename Fn>
void ForEachRow(const StridedKv& kv, std::span<const int64_t> blocks, const PageSlice& s, Fn fn) {
  uint64_t staged = 0;
  for (int64_t block : blocks) {
    for (int64_t l = s.layer_begin; l < s.layer_end; ++l) {
      for (int64_t h = s.head_begin; h < s.head_end; ++h) {
        for (int64_t n = 0; n < kv.block_size; ++n) {
          for (int64_t p = 0; p < kv.planes; ++p) {
            fn(staged, kv.offset(l, block, h, n, p));
            staged += static_cast<uint64_t>(kv.content_bytes);
          }
        }
      }
    }
  }
}

}  // namespace

Result<PageSlice> ResolveSlice(const StridedKv& kv, const PageSlice& slice) {
  PageSlice s = slice;
  if (s.layer_end == -1) s.layer_end = kv.layers;
  if (s.head_end == -1) s.head_end = kv.heads;
  if (s.layer_begin < 0 || s.layer_begin >= s.layer_end || s.layer_end > kv.layers) {
    return Status::InvalidArgument("layer range [" + std::to_string(s.layer_begin) + ", " +
                                   std::to_string(s.layer_end) + ") is empty or outside [0, " +
                                   std::to_string(kv.layers) + ")");
  }
  if (s.head_begin < 0 || s.head_begin >= s.head_end || s.head_end > kv.heads) {
    return Status::InvalidArgument("head range [" + std::to_string(s.head_begin) + ", " +
                                   std::to_string(s.head_end) + ") is empty or outside [0, " +
                                   std::to_string(kv.heads) + ")");
  }
  return s;
}

Result<uint64_t> StagingBytes(const StridedKv& kv, const PageSlice& slice, int64_t num_blocks) {
  KV_ASSIGN_OR_RETURN(PageSlice s, ResolveSlice(kv, slice));
  if (num_blocks < 0) return Status::InvalidArgument("negative block count");
  return static_cast<uint64_t>(num_blocks * (s.layer_end - s.layer_begin) *
                               (s.head_end - s.head_begin) * kv.block_size * kv.planes *
                               kv.content_bytes);
}

Status GatherHost(const StridedKv& kv, const void* base, std::span<const int64_t> blocks,
                  const PageSlice& slice, void* staging) {
  KV_RETURN_IF_ERROR(ValidateStridedKv(kv));
  KV_ASSIGN_OR_RETURN(PageSlice s, ResolveSlice(kv, slice));
  KV_RETURN_IF_ERROR(CheckBlocks(kv, blocks));
  const auto* src = static_cast<const unsigned char*>(base);
  auto* dst = static_cast<unsigned char*>(staging);
  ForEachRow(kv, blocks, s, [&](uint64_t staged, uint64_t cached) {
    std::memcpy(dst + staged, src + cached, kv.content_bytes);
  });
  return Status::Ok();
}

Status ScatterHost(const StridedKv& kv, void* base, std::span<const int64_t> blocks,
                   const PageSlice& slice, const void* staging) {
  KV_RETURN_IF_ERROR(ValidateStridedKv(kv));
  KV_ASSIGN_OR_RETURN(PageSlice s, ResolveSlice(kv, slice));
  KV_RETURN_IF_ERROR(CheckBlocks(kv, blocks));
  const auto* src = static_cast<const unsigned char*>(staging);
  auto* dst = static_cast<unsigned char*>(base);
  ForEachRow(kv, blocks, s, [&](uint64_t staged, uint64_t cached) {
    std::memcpy(dst + cached, src + staged, kv.content_bytes);
  });
  return Status::Ok();
}

}  // namespace kv::kernels
