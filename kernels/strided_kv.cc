#include "kernels/strided_kv.h"

#include <string>

namespace kv::kernels {

const char* DTypeName(DType dtype) {
  return dtype == DType::kBFloat16 ? "bf16" : "fp16";
}

StridedKv DescribeRegion(const KvRegion& region) {
  StridedKv kv;
  kv.layers = region.size(Axis::kL);
  kv.blocks = region.size(Axis::kB);
  kv.heads = region.size(Axis::kH);
  kv.block_size = region.size(Axis::kN);
  kv.planes = region.size(Axis::kS);
  kv.content_bytes = region.size(Axis::kC);
  kv.layer_stride = region.stride(Axis::kL);
  kv.block_stride = region.stride(Axis::kB);
  kv.head_stride = region.stride(Axis::kH);
  kv.token_stride = region.stride(Axis::kN);
  kv.plane_stride = kv.planes > 1 ? region.stride(Axis::kS) : 0;
  kv.span_bytes = region.span_bytes();
  return kv;
}

Status ValidateStridedKv(const StridedKv& kv) {
  if (kv.layers <= 0 || kv.blocks <= 0 || kv.heads <= 0 || kv.block_size <= 0 ||
      kv.content_bytes <= 0 || (kv.planes != 1 && kv.planes != 2)) {
    return Status::InvalidArgument("kv cache sizes must be positive and planes 1 or 2");
  }
  if (kv.layer_stride < 0 || kv.block_stride < 0 || kv.head_stride < 0 || kv.token_stride < 0 ||
      kv.plane_stride < 0) {
    return Status::InvalidArgument("kv cache strides must be non-negative");
  }
  const uint64_t last =
      kv.offset(kv.layers - 1, kv.blocks - 1, kv.heads - 1, kv.block_size - 1, kv.planes - 1) +
      static_cast<uint64_t>(kv.content_bytes);
  if (last > kv.span_bytes) {
    return Status::OutOfRange("kv cache elements reach byte " + std::to_string(last) +
                              " past span " + std::to_string(kv.span_bytes));
  }
  return Status::Ok();
}

Result<PagedKv> SplitKv(const StridedKv& kv, int64_t head_dim, DType dtype) {
  KV_RETURN_IF_ERROR(ValidateStridedKv(kv));
  if (head_dim <= 0) return Status::InvalidArgument("head_dim must be positive");
  const int64_t half_bytes = head_dim * kDTypeBytes;
  PagedKv view;
  if (kv.planes == 2) {
    if (kv.content_bytes != half_bytes) {
      return Status::InvalidArgument(
          "with an S axis C must be head_dim*2 = " + std::to_string(half_bytes) + " bytes, not " +
          std::to_string(kv.content_bytes));
    }
    view.v_offset = kv.plane_stride;
  } else {
    if (kv.content_bytes != 2 * half_bytes) {
      return Status::InvalidArgument(
          "packed C must be 2*head_dim*2 = " + std::to_string(2 * half_bytes) + " bytes, not " +
          std::to_string(kv.content_bytes));
    }
    view.v_offset = half_bytes;
  }
  view.blocks = kv.blocks;
  view.heads = kv.heads;
  view.block_size = kv.block_size;
  view.head_dim = head_dim;
  view.block_stride = kv.block_stride;
  view.head_stride = kv.head_stride;
  view.token_stride = kv.token_stride;
  view.k_offset = 0;
  view.dtype = dtype;
  view.layer_span_bytes =
      kv.offset(0, kv.blocks - 1, kv.heads - 1, kv.block_size - 1, kv.planes - 1) +
      static_cast<uint64_t>(kv.content_bytes);
  return view;
}

}  // namespace kv::kernels
