// libFuzzer target: bytes from a peer or an engine socket, as kvd's connections take them. The
// input is cut into reads (its first byte seeds the read sizes), framed by FrameDecoder under a
// 64 KiB limit, and every frame parsed as each channel's message; layouts inside are turned into
// regions through FromWire, the check every layout from a peer or an engine passes. Nothing may
// crash, hang or read out of bounds (ASan, UBSan).
#include <cstddef>
#include <cstdint>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "base/framing.h"
#include "protocol/kvd.pb.h"
#include "protocol/wire_layout.h"

namespace {

void CheckLayouts(const kv::proto::PeerMessage& m) {
  if (m.has_hello()) {
    for (const auto& rank : m.hello().ranks()) {
      for (const auto& layout : rank.regions()) (void)kv::proto::FromWire(layout);
    }
  }
  if (m.has_want()) {
    for (const auto& rank : m.want().ranks()) {
      for (const auto& layout : rank.regions()) (void)kv::proto::FromWire(layout);
    }
  }
}

}  // namespace

// Protobuf logs every invalid UTF-8 string it refuses: millions of lines in a run.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  kv::FrameDecoder decoder(64 * 1024);
  size_t at = 1;
  uint32_t state = data[0] | 1u;
  while (at < size) {
    state = state * 1103515245u + 12345u;
    const size_t chunk = std::min<size_t>(size - at, 1 + (state >> 16) % 4096);
    decoder.Append(reinterpret_cast<const char*>(data + at), chunk);
    at += chunk;
    for (;;) {
      auto frame = decoder.Next();
      if (!frame.ok()) return 0;  // kvd closes the connection here
      if (!frame->has_value()) break;
      kv::proto::PeerMessage peer;
      if (peer.ParseFromString(**frame)) CheckLayouts(peer);
      kv::proto::EngineMessage engine;
      if (engine.ParseFromString(**frame) && engine.has_register_region()) {
        (void)kv::proto::FromWire(engine.register_region().layout());
      }
    }
  }
  return 0;
}
