// LayoutSpec: how an engine describes one KV cache to kvd (vLLM's standardized layout model).
//
// Public: installed as <kv/layout_spec.h>. Plain values only (no functions defined elsewhere), so
// the header exports no symbol. kvd validates a spec when it is registered (KvRegion::Create);
// see DESIGN.md, "The layout model": axes L (layer), B (block), H (local KV head), N (token slot
// in a block), C (content bytes of one head-token) and optionally S (K/V, size 2).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace kv {

enum class Axis : int { kL = 0, kB, kH, kN, kS, kC };
inline constexpr int kNumAxes = 6;

enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };

// Where a region's bytes live. device is the CUDA ordinal for kCuda, -1 for host.
struct MemoryLocation {
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;
  static MemoryLocation Host() { return {}; }
  static MemoryLocation Cuda(int ordinal) { return {MemoryKind::kCuda, ordinal}; }
  bool operator==(const MemoryLocation&) const = default;
};

// What a user writes (and what the wire carries): sizes, an order and optional strides.
struct LayoutSpec {
  // Physical order, outermost first: a permutation of "LBHNC", optionally with 'S' anywhere
  // before 'C'. An order without 'L' ("SBNHC", "BSNHC": vLLM's per-layer legacy tensors) gets
  // L prepended as the outermost axis.
  std::string order = "LBNHC";
  int64_t layers = 0;
  int64_t blocks = 0;
  int64_t heads = 0;          // local KV heads on this rank
  int64_t block_size = 0;     // tokens per block (N)
  int64_t content_bytes = 0;  // C: bytes of one head-token (K+V packed, or K alone with S)
  // Byte strides indexed by Axis; 0 means "dense default from the order". C's stride is 1.
  // Padding is allowed: a stride may exceed the dense size of everything inside it.
  std::array<int64_t, kNumAxes> strides{};
  // Tensor parallelism: see KvRegion::global_head().
  int tp_rank = 0;
  int tp_size = 1;
  int64_t total_heads = 0;  // 0 means heads * tp_size (heads when replicated)
  bool replicated = false;  // MLA-style: every rank holds every head
  // Bytes registered for the region; 0 means exactly the span of the strides. Create fails when
  // the strides reach past it.
  int64_t region_bytes = 0;
};

}  // namespace kv
