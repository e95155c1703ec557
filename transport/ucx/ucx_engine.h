// UcxTransport's internals, shared by ucx_transport.cc (the public verbs, callable from any
// thread) and ucx_progress.cc (everything that runs on the progress thread).
//
// Threading model: the ucp workers (one shared, one per peer that came through open_endpoint())
// are single-threaded and touched only by the progress thread, which polls them all.
// Callers validate their input, then hand the work over as a command (Enqueue); calls that need
// an answer (connect, import_remote) wait for it with a deadline (RunSync). The progress thread
// polls for kIdleSpin after the last event (kBusySpin while batches are in flight), then
// arms the workers and sleeps in epoll on their fds and an eventfd that Enqueue rings: fast
// under load, no CPU when idle (the daemon must not spin an idle core on a 2-core host).
//
// Rules (the contract of Transport, made precise for UCX):
//  * A batch is one ucp_put_nbx/ucp_get_nbx per run and one ucp_ep_flush_nbx; it completes when
//    the flush does. done() runs on the progress thread. Where the endpoint has no RMA lane, a
//    put batch is active messages instead and completes when the flush and the receiver's ack
//    both have (ucx_am_put.cc).
//  * A batch past its deadline fails its peer: the endpoint is force-closed, which makes UCX
//    release every request on it; the late batch completes with kTimeout, the peer's other
//    batches with kUnavailable. done() therefore never runs while UCX may still touch the batch's
//    memory: after done(), the caller may free or reuse it. A batch whose flush UCX has not
//    called back once the close completed (or was abandoned) is finished then (FlushRef).
//    Every batch completes exactly once.
//  * An endpoint error (the peer died) fails every batch to that peer with kUnavailable; later
//    batches to it complete with kUnavailable; the caller reconnects.
//  * A batch holds its local mapping and its remote key: deregistering while a batch is in flight
//    is safe, the unmap waits. The unmap (and the remote key's release) runs on the progress
//    thread, after the commands queued before the deregistration. Registrations and imported
//    descriptors must be destroyed before the Transport.
//  * A notification is sent as an eager active message after a flush of its endpoint completes,
//    so it arrives after the data of every batch posted before it (to a peer that takes puts as
//    messages: after every batch posted before it finished); notifications leave in the order
//    notify() was called.
//  * At most max_bytes_in_flight (kMaxBytesInFlight unless the setting max_inflight_bytes says
//    otherwise, EngineOptions) of a peer's batches are handed to UCX at once; later batches, and
//    the notifications behind them, wait in the peer's queue in call order and go out as earlier
//    batches complete (on the progress thread, with no hop). Without the bound a notification's
//    active message queues behind every fragment posted before it was *sent*: with a wave of
//    layers posted at once, every layer's notice arrived after the last layer's data.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/unique_fd.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_validate.h"

namespace kv::transport::ucx {

inline constexpr unsigned kNotifyAmId = 17;
// The active-message put path (ucx_am_put.cc).
inline constexpr unsigned kPutDataAmId = 18;  // header PutHeader, data: the bytes
inline constexpr unsigned kPutEndAmId = 19;   // header PutHeader (bytes: the batch's total)
inline constexpr unsigned kPutAckAmId = 20;   // header PutHeader (bytes: 0 landed, 1 refused)
// A run goes out in messages of at most this much: the receiver assembles each before copying.
inline constexpr uint64_t kPutChunk = 256 << 10;
inline constexpr size_t kMaxNotification = 64 << 10;
inline constexpr auto kSyncTimeout = std::chrono::seconds(10);
// An endpoint close still unfinished after this is abandoned, so that its worker can go.
inline constexpr auto kCloseTimeout = std::chrono::seconds(5);
// After its last event the progress thread polls kPureSpin flat out, then keeps polling but
// yields the core between polls (on two cores the peer it waits for may need it), and sleeps
// in epoll only after kIdleSpin (kBusySpin with batches in flight). Protocols that ping-pong
// between the processes (software RMA acknowledgements, rendezvous) must not find the other
// side asleep: a window shorter than a round trip under load locks both sides into a wake-up
// per fragment, 0.1 GB/s instead of 3 (the old 100 us window did; benchmarks/transport.md).
inline constexpr auto kPureSpin = std::chrono::microseconds(50);
inline constexpr auto kIdleSpin = std::chrono::milliseconds(2);   // nothing in flight
inline constexpr auto kBusySpin = std::chrono::milliseconds(50);  // batches in flight
// Enough to keep the shared-memory and TCP lanes busy (a completion starts the next batch on the
// same thread), little enough that a notification waits for a few ms of data at most. A batch
// larger than the bound goes out alone.
inline constexpr uint64_t kMaxBytesInFlight = 16 << 20;

// How puts travel (the ucx setting put_path): chosen per endpoint (auto: as active messages where
// the endpoint has no RMA lane, ucx_am_put.cc), or forced to messages (am) or to RMA (rma).
enum class PutPath { kAuto, kMessages, kRma };

// The engine's own tuning, from the ucx backend's settings (ucx_transport.h).
struct EngineOptions {
  uint64_t max_bytes_in_flight = kMaxBytesInFlight;  // per peer, > 0
  PutPath put_path = PutPath::kAuto;
};

class Engine;
struct Peer;
struct BatchState;

// What a put message names: the sender's batch, and the receiver's absolute address (data) or a
// byte count (end, ack).
struct PutHeader {
  uint64_t seq;
  uint64_t value;
};

// A batch being received over the active-message put path.
struct Incoming {
  uint64_t bytes = 0;
  uint64_t expected = UINT64_MAX;  // set by the end message
  bool refused = false;            // a message named memory outside this process's registrations
};

// The host ranges this process registered, where put messages may write, and the write grants
// of guarded ones (Transport::guard_writes; any thread adds and removes; the progress thread
// copies under the lock, so a range or a grant cannot go mid-copy).
class LocalRegions {
 public:
  uint64_t Add(void* base, uint64_t length);
  void Remove(uint64_t token);  // and its grants
  // From now on a put into region `token` lands only inside a live grant of its sender.
  Status Guard(uint64_t token);
  // Adds `ranges` (offsets into region `token`, inside it) to grant `grant` of `peer`.
  Status Grant(uint64_t grant, PeerId peer, uint64_t token,
               std::span<const Transport::WriteRange> ranges);
  void Revoke(uint64_t grant);
  // Copies when [address, address + length) lies inside one registered range and, where that
  // range is guarded, inside one interval of a live grant of `sender` (0: an unknown sender,
  // granted nothing); false otherwise. One binary search per grant of the sender on the region.
  bool CopyIn(uint64_t address, const void* data, uint64_t length, PeerId sender);

 private:
  struct Range {
    uint64_t base = 0;
    uint64_t length = 0;
    bool guarded = false;
  };
  struct Granted {
    uint64_t grant = 0;
    std::vector<std::pair<uint64_t, uint64_t>> intervals;  // absolute [start, end), merged
  };
  std::mutex mu_;
  std::map<uint64_t, Range> ranges_;                                    // by token
  std::map<std::pair<uint64_t, PeerId>, std::vector<Granted>> grants_;  // by (token, peer)
  std::unordered_map<uint64_t, std::vector<std::pair<uint64_t, PeerId>>> by_grant_;
  uint64_t next_ = 1;
};
// One ucp worker and its wake-up fd. Peers that connect() share the engine's first worker; a
// peer that comes through open_endpoint() gets a worker of its own. Whatever uses a worker holds
// it (its peer, remote keys, close requests), and the last holder to go destroys it (on the
// progress thread, or after it stopped).
//
// Why a worker per peer: a shared-memory sender reserves an element of the receiving worker's
// FIFO before it writes it; a sender SIGKILLed in between leaves a hole the receiver waits on
// forever, so nothing sent to that worker after it (a new peer's wire-up, puts, notifications)
// is ever delivered. Seen in UCX 1.13.1: in a decode kvd's sysv FIFO element 1524 was never
// written and 1525, written by the next prefill kvd, sat behind it. A dead peer's worker goes
// with it.
struct WorkerSlot : std::enable_shared_from_this<WorkerSlot> {
  WorkerSlot(Engine* engine, WorkerPtr worker, int efd, std::string address)
      : engine(engine), worker(std::move(worker)), efd(efd), address(std::move(address)) {}
  ~WorkerSlot();
  WorkerSlot(const WorkerSlot&) = delete;
  WorkerSlot& operator=(const WorkerSlot&) = delete;
  Engine* engine;
  WorkerPtr worker;
  int efd;
  std::string address;
  Peer* owner = nullptr;  // the peer connected on this worker, when it has one of its own
  // Put batches arriving, by (UCX's endpoint back to the sender, sender's seq).
  std::map<std::pair<uintptr_t, uint64_t>, Incoming> incoming;
};

// An unpacked remote key; ucp_rkey_destroy is a worker call, so it is deferred to the progress
// thread. Holds the worker of the endpoint it was unpacked on.
struct RemoteKey {
  RemoteKey(Engine* engine, std::shared_ptr<WorkerSlot> slot, ucp_rkey_h rkey)
      : engine(engine), slot(std::move(slot)), rkey(rkey) {}
  ~RemoteKey();
  Engine* engine;
  std::shared_ptr<WorkerSlot> slot;
  ucp_rkey_h rkey;
};

// What a batch's flush callback finds its batch by. UCX 1.13.1 does not call back every flush
// of a force-closed endpoint: with four put batches in flight to a SIGKILLed peer over shm,
// ucp_ep_close_nbx completed at once having called back one flush; the other three came back
// only when the worker was destroyed. So once the close completed (or was abandoned) the engine
// finishes the batches UCX still owes (FinishOrphans) and clears `batch` here; the late callback
// then frees the ref and touches nothing else. A flush never called back leaks its ref.
struct FlushRef {
  Engine* engine;
  BatchState* batch;  // null once the batch finished without this flush
};

// A registration's mapping or an imported descriptor's remote key, lent to the batches posted
// with it. Its owner creates it and, when it goes, hands it to the progress thread (Release: a
// command, so after the Post() of every batch posted before); the progress thread counts the
// batches holding it and frees it when the owner is gone and the last batch finished. The count
// is a plain integer touched on one thread: shared_ptr counts taken by the poster and dropped by
// the progress thread moved between the cores on every batch (perf, issue 24), and even on one
// thread cost four atomic operations per batch.
template <typename T>
struct Lent {
  explicit Lent(std::shared_ptr<T> ref) : ref(std::move(ref)) {}
  // Progress thread: the owner went; frees it unless batches still hold it.
  static void Release(Lent* lent) {
    lent->released = true;
    if (lent->batches == 0) delete lent;
  }
  // Progress thread.
  void Hold() { ++batches; }
  static void Drop(Lent* lent) {
    if (--lent->batches == 0 && lent->released) delete lent;
  }
  const std::shared_ptr<T> ref;
  uint64_t batches = 0;   // holding it (progress thread)
  bool released = false;  // its owner went (progress thread)
};

// One accepted batch, owned by the progress thread from Enqueue until done() has run. Reset in
// place for reuse by Engine::Recycle: a field added here must be reset there too.
struct BatchState {
  Engine* engine = nullptr;
  PeerId peer = 0;
  Op op = Op::kPut;
  std::vector<Run> runs;
  char* local = nullptr;
  uint64_t remote_address = 0;
  // Its registration's mapping and its descriptor's remote key (set by post()), held from Post()
  // until the batch finishes (`holding`): deregistering while it is in flight is safe.
  Lent<MemoryMap>* lent_map = nullptr;
  Lent<RemoteKey>* lent_key = nullptr;
  bool holding = false;
  // Links of the engine's in-flight list (BatchList).
  BatchState* prev = nullptr;
  BatchState* next = nullptr;
  bool listed = false;
  Completion done;
  Clock::time_point deadline;
  Status failure;       // set when the batch times out or its peer fails before UCX reports back
  uint64_t bytes = 0;   // the runs' total: what the batch counts against kMaxBytesInFlight
  bool posted = false;  // handed to UCX, which now owes it a flush completion
  // The active-message put path: done when the flush and the receiver's ack both are.
  bool am = false;
  bool flushed = false;
  bool acked = false;
  uint64_t seq = 0;                // set when its peer takes puts as messages: notes wait for it
  std::vector<PutHeader> headers;  // of its messages, until they are sent
  FlushRef* flush = nullptr;       // its flush, while UCX owes the callback
};

// The batches in flight, in the order they were posted, linked through the batches themselves:
// adding and removing one allocates nothing (a std::set took a malloc and a free per batch on the
// progress thread). Progress thread only.
class BatchList {
 public:
  bool empty() const { return head_ == nullptr; }
  BatchState* front() const { return head_; }
  void Add(BatchState* batch) {
    batch->prev = tail_;
    batch->next = nullptr;
    (tail_ != nullptr ? tail_->next : head_) = batch;
    tail_ = batch;
    batch->listed = true;
  }
  // No-op for a batch that is not listed (one that failed before it was added).
  void Remove(BatchState* batch) {
    if (!batch->listed) return;
    (batch->prev != nullptr ? batch->prev->next : head_) = batch->next;
    (batch->next != nullptr ? batch->next->prev : tail_) = batch->prev;
    batch->prev = batch->next = nullptr;
    batch->listed = false;
  }
  // Calls fn(batch) for every batch; fn must not add or remove any.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (BatchState* b = head_; b != nullptr; b = b->next) fn(b);
  }

 private:
  BatchState* head_ = nullptr;
  BatchState* tail_ = nullptr;
};

struct Note {
  uint64_t seq;
  std::string message;
  bool ready = false;  // its flush completed: the data before it has landed
};

// What a notification's flush callback needs to find the notification again; the peer may be
// gone by then.
struct NoteRef {
  Engine* engine;
  PeerId peer;
  uint64_t seq;
};

// Work for a peer not handed to UCX yet: a batch, or (batch == nullptr) the flush of note `note`.
struct Queued {
  BatchState* batch;
  uint64_t note;
};

// A connected endpoint; also the argument of its error handler.
struct Peer {
  Engine* engine = nullptr;
  PeerId id = 0;
  std::shared_ptr<WorkerSlot> slot;  // the worker `ep` lives on
  ucp_ep_h ep = nullptr;
  std::deque<Note> notes;
  uint64_t next_note = 0;
  std::deque<Queued> queued;  // in post()/notify() order
  uint64_t bytes_posted = 0;  // of batches handed to UCX and not finished
  bool pumping = false;       // Pump() is on the stack: a completion inside it must not recurse
  // Puts travel as kvd's active messages (no RMA lane to this peer: UCX would emulate them).
  bool am_puts = false;
  std::set<uint64_t> am_unacked;                       // seqs of its batches not finished
  std::deque<std::pair<uint64_t, uint64_t>> am_notes;  // (note, last batch seq before it)
};

class Engine {
 public:
  // Creates the first worker, sets up wake-up (the workers' fds + an eventfd in one epoll set)
  // and starts the progress thread.
  static Result<std::unique_ptr<Engine>> Create(ContextPtr context, const EngineOptions& options);
  ~Engine();  // stops the progress thread; aborts whatever is still in flight

  ucp_context_h context() const { return context_.get(); }
  // The shared worker's address. Any thread.
  const std::string& worker_address() const { return shared_address_; }
  bool on_progress_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

  // Runs `command` on the progress thread, in call order. Never blocks.
  void Enqueue(std::function<void()> command);
  // A batch to fill and hand to Post(): a finished one recycled, or a new one. Any thread. A batch
  // allocated by the posting thread and freed by the progress thread made every free take the
  // poster's malloc arena lock: on the 2-core VM the two threads met there on every batch
  // (futex wake-ups, a tenth of kvbench transport's time at 64 KiB: perf, issue 24).
  BatchState* NewBatch();
  // Runs `fn` on the progress thread and returns its result; kTimeout after kSyncTimeout.
  template <typename T>
  Result<T> RunSync(std::function<Result<T>()> fn);

  // ---- Progress thread only ------------------------------------------------------------------
  // A worker reserved for one peer: its id and address.
  Result<std::pair<uint64_t, std::string>> OpenEndpoint();
  void ReleaseEndpoint(uint64_t endpoint) { endpoints_.erase(endpoint); }
  // On the reserved worker `endpoint` (consumed), or the shared one for 0.
  Result<PeerId> Connect(const std::string& worker_address, PeerId id, uint64_t endpoint);
  Status Disconnect(PeerId id);
  Result<std::shared_ptr<RemoteKey>> UnpackRkey(PeerId id, const std::string& packed);
  void Post(BatchState* batch);
  void Notify(PeerId id, std::string message);
  void SetHandler(NotificationHandler handler) { handler_ = std::move(handler); }

 private:
  friend struct WorkerSlot;
  Engine(ContextPtr context, UniqueFd wake_fd, UniqueFd epoll_fd, const EngineOptions& options);
  Result<std::shared_ptr<WorkerSlot>> OpenWorker();
  // Fills rkey_shapes_ from the keys of a probe mapping and a probe allocation (Create).
  void LearnRkeyShapes();
  void CloseWorker(WorkerSlot* slot);  // from ~WorkerSlot
  void Loop();
  bool RunCommands();
  void Sleep(bool work_in_flight);
  void CheckDeadlines(Clock::time_point now);
  void HandleEndpointErrors();
  void FailPeer(PeerId id, const Status& reason);
  // Finishes the batches of the failed peer `id` still in flight once its endpoint's close
  // completed or was abandoned: UCX will not call their flushes back (FlushRef).
  void FinishOrphans(PeerId id);
  void ReapClosedEndpoints();
  // ---- The active-message put path (ucx_am_put.cc) -----------------------------------------
  Status SetAmHandlers(WorkerSlot* slot);
  // Whether puts to this endpoint travel as active messages (put_path; auto: when the endpoint
  // has no RMA lane).
  bool UseAmPuts(ucp_ep_h ep) const;
  void StartAm(Peer* peer, BatchState* batch);
  void BatchFlushed(BatchState* batch, ucs_status_t status);
  // The note may go once every batch started before it is acked; false: it waits.
  bool AmNoteReady(Peer* peer, uint64_t note);
  void AmBatchDone(BatchState* batch);
  void SendAcks();
  static ucs_status_t OnPutData(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnPutEnd(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnPutAck(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param);
  void MaybeAck(WorkerSlot* slot, uint64_t seq, ucp_ep_h reply_ep);
  // The peer a put message came from: the owner of its worker, or ours whose endpoint UCX
  // answers on; 0 when unknown.
  PeerId SenderOf(const WorkerSlot* slot, ucp_ep_h reply_ep) const;

 public:
  LocalRegions& regions() { return regions_; }

 private:
  // Hands the peer's queued work to UCX while the in-flight bound allows.
  void Pump(Peer* peer);
  void Start(Peer* peer, BatchState* batch);
  // The flush that ends a started batch (BatchFlushed, now or from OnBatchFlushed).
  void FlushBatch(ucp_ep_h ep, BatchState* batch);
  void FlushNote(Peer* peer, uint64_t seq);
  void Finish(BatchState* batch, ucs_status_t status);
  // Resets a finished batch (releasing its mapping and remote key) and keeps it for NewBatch().
  void Recycle(BatchState* batch);
  void MarkNoteReady(PeerId id, uint64_t seq);
  void SendReadyNotes(Peer* peer);
  void Shutdown();

  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnBatchFlushed(void* request, ucs_status_t status, void* user_data);
  static void OnNoteFlushed(void* request, ucs_status_t status, void* user_data);
  static void OnNoteSent(void* request, ucs_status_t status, void* user_data);
  static ucs_status_t OnNotification(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length, const ucp_am_recv_param_t* param);

  ContextPtr context_;  // declared first: destroyed after every worker
  UniqueFd wake_fd_;
  UniqueFd epoll_fd_;
  const uint64_t max_bytes_in_flight_;  // per peer

  std::string shared_address_;  // set before the progress thread starts
  RkeyShapes rkey_shapes_;      // learned before the progress thread starts (LearnRkeyShapes)
  // Every live worker, polled in turn (progress thread). Declared before everything that can
  // hold a worker, so that it outlives them.
  std::vector<WorkerSlot*> workers_;

  std::mutex queue_mu_;
  std::vector<std::function<void()>> commands_;  // guarded by queue_mu_
  std::atomic<bool> has_commands_{false};        // commands_ is not empty
  std::atomic<bool> sleeping_{false};

  // Progress-thread state.
  std::shared_ptr<WorkerSlot> shared_;                                   // for connect()
  std::unordered_map<uint64_t, std::shared_ptr<WorkerSlot>> endpoints_;  // opened, not connected
  uint64_t next_endpoint_ = 1;
  std::vector<std::function<void()>> running_;  // the commands being run, swapped with commands_
  // Finished batches, reset (no mapping, key or completion held), for NewBatch(): spare_ guarded by
  // queue_mu_; finished_ the progress thread's, moved to spare_ when it next takes the lock.
  std::vector<BatchState*> spare_;
  std::vector<BatchState*> finished_;
  // One finished batch set aside by Recycle() for the next NewBatch(), which takes it without the
  // queue's lock: with the lock taken twice per post() (spare, then command), the poster and the
  // progress thread met on it in futex waits at small batch sizes (perf, issue 24).
  std::atomic<BatchState*> ready_{nullptr};
  bool stopping_ = false;
  std::unordered_map<PeerId, std::unique_ptr<Peer>> peers_;
  std::vector<std::pair<PeerId, ucs_status_t>> endpoint_errors_;
  struct Closing {
    std::unique_ptr<Peer> peer;
    void* request;
    Clock::time_point give_up;  // a close that hangs (a wedged worker) is abandoned
  };
  std::vector<Closing> closing_;
  // Endpoint workers whose peer's address Connect refused: kept, and progressed, until
  // kCloseTimeout has passed. The peer had this worker's address and was already wiring up to
  // it; a worker destroyed at once left it a closed port, on which UCX 1.13 aborted the peer
  // (tcp_ep.c:478, "Assertion `!(ep->flags & UCT_TCP_EP_FLAG_CTX_TYPE_TX)' failed").
  std::vector<std::pair<std::shared_ptr<WorkerSlot>, Clock::time_point>> retired_;
  BatchList in_flight_;
  NotificationHandler handler_;
  LocalRegions regions_;
  const PutPath put_path_;
  uint64_t next_put_seq_ = 1;
  std::unordered_map<uint64_t, BatchState*> am_batches_;  // started put batches by seq
  struct Ack {
    std::weak_ptr<WorkerSlot> slot;
    bool via_owner;     // on the slot owner's endpoint (gone with it), else on reply_ep
    ucp_ep_h reply_ep;  // the worker is shared: UCX's endpoint back to the sender
    PutHeader header;
    bool refused = false;  // not an ack: the sender's endpoint is closed (ucx_am_put.cc)
  };
  std::vector<Ack> acks_;          // sent after progress returns: never from inside UCX's handler
  std::vector<Ack> sending_acks_;  // SendAcks' batch, swapped with acks_

  std::thread thread_;  // last: starts after everything above exists
};

template <typename T>
Result<T> Engine::RunSync(std::function<Result<T>()> fn) {
  if (on_progress_thread()) return fn();
  auto promise = std::make_shared<std::promise<Result<T>>>();
  std::future<Result<T>> future = promise->get_future();
  Enqueue([promise, fn = std::move(fn)] { promise->set_value(fn()); });
  if (future.wait_for(kSyncTimeout) != std::future_status::ready)
    return Status::Timeout("the UCX progress thread did not answer within 10 s");
  return future.get();
}

}  // namespace kv::transport::ucx
