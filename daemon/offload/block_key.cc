#include "daemon/offload/block_key.h"

#include <cstring>

namespace kv::offload {

Result<BlockKey> BlockKey::FromBytes(std::span<const uint8_t> bytes) {
  if (bytes.size() < kMinBytes || bytes.size() > kMaxBytes) {
    return Status::InvalidArgument("block key of " + std::to_string(bytes.size()) +
                                   " bytes; keys are 8 to 32 bytes (64 to 256 bits)");
  }
  BlockKey key;
  std::memcpy(key.bytes_.data(), bytes.data(), bytes.size());
  key.size_ = static_cast<uint8_t>(bytes.size());
  return key;
}

BlockKey BlockKey::FromUint64(uint64_t value) {
  BlockKey key;
  for (size_t i = 0; i < 8; ++i) key.bytes_[i] = static_cast<uint8_t>(value >> (8 * i));
  key.size_ = 8;
  return key;
}

std::string BlockKey::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * size_);
  for (size_t i = 0; i < size_; ++i) {
    hex.push_back(kDigits[bytes_[i] >> 4]);
    hex.push_back(kDigits[bytes_[i] & 0xf]);
  }
  return hex;
}

size_t BlockKey::Hash() const {
  // Folds every 8-byte word through splitmix64's finaliser: engines hand us hashes, but a key
  // whose entropy sits past the first word (a 256-bit digest truncated by the engine) must still
  // spread over the table.
  uint64_t h = size_;
  for (size_t i = 0; i < kMaxBytes; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes_.data() + i, 8);
    h ^= word + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebULL;
    h ^= h >> 31;
  }
  return static_cast<size_t>(h);
}

}  // namespace kv::offload
