// libFuzzer target: bytes from a peer or an engine socket, as kvd's connections take them. The
// input is cut into reads (its first byte seeds the read sizes), framed by FrameDecoder under a
// 64 KiB limit, and every frame parsed as each channel's message; layouts inside are turned into
// regions through FromWire, the check every layout from a peer or an engine passes. Every frame
// is also taken as a sealed frame (base/frame_seal.h) by an opener that never saw its key, which
// must refuse it, and sealed and opened again, which must give it back, unless one byte of it
// (chosen by the input) was flipped on the way, which must be refused. Nothing may crash, hang or
// read out of bounds (ASan, UBSan).
#include <cstddef>
#include <cstdint>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "base/frame_seal.h"
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

// The sealed-frame properties on one frame body: see the header comment. Traps when one fails.
void CheckSealed(const std::string& body, uint32_t state) {
  static const std::string kKey(32, 'k');
  auto stranger = kv::FrameOpener::Create(std::string(32, 'x'));
  if (!stranger.ok() || stranger->Open(body).ok()) __builtin_trap();
  auto sealer = kv::FrameSealer::Create(kKey, state);
  auto opener = kv::FrameOpener::Create(kKey, state);
  if (!sealer.ok() || !opener.ok()) __builtin_trap();
  std::string wire;
  if (!sealer->Append(body, &wire, 64 * 1024 + kv::kSealOverheadBytes).ok()) __builtin_trap();
  std::string sealed = wire.substr(kv::kFrameHeaderBytes);
  if ((state & 1) != 0) {
    sealed[(state >> 1) % sealed.size()] ^= static_cast<char>(1 + (state >> 24) % 255);
    if (opener->Open(sealed).ok()) __builtin_trap();
    return;
  }
  auto opened = opener->Open(sealed);
  if (!opened.ok() || *opened != body) __builtin_trap();
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
      CheckSealed(**frame, state);
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
