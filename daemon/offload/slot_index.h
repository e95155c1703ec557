// SlotIndex: which pool slot holds which key, in what state, and who may be evicted next.
//
// A key is first claimed (kStoring: its bytes are on the way, invisible to lookups), then
// published (kReady). Every slot a copy is reading or writing carries a pin; only ready slots
// with no pin sit on the LRU list, so eviction can never take a slot that is being stored or
// loaded. All operations are O(1).
//
// Not thread-safe: OffloadPool guards it with its mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "daemon/offload/block_key.h"

namespace kv::offload {

// A key in the pool: the engine's block key and the shard of the KV heads it holds, so that
// tensor-parallel ranks storing the same block hash keep their different heads apart (see
// OffloadPool::ShardOf).
struct PoolKey {
  int64_t shard = 0;
  BlockKey key;
  bool operator==(const PoolKey&) const = default;
};

struct PoolKeyHash {
  size_t operator()(const PoolKey& k) const {
    return k.key.Hash() ^ (static_cast<size_t>(k.shard) * 0x9e3779b97f4a7c15ULL);
  }
};

class SlotIndex {
 public:
  enum class State : uint8_t { kStoring, kReady };
  struct Entry {
    uint32_t slot = 0;
    State state = State::kStoring;
    uint32_t pins = 0;
    std::list<PoolKey>::iterator lru;  // valid only while ready and unpinned
  };

  explicit SlotIndex(uint32_t num_slots);

  const Entry* Find(const PoolKey& key) const;

  uint32_t capacity() const { return capacity_; }
  // Keys held, plus slots retired by stuck copies (they stay "in flight" for good).
  uint32_t used() const { return static_cast<uint32_t>(entries_.size()) + retired_; }
  uint32_t free_slots() const { return static_cast<uint32_t>(free_.size()); }
  // Ready and unpinned: what Claim() may take when no slot is free.
  uint32_t evictable() const { return static_cast<uint32_t>(lru_.size()); }

  // Gives `key` (absent) a slot in state kStoring with one pin, evicting the least recently used
  // evictable key when no slot is free; that key is returned through `evicted`. nullopt when
  // every slot is pinned or storing.
  std::optional<uint32_t> Claim(const PoolKey& key, std::optional<PoolKey>* evicted);
  // kStoring -> kReady, dropping the pin Claim() took.
  void Publish(const PoolKey& key);
  // Forgets a key and frees its slot (a store that failed). The key must be unpinned apart from
  // the pin Claim() took.
  void Abandon(const PoolKey& key);
  // Forgets a key whose store is stuck (its copy missed its deadline and may still land), and
  // never hands its slot out again: the key can be stored afresh elsewhere, the slot is lost.
  void Retire(const PoolKey& key);

  void Pin(const PoolKey& key);
  void Unpin(const PoolKey& key);
  // Marks a ready, unpinned key most recently used.
  void Touch(const PoolKey& key);

 private:
  void LeaveLru(Entry& e);
  void EnterLru(const PoolKey& key, Entry& e);

  uint32_t capacity_;
  std::unordered_map<PoolKey, Entry, PoolKeyHash> entries_;
  std::list<PoolKey> lru_;      // front: least recently used
  std::vector<uint32_t> free_;  // a stack; lowest slot on top
  uint32_t retired_ = 0;
};

}  // namespace kv::offload
