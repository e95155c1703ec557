// BlockKey: the name of one offloaded block, as the engine computes it.
//
// vLLM names a full block by a hash of its tokens and of every block before it (the prefix block
// hash), so equal keys mean equal KV contents. kvd treats the key as opaque bytes: any value of
// 64 to 256 bits. Keys are already hashes, so hashing one for a table is cheap mixing, not
// cryptography. A BlockKey is an immutable value: cheap to copy, safe to share between threads.
// Public: installed as <kv/block_key.h>; header-only, so it exports no symbol.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "kv/status.h"

namespace kv::offload {

class BlockKey {
 public:
  static constexpr size_t kMinBytes = 8;   // 64 bits
  static constexpr size_t kMaxBytes = 32;  // 256 bits

  BlockKey() = default;  // an empty key; never accepted by the pool

  // kInvalidArgument when the length is outside [kMinBytes, kMaxBytes].
  static inline Result<BlockKey> FromBytes(std::span<const uint8_t> bytes);
  // The 8 little-endian bytes of `value` (vLLM's 64-bit block hashes).
  static inline BlockKey FromUint64(uint64_t value);

  std::span<const uint8_t> bytes() const { return {bytes_.data(), size_}; }
  bool empty() const { return size_ == 0; }
  // Lowercase hex of every byte, for messages and kvctl.
  inline std::string ToHex() const;

  bool operator==(const BlockKey& other) const {
    return size_ == other.size_ && bytes_ == other.bytes_;
  }
  inline size_t Hash() const;

 private:
  std::array<uint8_t, kMaxBytes> bytes_{};  // bytes past size_ stay zero, so == can compare all
  uint8_t size_ = 0;
};

inline Result<BlockKey> BlockKey::FromBytes(std::span<const uint8_t> bytes) {
  if (bytes.size() < kMinBytes || bytes.size() > kMaxBytes) {
    return Status::InvalidArgument("block key of " + std::to_string(bytes.size()) +
                                   " bytes; keys are 8 to 32 bytes (64 to 256 bits)");
  }
  BlockKey key;
  std::memcpy(key.bytes_.data(), bytes.data(), bytes.size());
  key.size_ = static_cast<uint8_t>(bytes.size());
  return key;
}

inline BlockKey BlockKey::FromUint64(uint64_t value) {
  BlockKey key;
  for (size_t i = 0; i < 8; ++i) key.bytes_[i] = static_cast<uint8_t>(value >> (8 * i));
  key.size_ = 8;
  return key;
}

inline std::string BlockKey::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * size_);
  for (size_t i = 0; i < size_; ++i) {
    hex.push_back(kDigits[bytes_[i] >> 4]);
    hex.push_back(kDigits[bytes_[i] & 0xf]);
  }
  return hex;
}

inline size_t BlockKey::Hash() const {
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

struct BlockKeyHash {
  size_t operator()(const BlockKey& key) const { return key.Hash(); }
};

}  // namespace kv::offload
