#include "base/frame_seal.h"

#include <limits>
#include <utility>

namespace kv {
namespace {

constexpr uint64_t kSpent = std::numeric_limits<uint64_t>::max();

Status Spent() {
  return Status::ResourceExhausted(
      "sealed channel: 2^64 - 1 frames sent one way; its frame numbers are never reused (the "
      "channel must be opened again)");
}

}  // namespace

Result<FrameSealer> FrameSealer::Create(std::string_view key, uint64_t first) {
  KV_ASSIGN_OR_RETURN(crypto::Aead aead, crypto::Aead::Create(key));
  return FrameSealer(std::move(aead), first);
}

Status FrameSealer::Append(std::string_view body, std::string* out, uint32_t max_bytes) {
  if (next_ == kSpent) return Spent();
  if (body.size() > max_bytes || max_bytes - body.size() < kSealOverheadBytes) {
    return Status::InvalidArgument(
        "message of " + std::to_string(body.size()) + " bytes exceeds the frame limit of " +
        std::to_string(max_bytes) + " once sealed (+" + std::to_string(kSealOverheadBytes) + ")");
  }
  const size_t start = out->size();
  char header[kFrameHeaderBytes];
  PutFrameHeader(static_cast<uint32_t>(body.size() + kSealOverheadBytes), header);
  out->append(header, kFrameHeaderBytes);
  Status sealed = aead_.Seal(next_, std::string_view(header, kFrameHeaderBytes), body, out);
  if (!sealed.ok()) {
    out->resize(start);
    return sealed;
  }
  ++next_;
  return Status::Ok();
}

Result<FrameOpener> FrameOpener::Create(std::string_view key, uint64_t first) {
  KV_ASSIGN_OR_RETURN(crypto::Aead aead, crypto::Aead::Create(key));
  return FrameOpener(std::move(aead), first);
}

Result<std::string> FrameOpener::Open(std::string_view sealed) {
  if (failed_) {
    return Status::InvalidArgument("sealed channel: a frame before this one did not open");
  }
  if (next_ == kSpent) {
    failed_ = true;
    return Spent();
  }
  char header[kFrameHeaderBytes];
  PutFrameHeader(static_cast<uint32_t>(sealed.size()), header);
  auto message = aead_.Open(next_, std::string_view(header, kFrameHeaderBytes), sealed);
  if (!message.ok()) {
    failed_ = true;
    return Status::InvalidArgument(
        "sealed frame " + std::to_string(next_) +
        " did not open (altered, injected, replayed or reordered on the wire, or sealed under "
        "another key)");
  }
  ++next_;
  return message;
}

}  // namespace kv
