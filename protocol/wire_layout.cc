#include "protocol/wire_layout.h"

#include <string>

#include "base/utf8.h"

namespace kv::proto {

void ToWire(const LayoutSpec& spec, proto::Layout* out) {
  out->set_order(spec.order);
  out->set_layers(spec.layers);
  out->set_blocks(spec.blocks);
  out->set_heads(spec.heads);
  out->set_block_size(spec.block_size);
  out->set_content_bytes(spec.content_bytes);
  out->clear_strides();
  for (int64_t s : spec.strides) out->add_strides(s);
  out->set_tp_rank(spec.tp_rank);
  out->set_tp_size(spec.tp_size);
  out->set_total_heads(spec.total_heads);
  out->set_replicated(spec.replicated);
}

Result<KvRegion> FromWire(const proto::Layout& wire) {
  if (wire.strides_size() != 0 && wire.strides_size() != kNumAxes) {
    return Status::InvalidArgument("layout carries " + std::to_string(wire.strides_size()) +
                                   " strides, expected 0 or " + std::to_string(kNumAxes));
  }
  if (wire.order().size() > 8) {
    return Status::InvalidArgument("layout order '" + wire.order().substr(0, 16) +
                                   "...' is longer than any valid order");
  }
  LayoutSpec spec;
  spec.order = wire.order();
  spec.layers = wire.layers();
  spec.blocks = wire.blocks();
  spec.heads = wire.heads();
  spec.block_size = wire.block_size();
  spec.content_bytes = wire.content_bytes();
  for (int i = 0; i < wire.strides_size(); ++i) spec.strides[i] = wire.strides(i);
  spec.tp_rank = wire.tp_rank();
  spec.tp_size = wire.tp_size();
  spec.total_heads = wire.total_heads();
  spec.replicated = wire.replicated();
  return KvRegion::Create(spec);
}

void ToWire(const Status& status, proto::Error* out) {
  out->set_code(static_cast<int32_t>(status.code()));
  // proto3 refuses a string field that is not UTF-8: one bad byte would make the whole reply
  // unreadable to the engine or peer (the daemon fuzz target found an error quoting one byte).
  out->set_message(ToValidUtf8(status.message()));
}

Status FromWire(const proto::Error& wire) {
  if (wire.code() == 0) return Status::Ok();
  const int last = static_cast<int>(Code::kInternal);
  Code code =
      wire.code() > 0 && wire.code() <= last ? static_cast<Code>(wire.code()) : Code::kInternal;
  return Status(code, wire.message());
}

}  // namespace kv::proto
