#include "transport/host_ipc/copier.h"

#include <algorithm>
#include <cstring>

#include "base/thread_name.h"

namespace kv::transport::host_ipc {

Copier::Copier(int threads)
    : threads_(std::clamp(threads, 1, kMaxThreads)), shares_(static_cast<size_t>(threads_)) {
  for (int i = 1; i < threads_; ++i) {
    helpers_.emplace_back([this, i] {
      NameThisThread("hipc-copy-" + std::to_string(i));
      Helper(static_cast<size_t>(i));
    });
  }
}

Copier::~Copier() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void Copier::CopyPieces(const std::vector<Piece>& pieces) {
  for (const Piece& p : pieces) std::memcpy(p.dst, p.src, p.length);
}

void Copier::Copy(const char* src, char* dst, std::span<const Run> runs,
                  std::span<const RunGroup> groups) {
  uint64_t total = 0;
  for (const Run& r : runs) total += r.length;
  for (const RunGroup& g : groups) total += g.count * g.length;
  if (threads_ == 1 || total < kMinSplitBytes) {
    for (const Run& r : runs) std::memcpy(dst + r.dst_offset, src + r.src_offset, r.length);
    for (const RunGroup& g : groups) {
      for (uint64_t i = 0; i < g.count; ++i) {
        const Run r = g.row(i);
        std::memcpy(dst + r.dst_offset, src + r.src_offset, r.length);
      }
    }
    return;
  }
  // Shares of about total / threads bytes each, cutting runs where a share fills.
  for (auto& share : shares_) share.clear();
  const uint64_t share_bytes = (total + static_cast<uint64_t>(threads_) - 1) / threads_;
  size_t index = 0;
  uint64_t filled = 0;
  auto add = [&](const Run& r) {
    for (uint64_t done = 0; done < r.length;) {
      const bool last_share = index + 1 == shares_.size();  // takes whatever is left
      const uint64_t piece =
          last_share ? r.length - done : std::min(r.length - done, share_bytes - filled);
      shares_[index].push_back({src + r.src_offset + done, dst + r.dst_offset + done, piece});
      done += piece;
      filled += piece;
      if (!last_share && filled == share_bytes) {
        ++index;
        filled = 0;
      }
    }
  };
  for (const Run& r : runs) add(r);
  for (const RunGroup& g : groups) {
    for (uint64_t i = 0; i < g.count; ++i) add(g.row(i));
  }
  {
    std::lock_guard lock(mu_);
    ++generation_;
    pending_ = threads_ - 1;
  }
  start_.notify_all();
  CopyPieces(shares_[0]);
  // No deadline: the helpers are memcpy'ing mapped memory this batch holds; they always finish.
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
}

void Copier::Helper(size_t index) {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock lock(mu_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    CopyPieces(shares_[index]);
    bool last = false;
    {
      std::lock_guard lock(mu_);
      last = --pending_ == 0;
    }
    if (last) done_.notify_one();
  }
}

}  // namespace kv::transport::host_ipc
