#include "layout/kv_region.h"

#include <string>
#include <string_view>

namespace kv {
namespace {

// Every span stays below this, so sums of offsets inside a region never wrap an int64.
constexpr int64_t kMaxSpan = int64_t{1} << 62;

int Index(Axis a) {
  return static_cast<int>(a);
}

constexpr std::string_view kAxisNames = "LBHNSC";  // in Axis order

// One byte of an order for an error text: 'X' if printable ASCII, else its value (a lone byte of
// a multi-byte character is not text, and protobuf refuses a reply that is not UTF-8).
std::string AxisByte(char c) {
  const auto b = static_cast<unsigned char>(c);
  if (b >= 0x20 && b < 0x7f) return std::string("'") + c + "'";
  return "byte " + std::to_string(b);
}

// The order with L prepended when absent, or an error naming what is wrong with it.
Result<std::string> NormalizeOrder(const std::string& order) {
  std::string full = order.find('L') == std::string::npos ? "L" + order : order;
  bool seen[kNumAxes] = {};
  for (char c : full) {
    const std::optional<Axis> axis = AxisFromName(c);
    if (!axis)
      return Status::InvalidArgument("order '" + order + "': unknown axis " + AxisByte(c) +
                                     " (axes are L, B, H, N, S, C)");
    const int a = Index(*axis);
    if (seen[a])
      return Status::InvalidArgument("order '" + order + "': axis " + std::string(1, c) +
                                     " appears twice");
    seen[a] = true;
  }
  for (char c : std::string("BHNC")) {
    if (!seen[Index(*AxisFromName(c))])
      return Status::InvalidArgument("order '" + order + "': axis " + std::string(1, c) +
                                     " is missing");
  }
  if (full.back() != 'C')
    return Status::InvalidArgument("order '" + order +
                                   "': C must be the innermost (last) axis, it is contiguous");
  return full;
}

Status CheckPositive(const char* field, int64_t value) {
  if (value > 0) return Status::Ok();
  return Status::InvalidArgument(std::string(field) + " must be positive, got " +
                                 std::to_string(value));
}

Status ResolveTensorParallel(LayoutSpec& spec) {
  if (spec.tp_size < 1)
    return Status::InvalidArgument("tp_size must be at least 1, got " +
                                   std::to_string(spec.tp_size));
  if (spec.tp_rank < 0 || spec.tp_rank >= spec.tp_size)
    return Status::InvalidArgument("tp_rank " + std::to_string(spec.tp_rank) + " is outside [0, " +
                                   std::to_string(spec.tp_size) + ")");
  if (spec.total_heads < 0)
    return Status::InvalidArgument("total_heads must not be negative, got " +
                                   std::to_string(spec.total_heads));
  const std::string heads = std::to_string(spec.heads);
  if (spec.replicated) {
    if (spec.total_heads == 0) spec.total_heads = spec.heads;
    if (spec.total_heads != spec.heads)
      return Status::InvalidArgument("a replicated cache holds every head: total_heads " +
                                     std::to_string(spec.total_heads) + " != heads " + heads);
    return Status::Ok();
  }
  // heads comes from a peer or a file: the product is checked so that it cannot wrap.
  int64_t all_ranks = 0;
  if (__builtin_mul_overflow(spec.heads, int64_t{spec.tp_size}, &all_ranks))
    return Status::InvalidArgument("heads " + heads + " x tp_size " + std::to_string(spec.tp_size) +
                                   " overflows");
  if (spec.total_heads == 0) spec.total_heads = all_ranks;
  const std::string total = std::to_string(spec.total_heads);
  const std::string tp = std::to_string(spec.tp_size);
  if (spec.total_heads >= spec.tp_size) {
    if (all_ranks != spec.total_heads)
      return Status::InvalidArgument("heads " + heads + " x tp_size " + tp + " != total_heads " +
                                     total);
    return Status::Ok();
  }
  // Fewer heads than ranks: vLLM replicates, each rank holding one head, each head on
  // tp_size / total_heads ranks.
  if (spec.heads != 1 || spec.tp_size % spec.total_heads != 0)
    return Status::InvalidArgument(
        "total_heads " + total + " < tp_size " + tp +
        " needs heads == 1 and tp_size divisible by total_heads (heads " + heads + ")");
  return Status::Ok();
}

}  // namespace

std::optional<Axis> AxisFromName(char name) {
  const size_t i = kAxisNames.find(name);
  if (i == std::string_view::npos) return std::nullopt;
  return static_cast<Axis>(i);
}

char AxisName(Axis a) {
  return kAxisNames[Index(a)];
}

Result<KvRegion> KvRegion::Create(const LayoutSpec& input) {
  KvRegion r;
  r.spec_ = input;
  LayoutSpec& spec = r.spec_;
  KV_ASSIGN_OR_RETURN(r.order_, NormalizeOrder(spec.order));
  KV_RETURN_IF_ERROR(CheckPositive("layers", spec.layers));
  KV_RETURN_IF_ERROR(CheckPositive("blocks", spec.blocks));
  KV_RETURN_IF_ERROR(CheckPositive("heads", spec.heads));
  KV_RETURN_IF_ERROR(CheckPositive("block_size", spec.block_size));
  KV_RETURN_IF_ERROR(CheckPositive("content_bytes", spec.content_bytes));
  KV_RETURN_IF_ERROR(ResolveTensorParallel(spec));

  r.sizes_ = {spec.layers,       spec.blocks, spec.heads, spec.block_size, r.has_kv_axis() ? 2 : 1,
              spec.content_bytes};
  for (int i = 0; i < kNumAxes; ++i) {
    if (spec.strides[i] < 0)
      return Status::InvalidArgument("stride of " + std::string(1, AxisName(Axis(i))) +
                                     " must not be negative, got " +
                                     std::to_string(spec.strides[i]));
  }
  if (spec.strides[Index(Axis::kC)] > 1)
    return Status::InvalidArgument("C is contiguous: its stride must be 1 (or 0), got " +
                                   std::to_string(spec.strides[Index(Axis::kC)]));
  if (!r.has_kv_axis() && spec.strides[Index(Axis::kS)] != 0)
    return Status::InvalidArgument("a stride for S is given but the order '" + spec.order +
                                   "' has no S axis");

  // Innermost first: each stride defaults to, and must be at least, the extent of the axis
  // inside it. `span` is the offset of the last byte plus one.
  int64_t extent = spec.content_bytes;
  int64_t span = spec.content_bytes;
  r.strides_[Index(Axis::kC)] = 1;
  for (int i = static_cast<int>(r.order_.size()) - 2; i >= 0; --i) {
    const Axis a = *AxisFromName(r.order_[i]);
    const char inner = r.order_[i + 1];
    int64_t stride = spec.strides[Index(a)] != 0 ? spec.strides[Index(a)] : extent;
    if (stride < extent)
      return Status::InvalidArgument("stride of " + std::string(1, r.order_[i]) + " (" +
                                     std::to_string(stride) + " bytes) is smaller than the " +
                                     std::string(1, inner) + " axis inside it spans (" +
                                     std::to_string(extent) + " bytes): elements would overlap");
    int64_t next_extent = 0, next_span = 0;
    if (__builtin_mul_overflow(stride, r.sizes_[Index(a)], &next_extent) ||
        __builtin_mul_overflow(stride, r.sizes_[Index(a)] - 1, &next_span) ||
        __builtin_add_overflow(next_span, span, &next_span) || next_extent > kMaxSpan)
      return Status::InvalidArgument("layout spans more than 2^62 bytes at axis " +
                                     std::string(1, r.order_[i]));
    r.strides_[Index(a)] = stride;
    extent = next_extent;
    span = next_span;
  }
  r.span_bytes_ = static_cast<uint64_t>(span);
  if (spec.region_bytes < 0)
    return Status::InvalidArgument("region_bytes must not be negative, got " +
                                   std::to_string(spec.region_bytes));
  if (spec.region_bytes != 0 && span > spec.region_bytes)
    return Status::OutOfRange("the strides reach past the region: they span " +
                              std::to_string(span) + " bytes, the region has " +
                              std::to_string(spec.region_bytes));
  spec.strides = r.strides_;
  return r;
}

int64_t KvRegion::logical_content_bytes() const {
  return size(Axis::kS) * size(Axis::kC);
}

uint64_t KvRegion::offset(int64_t l, int64_t b, int64_t h, int64_t n, int64_t s) const {
  return static_cast<uint64_t>(l * stride(Axis::kL) + b * stride(Axis::kB) + h * stride(Axis::kH) +
                               n * stride(Axis::kN) + s * stride(Axis::kS));
}

bool KvRegion::blocks_first() const {
  return order_[0] == 'B';
}

uint64_t KvRegion::page_bytes() const {
  int64_t bytes = size(Axis::kH) * size(Axis::kN) * size(Axis::kS) * size(Axis::kC);
  if (blocks_first()) bytes *= size(Axis::kL);
  return static_cast<uint64_t>(bytes);
}

bool KvRegion::page_is_contiguous() const {
  // Elements never collide, so a page fills one byte range exactly when the range from its
  // first to its last byte holds no more bytes than the page has.
  uint64_t last = 0;
  for (Axis a : {Axis::kL, Axis::kH, Axis::kN, Axis::kS, Axis::kC}) {
    if (a == Axis::kL && !blocks_first()) continue;
    last += static_cast<uint64_t>((size(a) - 1) * stride(a));
  }
  return last + 1 == page_bytes();
}

uint64_t KvRegion::page_offset(int64_t layer, int64_t block) const {
  int64_t off = block * stride(Axis::kB);
  if (!blocks_first()) off += layer * stride(Axis::kL);
  return static_cast<uint64_t>(off);
}

KvRegion::KvLocation KvRegion::kv(int64_t l, int64_t b, int64_t h, int64_t n) const {
  if (has_kv_axis()) {
    return {offset(l, b, h, n, 0), offset(l, b, h, n, 1), static_cast<uint64_t>(size(Axis::kC))};
  }
  const uint64_t half = static_cast<uint64_t>(size(Axis::kC) / 2);
  const uint64_t k = offset(l, b, h, n);
  return {k, k + half, half};
}

int64_t KvRegion::global_head(int64_t local) const {
  if (spec_.replicated) return local;
  if (spec_.total_heads >= spec_.tp_size) return spec_.tp_rank * size(Axis::kH) + local;
  return spec_.tp_rank * spec_.total_heads / spec_.tp_size;
}

int64_t KvRegion::local_head(int64_t global) const {
  int64_t local = global - first_global_head();
  return local >= 0 && local < size(Axis::kH) ? local : -1;
}

}  // namespace kv
