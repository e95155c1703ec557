// EventGate: where kvd holds work that must not start before an engine's CUDA event fired, seen
// from the host, so that no transport and no copy stream of kvd ever waits on an engine.
//
// Why on the host: an engine's per-layer event (gpu/layer_events.h) is recorded before the
// layer's kernels are done, and a stream made to wait for it on the device stays blocked for good
// when the engine dies before its stream reached the record (benchmarks/pd_gpu.md, seventh
// session). So the transports only ever see a plain Transport::post.
//
// What waits here: a send group (Post) or any other piece of work (Hold: the offload pool's store
// copy) whose event had not fired when it came. One poller thread queries the held events
// (EventProbe, a cudaEventQuery on the opened IPC event) every kPoll, or every kBackoff once
// none has fired for kSpin (an engine far behind, or a dead one whose work waits out its
// deadline, costs no core). The moment an event fired, its work starts on the poller thread
// itself (a batch goes to Transport::post from there: no hop through kvd's io thread, which may
// be busy with a storm of saves). Work that comes later, or whose event fired already, goes
// ahead of held work: one engine's late layer holds up nobody else. Work whose deadline passes
// while held fails alone, with kTimeout, having started nothing (so written nothing).
//
// Notifications (Notify): Transport::notify promises delivery only after the batches posted
// before it landed, and a held batch is not posted yet. So a note to a peer waits here behind the
// peer's batches held when it came (and behind the peer's notes held before it: notes keep their
// order); once those are posted it goes to Transport::notify, which orders it behind them. If one
// of them failed here, the note is dropped, as transport/note_gate.h says (the peer learns of
// the failure through its request failing, never through a note for bytes that never came).
//
// Event probes run on the poller thread: those given an EventKey without the gate's lock, once a
// pass for all the work that shares the key (a step's saves of one layer wait for one event, and
// a cudaEventQuery costs 1.3-2.1 µs on the GPU hosts: asked per batch under the lock, they kept
// Post and Notify on kvd's io thread waiting); those without one with the lock held. Either way
// they must be quick and must not call into the gate. The poller does not set a CUDA device:
// cudaEventQuery needs none.
//
// Threading: every method is thread-safe. Post's, Hold's and Notify's work and every completion
// run either on the caller's thread (work that need not wait, and failures reported as a return
// value) or on the poller thread; none may call into the gate synchronously from a transport
// completion that holds a lock of the caller's. The destructor fails what is held with kAborted
// (on the destroying thread) and drops held notes; destroy the gate before the transport and
// before whatever held work names (kvd: before the offload pool).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "layout/plan.h"
#include "transport/note_gate.h"
#include "transport/transport.h"

namespace kv::daemon {

// Whether an engine's event fired: true, false (not yet), or the error its work failed with.
// Called on the caller's thread once, then on the poller thread until it says true or fails.
using EventProbe = std::function<Result<bool>()>;

// Which event a probe asks about: probes with equal non-empty keys ask the same one (kvd: an
// engine's LayerEvents and a layer), so one answer serves them all in a pass. Empty: no sharing.
struct EventKey {
  const void* owner = nullptr;
  int64_t index = 0;
  bool empty() const { return owner == nullptr; }
  bool operator==(const EventKey&) const = default;
};

class EventGate {
 public:
  using Clock = std::chrono::steady_clock;

  static constexpr auto kPoll = std::chrono::microseconds(10);
  static constexpr auto kSpin = std::chrono::milliseconds(10);
  static constexpr auto kBackoff = std::chrono::microseconds(100);

  // Starts the poller thread. `transport` must outlive the gate; it may be null for a gate
  // that only Holds (tests of the offload pool).
  explicit EventGate(transport::Transport* transport);
  ~EventGate();
  EventGate(const EventGate&) = delete;
  EventGate& operator=(const EventGate&) = delete;

  // Transport::post() of `batch` once `fired` says so. No probe, or one that says the event
  // fired already: posted here and now, and post()'s status is returned. A probe that fails:
  // its error, nothing posted, `done` not called. Otherwise the batch is held (its runs,
  // groups and blocks copied) and OK is returned; `done` then runs exactly once: with the
  // transport's completion once posted; with post()'s error if the transport refused the batch
  // then; with kTimeout if batch.deadline passed first, or the probe's error, or kAborted
  // (Disconnect, or the gate destroyed) — in these three cases nothing was posted. batch.local and
  // batch.remote must stay valid until `done` ran, as for post() (kvd: `done` holds them).
  Status Post(const transport::Batch& batch, EventProbe fired, transport::Completion done,
              EventKey key = {});

  // Transport::notify() once every batch of `peer` held here when it came has been posted, and
  // after the notes of `peer` held before it; dropped if one of those batches failed here. The
  // transport's refusal is returned when it is called here and now; when a held note is refused
  // later, `refused` (if any) runs with the error, on the poller thread with the gate's lock held
  // (it must not call into the gate).
  Status Notify(transport::PeerId peer, std::string message,
                std::function<void(Status)> refused = {});

  // Other work behind an event: `start` runs once `fired` says so (here and now if it does
  // already), or `fail` runs once instead with kTimeout at `deadline`, the probe's error, or
  // kAborted when the gate is destroyed; exactly one of the two runs, exactly once.
  void Hold(EventProbe fired, Clock::time_point deadline, std::function<void()> start,
            std::function<void(Status)> fail, EventKey key = {});

  // Fails `peer`'s held batches with kAborted (nothing of them was posted, so nothing can still
  // write), drops its held notes, then calls Transport::disconnect(peer).
  void Disconnect(transport::PeerId peer);

  // Held work (batches and other), for tests and status.
  size_t held() const;

 private:
  struct Held {
    EventProbe fired;
    EventKey key;
    Clock::time_point deadline;
    transport::PeerId peer = 0;
    uint64_t seq = 0;  // batches: their number in notes_; 0 for other work
    // Starts the work; a batch returns post()'s refusal, and `fail` then runs with it.
    std::function<Status()> start;
    std::function<void(Status)> fail;
  };
  struct HeldNote {
    transport::NoteGate::Ticket ticket;
    std::string message;
    std::function<void(Status)> refused;
  };

  void Loop();
  // Asks each key of the held work once, with `lock` released meanwhile, into answers_.
  void AskKeys(std::unique_lock<std::mutex>& lock);
  // The held work whose event fired (into *start) or that fails (into *failed), in order
  // (caller holds mu_); a failed batch is recorded as such in notes_ here, before its completion
  // runs, so that a note the caller sends once it heard of the failure is not held to it.
  // Returns whether any moved.
  bool TakeOpenLocked(std::vector<Held>* start, std::vector<std::pair<Held, Status>>* failed);
  // A held batch was posted (or failed): hands on the notes of its peer that waited for it
  // (caller holds mu_).
  void BatchDoneLocked(transport::PeerId peer, uint64_t seq, bool posted);
  void ReleaseNotesLocked(transport::PeerId peer);

  transport::Transport* const transport_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::list<Held> held_;                                       // guarded by mu_, in order
  transport::NoteGate notes_;                                  // guarded by mu_
  std::map<transport::PeerId, std::deque<HeldNote>> waiting_;  // guarded by mu_
  bool added_ = false;                                         // guarded by mu_
  bool stop_ = false;                                          // guarded by mu_
  // AskKeys' per pass, the poller thread's alone: a probe per key, then its answer.
  std::vector<std::pair<EventKey, EventProbe>> asks_;
  std::vector<std::pair<EventKey, Result<bool>>> answers_;
  std::thread thread_;
};

}  // namespace kv::daemon
