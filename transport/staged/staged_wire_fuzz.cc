// libFuzzer target: bytes as a notification a peer's staged transport delivered through the
// inner transport, decoded as the receiving worker (and, for host chunks, the inner's progress
// thread) does, and as a region descriptor as import_remote() reads one. Nothing may crash, read
// out of bounds or overflow (ASan, UBSan), and what decodes must hold together: every message
// that decodes re-encodes to a frame that decodes, and re-encodes to the same bytes again (so
// no field is lost or misread between the two sides). Beside the backend: it includes the
// backend's own header (registered in tests/fuzz); wire.cc needs no UCX or CUDA.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "transport/staged/wire.h"

namespace {

using namespace kv::transport::staged;  // NOLINT: the backend's wire vocabulary throughout

void Require(bool holds) {
  if (!holds) __builtin_trap();
}

// Decodes `frame`; a message that decodes must re-encode to a fixed point.
template <typename Decode, typename Encode>
void RoundTrip(std::string_view frame, Decode decode, Encode encode) {
  auto msg = decode(frame);
  if (!msg.ok()) return;
  const std::string once = encode(*msg);
  auto again = decode(once);
  Require(again.ok() && encode(*again) == once);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view frame(reinterpret_cast<const char*>(data), size);
  auto type = PeekControl(frame);
  // Every decoder sees every frame, not only the one its type names: each must refuse what it
  // does not understand on its own.
  RoundTrip(frame, DecodeHello, EncodeHello);
  RoundTrip(frame, DecodeWelcome, EncodeWelcome);
  RoundTrip(frame, DecodeData, EncodeData);
  RoundTrip(frame, DecodeAck, EncodeAck);
  RoundTrip(frame, DecodeGetRequest, EncodeGetRequest);
  RoundTrip(frame, DecodeGetDone, EncodeGetDone);
  if (type.ok()) {
    Require(*type >= ControlType::kHello && *type <= ControlType::kGetDone);
  }
  if (IsRegionDescriptor(frame)) RoundTrip(frame, DecodeRegion, EncodeRegion);
  auto region = DecodeRegion(frame);
  Require(!region.ok() || IsRegionDescriptor(frame));
  return 0;
}
