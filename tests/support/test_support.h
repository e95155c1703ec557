// Helpers shared by the transport tests: bounded waits for completions, byte patterns.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include "transport/transport.h"

namespace kv::transport::testing {

// A completion whose status a test can wait for with a bound.
class Waiter {
 public:
  Waiter() : promise_(std::make_shared<std::promise<Status>>()), future_(promise_->get_future()) {}
  Completion callback() {
    return [p = promise_](Status s) { p->set_value(std::move(s)); };
  }
  // kInternal "no completion" when the bound passes: a test failure, never a hang.
  Status Wait(std::chrono::milliseconds bound = std::chrono::seconds(20)) {
    if (future_.wait_for(bound) != std::future_status::ready)
      return Status::Internal("no completion within " + std::to_string(bound.count()) + " ms");
    return future_.get();
  }

 private:
  std::shared_ptr<std::promise<Status>> promise_;
  std::future<Status> future_;
};

inline Clock::time_point In(std::chrono::milliseconds d) {
  return Clock::now() + d;
}

inline Status PostAndWait(Transport& t, Op op, const MemoryRegistration& local,
                          const RemoteMemory& remote, const std::vector<kv::Run>& runs,
                          std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
  Waiter waiter;
  Batch batch{op, &local, &remote, runs, In(deadline)};
  Status posted = t.post(batch, waiter.callback());
  if (!posted.ok()) return posted;
  return waiter.Wait(deadline + std::chrono::seconds(10));
}

inline uint8_t PatternByte(uint64_t i, uint32_t seed) {
  return static_cast<uint8_t>((i * 2654435761u + seed) >> 7);
}
inline void Fill(std::vector<uint8_t>& buffer, uint32_t seed) {
  for (uint64_t i = 0; i < buffer.size(); ++i) buffer[i] = PatternByte(i, seed);
}

// Runs of `count` × `length` bytes, the source packed, the destination spread with a gap of
// `gap` bytes between runs (so nothing merges and the untouched gaps are checkable).
inline std::vector<kv::Run> SpreadRuns(uint64_t count, uint64_t length, uint64_t gap) {
  std::vector<kv::Run> runs;
  for (uint64_t i = 0; i < count; ++i) runs.push_back({i * length, i * (length + gap), length});
  return runs;
}

// Expects dst to equal src at every run, and `untouched` elsewhere.
inline void ExpectCopied(const std::vector<uint8_t>& src, const std::vector<uint8_t>& dst,
                         const std::vector<kv::Run>& runs, uint8_t untouched) {
  std::vector<bool> written(dst.size(), false);
  for (const kv::Run& r : runs) {
    ASSERT_EQ(0, std::memcmp(src.data() + r.src_offset, dst.data() + r.dst_offset, r.length))
        << "run " << r.src_offset << " -> " << r.dst_offset;
    std::fill(written.begin() + r.dst_offset, written.begin() + r.dst_offset + r.length, true);
  }
  for (uint64_t i = 0; i < dst.size(); ++i) {
    if (!written[i]) {
      ASSERT_EQ(untouched, dst[i]) << "byte " << i << " outside every run changed";
    }
  }
}

}  // namespace kv::transport::testing
