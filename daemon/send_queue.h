// SendQueue: kvd's outgoing copies of the source side (scheduler.h). Batches planned during one
// pass of the io loop are merged where they share the source region, the destination region and
// the engine event they wait on, if any, and posted together: the saves an engine sends back to
// back, one per request of a batched forward pass, become one post, not one per request and
// layer (each post costs the transport several CUDA calls, and the nccl backend a round of its
// protocol). Layers that wait on no event (written before they were saved) all share one group.
// Each LayerNotice (one per layer pushed, one per request pulled) waits in the queue behind the
// posts queued before it.
//
// Threading: io thread only, except that the transport's completions (its thread) count landed
// bytes and note failed requests under the queue's own lock before they hop to the io thread.
// Errors: a post the transport (or the hook) refuses ends its requests through Hooks::fail.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "daemon/event_gate.h"
#include "daemon/registry.h"
#include "daemon/transfer_support.h"
#include "layout/plan.h"
#include "transport/transport.h"

namespace kv::daemon {

// One post: runs of one or more requests' layers out of one source region into one remote
// region, waiting on one engine event or none.
struct SendGroup {
  uint64_t engine_id = 0;
  std::shared_ptr<Region> source;
  std::shared_ptr<transport::RemoteMemory> remote;
  // The engine event a GPU source's copies wait on: its layer, or -1 for none.
  int event_layer = -1;
  Plan plan;  // every part's runs, planned straight into it
  struct Part {
    std::string request_id;
    int layer = 0;  // the last layer of the part's range
    uint64_t bytes = 0;
    Clock::time_point queued = Clock::now();  // for kvd_layer_seconds (metrics_hooks.cc)
    uint64_t generation = 0;                  // of the SourceRequest it belongs to
  };
  std::vector<Part> parts;
  Clock::time_point deadline = Clock::time_point::max();
};

class SendQueue {
 public:
  // What the queue asks of the daemon; every hook runs on the io thread.
  struct Hooks {
    // Posts `batch` out of engine `engine_id`'s regions, first waiting in the event gate for
    // its event of `event_layer` where that is >= 0 (Core::PostFromEngine); an error if the
    // engine left or the transport refused.
    std::function<Status(uint64_t engine_id, int event_layer, const transport::Batch& batch,
                         transport::Completion done)>
        post;
    // The generation of the live source request `request_id`, if there is one.
    std::function<std::optional<uint64_t>(const std::string& request_id)> generation_of;
    // Ends source request `request_id` with `why` (its destinations hear it).
    std::function<void(const std::string& request_id, const Status& why)> fail;
    // A posted group completed: its parts, in order, with the transport's status.
    std::function<void(const std::vector<SendGroup::Part>& parts, const Status& status)> done;
  };

  // `gate` carries the notices (EventGate::Notify); both it and `io` outlive the queue.
  SendQueue(boost::asio::io_context& io, EventGate* gate, Hooks hooks);
  SendQueue(const SendQueue&) = delete;
  SendQueue& operator=(const SendQueue&) = delete;

  // Queues runs of `request_id` (of `generation`) in the group it shares everything with:
  // `append` plans them into the group's plan (PlanTransfer and LayerPlan::AppendLayer leave it
  // unchanged on error). Returns the runs and bytes appended; nothing is queued when there are
  // none. The first queued item schedules Flush on the io loop, and FlushIfDue may flush
  // earlier.
  struct Queued {
    uint64_t runs = 0;
    uint64_t bytes = 0;
  };
  Result<Queued> Send(uint64_t engine_id, const std::shared_ptr<Region>& source,
                      const std::shared_ptr<transport::RemoteMemory>& remote, int layer,
                      bool wait_for_engine, const std::string& request_id, uint64_t generation,
                      Clock::time_point deadline, const std::function<Status(Plan*)>& append);
  // A LayerNotice for the transport peer `peer`, handed over after every post queued before it;
  // `layer` (the last it names) is for the trace.
  void Notice(transport::PeerId peer, const std::string& request_id, int layer,
              std::string message);

  // Posts every queued group, then hands the transport every queued notice of a request still
  // alive: a request whose post failed has ended with that error, and its notices are dropped;
  // so are those of a request one of whose batches has completed with an error the io thread
  // has not handled yet (failed_). A batch still moving when its notice is handed over is the
  // transport's to watch (cuda_ipc: transport/note_gate.h).
  void Flush();
  // Called after each message from an engine or a peer (never inside a handler, which may be
  // iterating over requests Flush can end). The scheduled flush runs only after every handler
  // queued before it, so queued copies also go out at once when less than kLowWaterBytes of this
  // kvd's posts are still moving: the link is about to idle. There is no flush timer: it makes
  // more, smaller posts (benchmarks/pd_gpu.md has the figures).
  void FlushIfDue();
  static constexpr uint64_t kLowWaterBytes = uint64_t{64} << 20;
  // Posts the queued groups at once, their notices left for Flush, when none of this kvd's posts
  // is moving: the link idles until something goes. So a wave's first layer starts copying while
  // the io thread still plans the rest of the Want (every layer saved before it arrived), not
  // after (issue 24). At most one post more per idle link than Flush alone makes. Safe inside a
  // handler that iterates over requests: a refused post ends its requests from the io loop later.
  void PostIfIdle();

  uint64_t batches_posted() const { return batches_posted_; }

 private:
  // A LayerNotice waiting for the posts queued before it.
  struct QueuedNotice {
    transport::PeerId peer = 0;
    std::string request_id;
    int layer = 0;
    std::string message;
  };

  void ScheduleFlush();
  // Keeps a posted group's run vector for a later group (the transport copied the runs), within
  // a bound: a wave of long requests fills megabytes of runs per group, and fresh vectors that
  // size cost page faults on every fill and an munmap on every free.
  void RecycleRuns(std::vector<Run> runs);
  // A refused post ends its requests through Hooks::fail: at once, or (`defer_failures`) from
  // the io loop, for callers inside a handler.
  void Post(SendGroup& group, bool defer_failures = false);
  void HandOver(std::vector<QueuedNotice> notices);

  boost::asio::io_context& io_;
  EventGate* const gate_;
  const Hooks hooks_;
  std::vector<SendGroup> groups_;
  std::vector<std::vector<Run>> spare_runs_;  // empty, with capacity (RecycleRuns)
  size_t spare_run_bytes_ = 0;
  std::vector<QueuedNotice> notices_;
  bool flush_scheduled_ = false;
  uint64_t batches_posted_ = 0;
  // Of posts: bytes posted (io thread) and bytes whose completion the transport reported (its
  // thread: the io loop may be busy with a storm of saves when the link runs dry, and FlushIfDue
  // must see that then). In flight: the difference.
  uint64_t bytes_posted_ = 0;
  std::atomic<uint64_t> bytes_landed_{0};
  // Requests a batch of which completed with an error, from the transport's thread until the io
  // thread has ended them, by id and generation.
  std::mutex failed_mu_;
  std::unordered_set<std::string> failed_;
};

}  // namespace kv::daemon
