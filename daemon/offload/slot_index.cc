#include "daemon/offload/slot_index.h"

#include <cassert>

namespace kv::offload {

SlotIndex::SlotIndex(uint32_t num_slots) : capacity_(num_slots) {
  // Handing slots out in ascending order keeps a fresh pool's consecutive keys in consecutive
  // slots, which the planner then merges into long runs.
  free_.reserve(num_slots);
  for (uint32_t s = num_slots; s > 0; --s) free_.push_back(s - 1);
  entries_.reserve(num_slots);
}

const SlotIndex::Entry* SlotIndex::Find(const PoolKey& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

std::optional<uint32_t> SlotIndex::Claim(const PoolKey& key, std::optional<PoolKey>* evicted) {
  assert(!entries_.count(key));
  evicted->reset();
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    PoolKey victim = lru_.front();
    lru_.pop_front();
    slot = entries_.at(victim).slot;
    entries_.erase(victim);
    *evicted = std::move(victim);
  } else {
    return std::nullopt;
  }
  Entry e;
  e.slot = slot;
  e.state = State::kStoring;
  e.pins = 1;
  entries_.emplace(key, e);
  return slot;
}

void SlotIndex::Publish(const PoolKey& key) {
  Entry& e = entries_.at(key);
  assert(e.state == State::kStoring && e.pins > 0);
  e.state = State::kReady;
  if (--e.pins == 0) EnterLru(key, e);
}

void SlotIndex::Abandon(const PoolKey& key) {
  auto it = entries_.find(key);
  assert(it != entries_.end() && it->second.state == State::kStoring && it->second.pins == 1);
  free_.push_back(it->second.slot);
  entries_.erase(it);
}

void SlotIndex::Retire(const PoolKey& key) {
  auto it = entries_.find(key);
  assert(it != entries_.end() && it->second.state == State::kStoring && it->second.pins == 1);
  entries_.erase(it);
  ++retired_;
}

void SlotIndex::Pin(const PoolKey& key) {
  Entry& e = entries_.at(key);
  if (e.pins++ == 0 && e.state == State::kReady) LeaveLru(e);
}

void SlotIndex::Unpin(const PoolKey& key) {
  Entry& e = entries_.at(key);
  assert(e.pins > 0);
  if (--e.pins == 0 && e.state == State::kReady) EnterLru(key, e);
}

void SlotIndex::Touch(const PoolKey& key) {
  Entry& e = entries_.at(key);
  if (e.state == State::kReady && e.pins == 0) lru_.splice(lru_.end(), lru_, e.lru);
}

void SlotIndex::LeaveLru(Entry& e) {
  lru_.erase(e.lru);
}

void SlotIndex::EnterLru(const PoolKey& key, Entry& e) {
  e.lru = lru_.insert(lru_.end(), key);
}

}  // namespace kv::offload
