#include "base/framing.h"

#include <string>

namespace kv {

Status AppendFrame(std::string_view body, std::string* out, uint32_t max_bytes) {
  if (body.size() > max_bytes) {
    return Status::InvalidArgument("message of " + std::to_string(body.size()) +
                                   " bytes exceeds the frame limit of " +
                                   std::to_string(max_bytes));
  }
  char header[kFrameHeaderBytes];
  PutFrameHeader(static_cast<uint32_t>(body.size()), header);
  out->append(header, kFrameHeaderBytes);
  out->append(body);
  return Status::Ok();
}

Result<std::optional<std::string>> FrameDecoder::Next() {
  const size_t available = buffer_.size() - consumed_;
  if (available < kFrameHeaderBytes) return std::optional<std::string>();
  const auto* p = reinterpret_cast<const unsigned char*>(buffer_.data() + consumed_);
  const uint32_t n = static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                     static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
  if (n > max_bytes_) {
    return Status::InvalidArgument("frame announces " + std::to_string(n) +
                                   " bytes, above the limit of " + std::to_string(max_bytes_));
  }
  if (available - kFrameHeaderBytes < n) return std::optional<std::string>();
  std::string body = buffer_.substr(consumed_ + kFrameHeaderBytes, n);
  consumed_ += kFrameHeaderBytes + n;
  // Compact once the consumed prefix dominates, keeping appends amortised O(1).
  if (consumed_ > 4096 && consumed_ * 2 > buffer_.size()) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  return std::optional<std::string>(std::move(body));
}

}  // namespace kv
