// Conversions between kv::LayoutSpec and its wire form, kv.proto.Layout.
//
// FromWire validates: a layout from a peer or an engine becomes a KvRegion only through
// KvRegion::Create, so sizes, strides and TP fields are checked before anything is planned.
#pragma once

#include "protocol/kvd.pb.h"
#include "layout/kv_region.h"
#include "base/status.h"

namespace kv::proto {

void ToWire(const LayoutSpec& spec, proto::Layout* out);
Result<KvRegion> FromWire(const proto::Layout& wire);

// Status <-> proto::Error.
void ToWire(const Status& status, proto::Error* out);
Status FromWire(const proto::Error& wire);

}  // namespace kv::proto
