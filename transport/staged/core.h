// The staged transport's internals, shared by staged_transport.cc (the verbs and the worker
// thread), sender.cc (outbound links: chunks, slots, acks) and receiver.cc (inbound links:
// validation, scatter, acks, the notification queue). The protocol is in staged_transport.h.
//
// Threading: the protocol state (links, jobs, slots) belongs to the worker thread alone. Callers,
// the inner transport's completions and handler, and copy callbacks hand it work as tasks
// (Enqueue); nothing blocks on the worker except a shutdown. Four small pieces are shared and
// guarded by their own mutexes: the task queue, the region table (register/deregister vs. the
// receiver's checks), the inbound queue (the inner progress thread delivers a user's
// notification inline when nothing is queued before it; whichever thread finishes a scatter
// delivers what it released, one thread at a time, in order) and the inbound link table.
// One exception to "worker alone": a chunk into host memory (not a get's alias) is checked,
// scattered and acked on the inner's thread that delivered its kData (ScatterHere), which is
// polling anyway: handed to the worker instead, each chunk waited for a thread wake-up, and on
// the 2-core VM the worker competed for a core with that spinning thread (the README demo shape
// 5.2-5.9 GB/s through the worker, 7.1-7.4 inline; benchmarks/pd.md, "demoucx").
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "transport/staged/chunker.h"
#include "transport/staged/stager.h"
#include "transport/staged/wire.h"
#include "transport/transport.h"

namespace kv::transport::staged {

// stage_runs_below's default, measured on the 2-core VM (benchmarks/transport.md, "The host
// chooser"): staged puts of registered host memory held 5-6 GB/s at every run size up to 4 KiB
// while direct ones fell to 1-3 GB/s at 1-2 KiB (0.3-1 at 512 B); from 8 KiB up direct ones won
// (9.6 GB/s at 8 KiB, 16 at 2 MiB, against 6-10 staged).
inline constexpr uint64_t kDefaultStageRunsBelow = 4 << 10;

// Host jobs of one small chunk each, queued for the same remote region, share a slot up to this
// many payload bytes: one put, one kData and one ack for several of kvd's batches. Each chunk
// costs its handoffs between four threads (gather, inner progress, the receiver's worker, back),
// which on the 2-core VM cost more than the copies: the README demo shape's 512 KiB batches
// moved at 4.2 GB/s in chunks of one batch (benchmarks/pd.md, "demoucx").
inline constexpr uint64_t kShareSlotBytes = 2 << 20;
struct Config {
  uint64_t slot_bytes = 16ull << 20;
  uint32_t slots = 4;
  bool stage_host = false;
  uint64_t stage_runs_below = kDefaultStageRunsBelow;  // 0: host batches never staged
};

// Whether a put or get between two host regions that both ends reach directly goes staged
// (gather, one inner put, scatter) rather than as one inner put or get per run: when its mean
// run is shorter than `stage_runs_below` bytes (0: never). Pure; thread-safe.
bool StagesBetter(std::span<const Run> runs, uint64_t stage_runs_below);

// Limits a receiver applies to what a sender asks for.
inline constexpr uint32_t kMaxSlots = 64;
inline constexpr uint64_t kMaxSlotBytes = 1ull << 30;
inline constexpr size_t kMaxInboundLinks = 64;

class Core;

// A region of the staged transport. `inner` (may be null): the same memory registered with the
// inner transport as well, for a host region that batches may also reach directly; destroyed
// after the region is forgotten.
class StagedRegistration final : public MemoryRegistration {
 public:
  StagedRegistration(Core* owner, uint64_t id, void* base, uint64_t length, MemoryLocation where,
                     std::unique_ptr<MemoryRegistration> inner = nullptr)
      : owner_(owner),
        id_(id),
        base_(base),
        length_(length),
        where_(where),
        inner_(std::move(inner)) {}
  ~StagedRegistration() override;
  void* base() const override { return base_; }
  uint64_t length() const override { return length_; }
  MemoryLocation location() const override { return where_; }
  std::string packed_descriptor() const override;
  const Core* owner() const { return owner_; }
  const MemoryRegistration* inner() const { return inner_.get(); }
  uint64_t id() const { return id_; }

 private:
  Core* owner_;
  uint64_t id_;
  void* base_;
  uint64_t length_;
  MemoryLocation where_;
  std::unique_ptr<MemoryRegistration> inner_;
};

// A peer's staged region; `inner` (may be null): its inner descriptor, imported, where the peer
// registered the memory with its inner transport too.
class StagedRemote final : public RemoteMemory {
 public:
  StagedRemote(const Core* owner, PeerId peer, const RegionDescriptor& d,
               std::unique_ptr<RemoteMemory> inner = nullptr)
      : owner_(owner), peer_(peer), d_(d), inner_(std::move(inner)) {}
  PeerId peer() const override { return peer_; }
  uint64_t length() const override { return d_.length; }
  const Core* owner() const { return owner_; }
  uint64_t region() const { return d_.region; }
  const RemoteMemory* inner() const { return inner_.get(); }

 private:
  const Core* owner_;
  PeerId peer_;
  RegionDescriptor d_;
  std::unique_ptr<RemoteMemory> inner_;
};

// One accepted staged put.
struct Job {
  uint64_t seq = 0;  // per link, in post order
  char* local_base = nullptr;
  MemoryLocation local_at;
  bool remote_staged = false;
  uint64_t region = 0;                         // remote_staged: the receiver's region id
  const RemoteMemory* inner_remote = nullptr;  // otherwise: the destination, an inner import
  std::vector<Chunk> chunks;
  Clock::time_point deadline;
  Completion done;
  size_t started = 0;   // chunks whose gather began
  size_t issued = 0;    // chunks handed to the inner transport (put, and kData when staged)
  size_t finished = 0;  // chunks in place at the destination
  int copying = 0;      // gathers still reading the user's memory
  bool failed = false;
  Status status;
};

// One accepted get of a peer's staged region, on the requesting side.
struct GetJob {
  uint64_t seq = 0;    // per link
  uint64_t alias = 0;  // the region id the holder puts into; forgotten when the get ends
  uint64_t holder_region = 0;
  std::vector<std::vector<Run>> parts;
  size_t parts_done = 0;
  bool sent = false;
  int scatters = 0;  // scatters into the alias still running
  bool failed = false;
  Status status;
  Clock::time_point deadline;
  Completion done;
};

struct OutLink {
  PeerId peer = 0;
  enum class State { kIdle, kOpening, kReady, kFailed } state = State::kIdle;
  std::vector<std::unique_ptr<Slot>> send_slots;
  std::vector<uint32_t> free_send;
  std::vector<std::unique_ptr<RemoteMemory>> recv_slots;  // the receiver's, imported
  std::vector<uint32_t> free_recv;
  std::deque<std::shared_ptr<Job>> jobs;
  uint64_t next_job = 1;
  std::deque<std::pair<uint64_t, std::string>> notes;  // (last job posted before it, message)
  uint64_t next_data = 1;
  // Chunks put and announced, by kData seq: the jobs whose pieces it carries (one chunk each;
  // several when small host jobs shared a slot, StartSharedChunk) and its receive slot.
  struct Announced {
    std::vector<std::shared_ptr<Job>> jobs;
    uint32_t slot = 0;
  };
  std::map<uint64_t, Announced> awaiting_ack;
  std::map<uint64_t, std::shared_ptr<GetJob>> gets;
  uint64_t next_get = 1;
};

// Fixed once in in_ (OnHello), but for `dropped` (under links_mu_); kept until the transport
// goes (a dropped link's peer may still be writing into its slots), so a pointer to one stays
// valid.
struct InLink {
  PeerId back = 0;  // our connection to the sender, for acks
  uint64_t slot_bytes = 0;
  std::vector<std::unique_ptr<Slot>> slots;
  bool dropped = false;
};

// An inbound notification or kData frame, in arrival order.
struct InEntry {
  bool data = false;
  bool done = false;  // data: scattered (or refused); under in_mu_ (DeliverInbound)
  std::string note;   // !data: the user's message
};

struct Region {
  char* base = nullptr;
  uint64_t length = 0;
  MemoryLocation location;
  // Write grants (transport.h, guard_writes): a guarded region takes a staged chunk only where
  // each of its ranges lies inside one interval of a live grant. The receiver cannot tell which
  // peer a chunk came from (its link's control messages arrive as notifications), so any live
  // grant of the region admits it; the direct path (the inner's put messages) binds the peer.
  bool guarded = false;
  std::map<uint64_t, std::vector<std::pair<uint64_t, uint64_t>>> grants = {};  // [start, end)
  bool alias = false;  // a get's destination (getter.cc): its scatters are counted by the worker

  // The region without its grants: what a copy or a scatter needs, cheap to copy.
  Region Shape() const { return {base, length, location, guarded, {}, alias}; }
};

class Core final : public Transport {
 public:
  Core(std::unique_ptr<Transport> inner, const Config& config);
  ~Core() override;

  std::string_view name() const override { return inner_->name(); }
  std::string address() const override { return inner_->address(); }
  bool supports(MemoryKind kind) const override;
  Result<std::unique_ptr<MemoryRegistration>> register_memory(void* base, uint64_t length,
                                                              MemoryLocation where) override;
  Result<std::unique_ptr<MemoryRegistration>> allocate_memory(uint64_t length,
                                                              MemoryLocation where) override {
    return inner_->allocate_memory(length, where);
  }
  Result<PeerId> connect(std::string_view peer_address) override;
  Result<LocalEndpoint> open_endpoint() override { return inner_->open_endpoint(); }
  Result<PeerId> connect_endpoint(std::string_view peer_address, uint64_t endpoint) override;
  void release_endpoint(uint64_t endpoint) override { inner_->release_endpoint(endpoint); }
  void disconnect(PeerId peer) override;
  Result<std::unique_ptr<RemoteMemory>> import_remote(PeerId peer,
                                                      std::string_view packed) override;
  Status post(const Batch& batch, Completion done) override;
  Status notify(PeerId peer, std::string message) override;
  void set_notification_handler(NotificationHandler handler) override;
  // Grants apply to what the inner transport registered (passed-through memory). A staged
  // region takes no grant (OK, nothing checked): its scatter is checked against the
  // registration only (a known gap, SECURITY.md).
  bool checks_write_grants() const override { return inner_->checks_write_grants(); }
  // Grants (staged_transport.cc): a staged region checks its staged chunks against them, and
  // passes them on to its inner registration (a host region both paths reach) for the direct
  // path; memory the inner registered alone is the inner's.
  Status guard_writes(const MemoryRegistration& memory) override;
  Status grant_writes(uint64_t grant, PeerId peer, const MemoryRegistration& memory,
                      std::span<const WriteRange> ranges) override;
  void revoke_writes(uint64_t grant) override;

  void ForgetRegion(uint64_t id);
  uint64_t instance() const { return instance_; }

 private:
  // ---- worker plumbing (staged_transport.cc) ----
  // remote_staged: through the receiver's slots and scatter, else an inner put straight into
  // batch.remote (an inner import, or the inner half of a StagedRemote).
  Status PostStaged(const Batch& batch, bool remote_staged, Completion done);
  void Enqueue(std::function<void()> task);
  void WorkerLoop();
  Stager& stager();
  void Deliver(std::string_view message);  // to the user's handler, no lock held
  void OnFrame(std::string_view frame);    // the inner's handler

  // ---- sender (sender.cc); worker thread only ----
  OutLink& Out(PeerId peer);
  void AddJob(PeerId peer, std::shared_ptr<Job> job);
  void AddNote(PeerId peer, std::string message);
  void Pump(OutLink& link);
  Status Open(OutLink& link);  // sends kHello once; the link is kOpening until kWelcome
  Status PrepareSlots(OutLink& link);
  // Gathers the job's next chunk into a free send slot; a host chunk is issued before it
  // returns, a GPU one once its copy finished. Leaves the link kFailed on error.
  void StartChunk(OutLink& link, const std::shared_ptr<Job>& job, size_t position);
  // The jobs queued after link.jobs[position] that may share its slot (kShareSlotBytes); none
  // when it may not.
  std::vector<std::shared_ptr<Job>> Riders(const OutLink& link, size_t position) const;
  // Gathers `jobs` (one chunk each, host, one remote region) into one send slot and issues it
  // as one chunk; leaves the link kFailed on error.
  void StartSharedChunk(OutLink& link, std::vector<std::shared_ptr<Job>> jobs);
  // The chunk's gather finished: puts the slot and, staged, sends kData. Does not Pump (it runs
  // inside Pump for host chunks); may fail the link.
  void IssueChunk(OutLink& link, const std::shared_ptr<Job>& job, size_t chunk, uint32_t send,
                  uint32_t recv, const Status& status);
  void PutDone(PeerId peer, std::shared_ptr<Job> job, uint32_t send, bool finishes, Status status);
  void OnWelcome(std::string_view frame);
  void OnAck(std::string_view frame);
  void FlushNotes(OutLink& link);
  void FailLink(OutLink& link, const Status& why, const Job* culprit);
  void MaybeComplete(OutLink& link, const std::shared_ptr<Job>& job);
  void CheckDeadlines();
  bool Busy() const;    // any copy or inner put still in flight
  bool Active() const;  // any staged batch not yet complete

  // ---- gets (getter.cc); worker thread only, but PostGet on the caller's ----
  Status PostGet(const Batch& batch, const StagedRemote& remote, Completion done);
  void AddGet(PeerId peer, std::shared_ptr<GetJob> get);
  void SendGets(OutLink& link);
  void OnGetRequest(std::string_view frame);
  void OnGetDone(std::string_view frame);
  void FailGet(OutLink& link, const std::shared_ptr<GetJob>& get, const Status& why);
  void FinishGet(OutLink& link, const std::shared_ptr<GetJob>& get);
  void ScatterStarted(uint64_t region, int delta);  // counts scatters into a get's alias

  // ---- receiver (receiver.cc); worker thread only ----
  void OnHello(std::string_view frame);
  // The inbound link `key`, or null when there is none or it was dropped; any thread (the
  // pointer stays valid, InLink).
  InLink* FindLink(const LinkKey& key);
  void OnData(std::string_view frame, std::shared_ptr<InEntry> entry);
  // The inner's thread: checks, scatters and acks a chunk into host memory that is no get's
  // alias; false (nothing done) for any other frame, which the worker then takes (OnData).
  bool ScatterHere(std::string_view frame, InEntry* entry);
  // A chunk's ranges as copies from its slot into its region, once checked against both (the
  // slot's table, the registration, the region's grants); any thread.
  Result<std::vector<Run>> CheckChunk(const DataMsg& m, const InLink& link, Region& region);
  Status Scatter(const DataMsg& m, InLink& link, std::shared_ptr<InEntry> entry);
  // Marks `finished` (a data entry, may be null) done and delivers every note it released, in
  // order. Any thread; one delivers at a time, the others leave what they released to it.
  void DeliverInbound(InEntry* finished = nullptr);
  void Drop(InLink& link);

  const Config config_;
  const uint64_t instance_;
  std::unique_ptr<Transport> inner_;

  // Task queue.
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread worker_;

  // Regions, peers and the handler: callers and worker.
  std::mutex mu_;
  std::map<uint64_t, Region> regions_;
  std::map<uint64_t, std::vector<uint64_t>> granted_regions_;  // grant -> region ids, under mu_
  uint64_t next_region_ = 1;
  std::set<PeerId> connected_;
  std::set<PeerId> staged_peers_;  // peers that got a staged batch: notes go through the worker
  std::shared_ptr<const NotificationHandler> handler_;

  // Inbound queue: the inner's progress thread and the worker.
  std::mutex in_mu_;
  std::deque<std::shared_ptr<InEntry>> inbound_;
  bool delivering_ = false;  // a thread is in DeliverInbound's loop (under in_mu_)

  // Inbound links: added by the worker (OnHello), found by it and by ScatterHere; never erased
  // before the destructor.
  std::mutex links_mu_;
  std::map<LinkKey, InLink> in_;

  // Worker-only state.
  std::unique_ptr<Stager> stager_;
  std::map<PeerId, OutLink> out_;
  std::map<uint64_t, std::pair<PeerId, std::shared_ptr<GetJob>>> alias_gets_;  // alias → get
  int puts_in_flight_ = 0;
  int copies_in_flight_ = 0;
};

}  // namespace kv::transport::staged
