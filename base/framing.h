// Framing of the control plane: every message is a u32 little-endian length, then that many
// bytes of one Protobuf message. A length above the connection's maximum is an error before any
// byte of the body is buffered, so a peer cannot make kvd allocate what it announces.
//
// FrameDecoder is a value owned by one connection; not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kv {

inline constexpr uint32_t kDefaultMaxFrameBytes = 4u << 20;
inline constexpr size_t kFrameHeaderBytes = 4;

// Writes the little-endian length prefix of a frame of `n` bytes.
inline void PutFrameHeader(uint32_t n, char out[kFrameHeaderBytes]) {
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) out[i] = static_cast<char>(n >> (8 * i));
}

// Appends the length prefix and `body` to `out`. kInvalidArgument when body exceeds max_bytes.
Status AppendFrame(std::string_view body, std::string* out,
                   uint32_t max_bytes = kDefaultMaxFrameBytes);

class FrameDecoder {
 public:
  explicit FrameDecoder(uint32_t max_bytes = kDefaultMaxFrameBytes) : max_bytes_(max_bytes) {}

  // Buffers bytes read from the connection.
  void Append(const char* data, size_t size) { buffer_.append(data, size); }

  // The next complete frame's body, nullopt when more bytes are needed, or kInvalidArgument for
  // an oversized length (the connection must then be closed: the stream cannot resynchronise).
  Result<std::optional<std::string>> Next();

  // Bytes of a frame started but not completed; a connection that ends with pending bytes
  // ended mid-message.
  size_t pending_bytes() const { return buffer_.size() - consumed_; }

 private:
  uint32_t max_bytes_;
  std::string buffer_;
  size_t consumed_ = 0;
};

}  // namespace kv
