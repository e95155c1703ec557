// The host_ipc backend's copies: a batch's runs (and its run groups' rows) memcpy'd from one
// mapping into another, by the calling thread alone or split by bytes over it and `threads - 1`
// helper threads of its own.
//
// Why helpers: one thread's memcpy is what the P/D ceiling measures, but on the dev VM two
// threads copied 256 MiB at 33–35 GB/s against one thread's 17–20 (benchmarks/pd.md, host_ipc):
// where the host has a core to spare, a batch may land sooner split in two. In kvd's P/D on that
// 2-core VM it did not (its other core runs kvd's io thread and the engines), hence a setting,
// default 1. Batches under kMinSplitBytes are never split: splitting the README demo's 512 KiB
// batches cost 0.1–0.15 of the ceiling there (a hand-off is a thread wake-up).
//
// Thread-safety: Copy from one thread at a time (the backend's copy thread). The helpers live as
// long as the Copier.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "layout/plan.h"

namespace kv::transport::host_ipc {

class Copier {
 public:
  static constexpr uint64_t kMinSplitBytes = 1 << 20;
  static constexpr int kMaxThreads = 16;

  // `threads` in [1, kMaxThreads]: the caller plus threads - 1 helpers.
  explicit Copier(int threads);
  ~Copier();
  Copier(const Copier&) = delete;
  Copier& operator=(const Copier&) = delete;

  // Copies every run and every group row from src + src_offset to dst + dst_offset; returns once
  // all of them landed. The ranges were checked by the caller (run_check.h).
  void Copy(const char* src, char* dst, std::span<const Run> runs,
            std::span<const RunGroup> groups);

 private:
  struct Piece {
    const char* src;
    char* dst;
    uint64_t length;
  };
  static void CopyPieces(const std::vector<Piece>& pieces);
  void Helper(size_t index);

  const int threads_;
  std::vector<std::vector<Piece>> shares_;  // one per thread, index 0 the caller's

  std::mutex mu_;
  std::condition_variable start_, done_;
  uint64_t generation_ = 0;  // guarded by mu_: bumped per split batch
  int pending_ = 0;          // guarded by mu_: helpers still copying this generation
  bool stop_ = false;        // guarded by mu_
  std::vector<std::thread> helpers_;
};

}  // namespace kv::transport::host_ipc
