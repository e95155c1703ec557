// BlockKey: the name of one offloaded block, as the engine computes it.
//
// vLLM names a full block by a hash of its tokens and of every block before it (the prefix block
// hash), so equal keys mean equal KV contents. kvd treats the key as opaque bytes: any value of
// 64 to 256 bits. Keys are already hashes, so hashing one for a table is cheap mixing, not
// cryptography. A BlockKey is an immutable value: cheap to copy, safe to share between threads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "layout/status.h"

namespace kv::offload {

class BlockKey {
 public:
  static constexpr size_t kMinBytes = 8;   // 64 bits
  static constexpr size_t kMaxBytes = 32;  // 256 bits

  BlockKey() = default;  // an empty key; never accepted by the pool

  // kInvalidArgument when the length is outside [kMinBytes, kMaxBytes].
  static Result<BlockKey> FromBytes(std::span<const uint8_t> bytes);
  // The 8 little-endian bytes of `value` (vLLM's 64-bit block hashes).
  static BlockKey FromUint64(uint64_t value);

  std::span<const uint8_t> bytes() const { return {bytes_.data(), size_}; }
  bool empty() const { return size_ == 0; }
  // Lowercase hex of every byte, for messages and kvctl.
  std::string ToHex() const;

  bool operator==(const BlockKey& other) const {
    return size_ == other.size_ && bytes_ == other.bytes_;
  }
  size_t Hash() const;

 private:
  std::array<uint8_t, kMaxBytes> bytes_{};  // bytes past size_ stay zero, so == can compare all
  uint8_t size_ = 0;
};

struct BlockKeyHash {
  size_t operator()(const BlockKey& key) const { return key.Hash(); }
};

}  // namespace kv::offload
