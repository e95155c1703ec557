// Sealed frames: framing.h's frames (a u32 little-endian length, then the body) whose body is
// AEAD-sealed (aead.h) once a channel's handshake has agreed on a key per direction. On the wire
// a sealed frame is the length of the sealed body, then the ciphertext (as long as the message)
// and a 16-byte tag. The frame's number in its direction (0, 1, 2, ... counted by both ends, never
// sent) is the nonce, and the 4-byte header is the associated data. So a frame that was altered
// (body, tag or length), injected, replayed, reordered, dropped before a later one, or taken from
// the other direction or another channel does not open, and the channel must close: once one
// frame failed, FrameOpener refuses every later one. The length is in the clear, nothing else.
//
// Numbers are never reused and never wrap: after 2^64 - 1 frames a direction is spent and both
// classes refuse (kResourceExhausted), so the channel must be closed and opened again.
//
// Users: the peer port (daemon/connection.h) and the side channels of framed_socket.h
// (Socket::EnableSealing, FrameReader::EnableOpening). Each object is one direction of one
// channel; not thread-safe (the caller orders frames as they go on the wire).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "base/aead.h"
#include "base/framing.h"
#include "base/status.h"

namespace kv {

inline constexpr size_t kSealOverheadBytes = crypto::kAeadTagBytes;

class FrameSealer {
 public:
  // `first`: the number of the first frame. 0 on every real channel; a test of exhaustion
  // starts near the end.
  static Result<FrameSealer> Create(std::string_view key, uint64_t first = 0);

  // Appends the next frame (header, then the sealed `body`) to `out`. kInvalidArgument when the
  // sealed body would exceed `max_bytes`; kResourceExhausted when this direction's numbers are
  // spent. On an error nothing is appended and no number is used.
  Status Append(std::string_view body, std::string* out, uint32_t max_bytes);

  uint64_t next() const { return next_; }

 private:
  explicit FrameSealer(crypto::Aead aead, uint64_t first) : aead_(std::move(aead)), next_(first) {}
  crypto::Aead aead_;
  uint64_t next_;
};

class FrameOpener {
 public:
  static Result<FrameOpener> Create(std::string_view key, uint64_t first = 0);

  // The message of the next frame received, given its body as FrameDecoder::Next returned it (the
  // sealed body; its header is rebuilt from its length). kInvalidArgument, naming the frame's
  // number, when it does not open; kResourceExhausted when the numbers are spent. After an error
  // every later call fails: the stream cannot be trusted past a frame that did not open.
  Result<std::string> Open(std::string_view sealed);

  uint64_t next() const { return next_; }

 private:
  explicit FrameOpener(crypto::Aead aead, uint64_t first) : aead_(std::move(aead)), next_(first) {}
  crypto::Aead aead_;
  uint64_t next_;
  bool failed_ = false;
};

}  // namespace kv
