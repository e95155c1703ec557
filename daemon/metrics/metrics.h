// kvd's Prometheus metrics: what the io thread counts as requests end and layers land, kept in
// atomics so the metrics thread reads them without a lock the io thread waits on, and rendered in
// the Prometheus text exposition format (version 0.0.4) with what DaemonStatus already reports.
//
// Thread-safety: every method may be called from any thread. The io thread only increments
// (relaxed atomics; one short mutex per finished request for its peer's counters, never held
// while rendering text), so a scrape never delays a transfer by more than that.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "protocol/kvd.pb.h"

namespace kv::daemon::metrics {

// A fixed-bucket histogram of seconds. Buckets are upper bounds; +Inf is implicit.
class Histogram {
 public:
  static constexpr size_t kBuckets = 14;
  // 100 us to 60 s: a layer on NVLink is ~100 us, a request across a lossy link seconds.
  static constexpr std::array<double, kBuckets> kBounds = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1, 10, 60};

  void Observe(std::chrono::nanoseconds d);
  // Appends `name`_bucket/_sum/_count lines with `labels` ("" or `a="b",c="d"`).
  void Render(const std::string& name, const std::string& labels, std::string* out) const;

 private:
  std::array<std::atomic<uint64_t>, kBuckets + 1> counts_{};  // last: above every bound
  std::atomic<uint64_t> sum_ns_{0};
};

enum class Role { kSource, kDestination };

class Metrics {
 public:
  // A transfer ended: on the source side (bytes sent) or the destination side (bytes received),
  // with the peer daemon's name, after `elapsed` since the request reached this kvd.
  void RequestDone(Role role, const std::string& peer, const std::string& transport, bool ok,
                   uint64_t bytes, std::chrono::nanoseconds elapsed);
  // A layer's copies landed at the destination, `elapsed` after every prefill rank had saved it
  // and it was queued for the transport.
  void LayerLanded(std::chrono::nanoseconds elapsed) { layer_.Observe(elapsed); }
  // A peer declared dead after missing its heartbeats.
  void HeartbeatTimeout() { heartbeat_timeouts_.fetch_add(1, std::memory_order_relaxed); }
  void SnapshotTimeout() { snapshot_timeouts_.fetch_add(1, std::memory_order_relaxed); }

  // The whole exposition. `status` (null if the io thread did not answer in time) adds the
  // gauges and the counters DaemonStatus carries (bytes, runs, offload pool).
  std::string Render(const proto::DaemonStatus* status, const std::string& version) const;

 private:
  struct PeerCounters {
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> done{0};
    std::atomic<uint64_t> failed{0};
  };
  // (peer, transport, role) -> counters; entries are never removed, so counters only grow.
  using Key = std::tuple<std::string, std::string, Role>;
  mutable std::mutex mu_;
  std::map<Key, std::shared_ptr<PeerCounters>> peers_;
  Histogram request_[2];  // by Role
  Histogram layer_;
  std::atomic<uint64_t> heartbeat_timeouts_{0};
  std::atomic<uint64_t> snapshot_timeouts_{0};
};

// `text` as a Prometheus label value (backslash, quote and newline escaped).
std::string EscapeLabel(const std::string& text);

}  // namespace kv::daemon::metrics
