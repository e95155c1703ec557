// KvRegion: the shape of one KV cache in vLLM's standardized layout model. Only the shape: where
// a cache's bytes live is its memory's business (kvd's Region, the connector's KvCache).
//
// A region is a logical tensor over axes L (layer), B (block), H (local KV head), N (token slot
// in a block), C (content bytes of one head-token) and optionally S (K/V, size 2), stored in any
// order with a byte stride per axis. C is always contiguous (stride 1). For attention caches C
// packs K then V; with an S axis, C is K (or V) alone. See ../DESIGN.md, "The layout model".
//
// A KvRegion is an immutable value: cheap to copy, safe to share between threads.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "kv/layout_spec.h"
#include "base/status.h"

namespace kv {

char AxisName(Axis a);  // 'L', 'B', ...
// The axis a letter names, or nullopt for a letter that names none.
std::optional<Axis> AxisFromName(char name);

class KvRegion {
 public:
  // Validates the spec: sizes positive, order a permutation, strides that neither overlap one
  // another nor let elements collide, TP rank/size/heads consistent. `span_bytes` of the
  // created region is the smallest byte count that holds every element.
  //
  // Strides nest in the order's sense: each axis's stride is at least the bytes spanned by the
  // axis just inside it (size × stride), so distinct elements never share a byte and offsets
  // grow with the order's lexicographic order. The stored spec() is normalised: every stride
  // filled in (S's is 0 without an S axis), total_heads resolved. Spans are capped at 2^62
  // bytes so that offset arithmetic can never wrap. Creating a region from another's spec()
  // gives the same region. Errors: kInvalidArgument naming the field, kOutOfRange when the
  // strides reach past region_bytes.
  static Result<KvRegion> Create(const LayoutSpec& spec);

  const LayoutSpec& spec() const { return spec_; }
  // The order with L always present ("LSBNHC" for a spec of "SBNHC").
  const std::string& order() const { return order_; }

  bool has_kv_axis() const { return spec_.order.find('S') != std::string::npos; }
  int64_t size(Axis a) const { return sizes_[static_cast<int>(a)]; }      // S is 1 when absent
  int64_t stride(Axis a) const { return strides_[static_cast<int>(a)]; }  // bytes
  uint64_t span_bytes() const { return span_bytes_; }

  // Logical content of one (layer, block, head, token): C, or 2·C with S (K first, then V).
  int64_t logical_content_bytes() const;

  // Byte offset from the region's base of content byte 0 of element (l, b, h, n, s).
  uint64_t offset(int64_t l, int64_t b, int64_t h, int64_t n, int64_t s = 0) const;

  // ---- Page view ----------------------------------------------------------------------------
  // Blocks-first (B outermost): a page is one block of every layer, and the region is viewed as
  // (num_blocks, page_bytes) with row stride stride(B). Otherwise a page is one block of one
  // layer at page_offset(l, b). page_is_contiguous() says whether a page's bytes are one range
  // (false for orders like LHBNC, where heads sit outside blocks).
  bool blocks_first() const;
  bool page_is_contiguous() const;
  uint64_t page_bytes() const;                               // dense bytes of one page
  uint64_t page_offset(int64_t layer, int64_t block) const;  // layer ignored when blocks-first

  // ---- Virtual K/V split ----------------------------------------------------------------------
  // Where K and V of (layer, block, head, token) lie: the halves of C, or S = 0 and S = 1.
  struct KvLocation {
    uint64_t k_offset;
    uint64_t v_offset;
    uint64_t bytes;  // bytes of K (== bytes of V)
  };
  // With packed C, K is the first C/2 bytes and V the next C/2: meaningful for attention caches
  // only (an opaque Mamba page has no K/V; callers do not ask).
  KvLocation kv(int64_t l, int64_t b, int64_t h, int64_t n) const;

  // ---- Tensor parallelism ---------------------------------------------------------------------
  // Global KV head held by local head h, as vLLM assigns them: rank r holds [r·H, (r+1)·H) when
  // total_heads ≥ tp_size; the one replicated head floor(r·total_heads/tp_size) when
  // total_heads < tp_size; every head (global == local) when replicated.
  int64_t global_head(int64_t local_head) const;
  // Local head holding global head g, or -1 when this rank does not hold it.
  int64_t local_head(int64_t global_head) const;
  // Global heads held by this rank: [first_global_head(), first_global_head() + size(kH)), one
  // contiguous range in every case above.
  int64_t first_global_head() const { return global_head(0); }
  int64_t total_heads() const { return spec_.total_heads; }

 private:
  LayoutSpec spec_;
  std::string order_;
  std::array<int64_t, kNumAxes> sizes_{};
  std::array<int64_t, kNumAxes> strides_{};
  uint64_t span_bytes_ = 0;
};

}  // namespace kv
