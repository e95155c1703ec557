// The cuda_ipc backend's posting thread: encodes a batch's copy table and launches its copies
// away from the thread that posted it.
//
// Why: kvd's io thread posts every layer of every request, and encoding and launching a large
// batch held it long enough to feed the GPU late (benchmarks/pd_gpu.md, sixth session). Behind
// the poster the caller only validates the batch and copies its run list.
//
// Jobs run one at a time in submission order, round-robin over kChannels streams, each with its
// own RunCopier; streams and copiers belong to the poster's thread alone. A batch takes with it
// the batches queued behind it (before any note) between the same two regions that are ready to
// run too, up to kMaxCoalesced, as one copy with an event per batch: when the caller posts faster
// than launches go, fewer and larger launches, with no waiting for them. A batch is handed to
// `launched` with the channel it ran on, the event recorded behind its copies, and the launch
// status. A launch that failed part-way still has an event behind whatever it
// enqueued when one could be recorded: its completion has to wait for those copies, which write
// into the peer's memory all the same.
//
// Nothing here waits for an engine: kvd posts a batch only once the engine's event fired
// (daemon/event_gate.h). So jobs reach `launched` in submission order (a batch taken into an
// earlier one's launch goes with it), and notifications are handed over at their turn; the caller
// holds them to the batches before them (NoteGate).
//
// A job whose deadline passes while it is queued is not launched: `launched` gets it with
// kTimeout and no event.
//
// `busy_poll`: the thread spins on the queue instead of sleeping on a condition variable, so a
// batch is taken within about a microsecond rather than after a thread wake-up (~80 µs on the
// GPU machines, benchmarks/pd_gpu.md); it keeps one core busy while the transport lives.
//
// Thread-safety: Submit, TakeQueued and Recycle from any thread. `launched` runs on the poster's
// thread with no lock of the poster's held; it must not call Submit synchronously in a way that
// waits for the poster.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "gpu/cuda_util.h"
#include "gpu/run_copier.h"
#include "kernels/plan_copy.h"
#include "layout/plan.h"
#include "transport/transport.h"

namespace kv::transport::cuda_ipc {

// The backend is written in terms of the shared GPU pieces (gpu/).
using namespace ::kv::gpu;  // NOLINT(google-build-using-namespace): backend-private header

// A batch to copy, or a notification to queue behind the batches before it.
struct PostJob {
  PeerId peer = 0;
  bool is_note = false;
  Clock::time_point deadline;
  uint64_t seq = 0, first = 0;  // the caller's bookkeeping (NoteGate), handed back untouched
  // Batches:
  const void* src = nullptr;
  void* dst = nullptr;
  std::vector<Run> runs;
  std::vector<RunGroup> groups;
  std::vector<GroupBlocks> blocks;
  Completion done;
  // Notes:
  std::string note;
};

// How a batch's launch went.
struct Launch {
  int channel = -1;
  CudaEvent event;  // behind the batch's copies; empty when nothing could be recorded
  Status status;    // the launch error, if any
};

class Poster {
 public:
  static constexpr int kChannels = 4;
  using Launched = std::function<void(PostJob job, Launch launch)>;

  // Creates the channels on `device` and starts the thread. `forced` as in RunCopier::Create.
  // `trace` (may be empty): "i_take" with the job's seq as the thread takes a batch.
  static Result<std::unique_ptr<Poster>> Start(int device, std::optional<kernels::CopyPath> forced,
                                               bool busy_poll, Launched launched, TraceFn trace);
  // Stops the thread after the job in hand; the batches still queued complete with kAborted
  // (their notes are dropped). Then waits, at most kDrainTimeout per channel, for the copies on
  // the channels to finish, since they write into mappings the caller is about to close.
  ~Poster();
  Poster(const Poster&) = delete;
  Poster& operator=(const Poster&) = delete;

  void Submit(PostJob job);
  // Removes `peer`'s queued jobs and adds their batches' completions to *failed. A job of the
  // peer already in hand still goes to `launched`.
  void TakeQueued(PeerId peer, std::vector<Completion>* failed);
  // An event whose batch finished, for a later batch to record again: no cudaEventCreate on the
  // posting path.
  void Recycle(CudaEvent event);

  static constexpr auto kDrainTimeout = std::chrono::seconds(10);
  static constexpr size_t kMaxCoalesced = 8;

 private:
  struct Channel {
    CudaStream stream;
    std::unique_ptr<RunCopier> copier;
  };
  Poster(int device, bool busy_poll, Launched launched, TraceFn trace)
      : device_(device),
        busy_poll_(busy_poll),
        launched_(std::move(launched)),
        trace_(std::move(trace)) {}
  void Loop();
  // Busy polling: returns once a job was submitted after `seen` submissions, or on stop.
  void SpinPast(uint64_t seen) const;
  // Launches `job`, or fails it (its deadline passed).
  void Dispatch(PostJob job);
  // Launches `job` with the batches queued behind it (before any note) between the same two
  // regions that are ready to run too, up to kMaxCoalesced, as one copy; each gets an event.
  void LaunchCoalesced(PostJob job);
  Launch LaunchBatch(const PostJob& job);
  // An event recorded on `channel` behind what is on it; a failure waits for the channel
  // (bounded) instead, since copies may still run with nothing to watch them by.
  Launch RecordBehind(int channel, Status status);
  Result<CudaEvent> TakeEvent();

  const int device_;
  const bool busy_poll_;
  const Launched launched_;
  const TraceFn trace_;
  std::vector<Channel> channels_;   // the poster's thread only (and Start / the destructor)
  int next_channel_ = 0;            // likewise
  std::vector<PostJob> coalesced_;  // LaunchCoalesced's, reused: likewise
  PostJob merged_;                  // likewise

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<PostJob> queue_;            // guarded by mu_
  std::vector<CudaEvent> spare_events_;  // guarded by mu_
  bool stop_ = false;                    // guarded by mu_
  // Written under mu_, read without it by a spinning Loop.
  std::atomic<uint64_t> submitted_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace kv::transport::cuda_ipc
