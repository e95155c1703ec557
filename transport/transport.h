// Transport: moves the bytes of plan runs between registered memory of two processes.
//
// Verbs, after NCCL/UCX practice: register memory once (large slabs), connect to a peer by its
// address blob, post batches of runs as one-sided writes (put) or reads (get), send small
// notifications that arrive only after the data of every batch posted before them to that peer,
// close. Each backend lives in its own folder and is chosen at run time by CreateTransport().
//
// Threading: every method is thread-safe. Completions and notification handlers run on the
// transport's own progress thread; they must not block and must not call back into post()
// synchronously with a lock the caller holds.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "layout/kv_region.h"
#include "layout/plan.h"

namespace kv::transport {

using Clock = std::chrono::steady_clock;
using PeerId = uint64_t;

// A registered range of local memory. Destroying it deregisters; the owner keeps it alive for as
// long as any batch that names it is in flight, and destroys it before the Transport.
class MemoryRegistration {
 public:
  virtual ~MemoryRegistration() = default;
  virtual void* base() const = 0;
  virtual uint64_t length() const = 0;
  virtual MemoryLocation location() const = 0;
  // Opaque descriptor a peer passes to Transport::import_remote(); it grants access to exactly
  // [base, base + length) and nothing else.
  virtual std::string packed_descriptor() const = 0;
};

// A peer's registered range, unpacked for one connected peer. Runs against it are checked to
// lie inside [0, length) before anything is posted. Like a registration, kept alive while any
// batch that names it is in flight (cuda_ipc's copies write through its mapping until then), and
// destroyed before the Transport.
class RemoteMemory {
 public:
  virtual ~RemoteMemory() = default;
  virtual PeerId peer() const = 0;
  virtual uint64_t length() const = 0;
};

enum class Op : uint8_t {
  kPut,  // run.src_offset is local, run.dst_offset is remote
  kGet,  // run.src_offset is remote, run.dst_offset is local
};

struct Batch {
  Op op = Op::kPut;
  const MemoryRegistration* local = nullptr;
  const RemoteMemory* remote = nullptr;
  std::span<const Run> runs;  // copied by post(); need not outlive the call
  Clock::time_point deadline;
  // Further runs, as the rows of run groups (layout/plan.h), for a backend whose
  // takes_run_groups() is true; every other backend rejects a batch with groups (kUnsupported).
  // Copied by post() like runs.
  std::span<const RunGroup> groups = {};
  // Further runs, as the rows of the groups of blocks of run groups (layout/plan.h), for a
  // backend whose takes_group_blocks() is true; every other backend rejects a batch with blocks
  // (kUnsupported). Copied by post() like runs.
  std::span<const GroupBlocks> blocks = {};
};

// Called exactly once per accepted batch: OK when every byte landed, else the first error
// (kTimeout past the deadline, kUnavailable when the peer failed).
using Completion = std::function<void(Status)>;
// Called for each notification received, in the order the sender sent them.
using NotificationHandler = std::function<void(std::string_view message)>;

// How a backend's own TCP side channel (nccl's unique-id exchange) admits peers
// (transport/channel_auth.h): as kvd's peer port does. With a secret, both ends prove it before
// anything else crosses; without one, only loopback peers are accepted and dialed unless
// `insecure`. kvd sets it from --auth-secret-file / --insecure and --name; never read from the
// environment.
struct PeerAuth {
  std::string secret;  // empty: no authentication (loopback only unless insecure)
  bool insecure = false;
  std::string name;  // this node's name, bound into the proofs and named in errors
};

// A backend's trace hook (TransportOptions::trace).
using TraceFn = std::function<void(std::string_view event, uint64_t id)>;

struct TransportOptions {
  // Backend-specific tuning, e.g. {"UCX_TLS", "tcp"}; empty means the backend's defaults. The
  // only way to tune a backend: no backend reads (or sets) environment variables.
  std::vector<std::pair<std::string, std::string>> settings;
  PeerAuth auth = {};  // the side channels of backends that have one (nccl)
  // Where set, called at each step of a batch on the backend's own threads (`event` a static
  // string such as "n_take", `id` the backend's number for the batch), never under a lock of the
  // backend's:
  // kvd sets it at --log-level debug, for tools/pd_timeline.py. It must be quick, thread-safe and
  // must not call into the transport. Unset (the default), the backends skip it for the cost of
  // a test.
  TraceFn trace = {};
};

// One setting a backend takes as its own (`kvd --transport-opt KEY=VALUE`; `kvd --help` lists
// them): its key, and its values and default in words.
struct SettingInfo {
  const char* key;
  const char* help;
};

// What a backend does that its callers must know before they create one, so that they decide by
// capability, never by a backend's name.
struct Capabilities {
  // Its copies run on one CUDA device of this process, named by its "device" setting (kvd
  // passes --device), on GPUs the engines compute on (kvd warns when MPS is off).
  bool device_copies = false;
  // Every setting that is not one of its own keys is a UCX configuration variable, with or
  // without the "UCX_" prefix (UCX_TLS=tcp, UCX_NET_DEVICES=eth0), applied through
  // ucp_config_modify; UCX itself still reads its UCX_* environment variables.
  bool ucx_config = false;
};

struct BackendInfo {
  std::string_view name;
  Capabilities capabilities;
  std::span<const SettingInfo> settings;  // its own keys; static storage

  // Whether `key` is one of its settings.
  bool takes(std::string_view key) const {
    for (const SettingInfo& s : settings) {
      if (key == s.key) return true;
    }
    return false;
  }
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual std::string_view name() const = 0;
  // The blob a peer passes to connect(); opaque, stable for this transport's lifetime.
  virtual std::string address() const = 0;
  // Whether register_memory() accepts memory of this kind directly.
  virtual bool supports(MemoryKind kind) const = 0;
  // Whether post() takes Batch::groups; callers expand groups into runs for backends that
  // do not (cuda_ipc does: its copy kernel walks a group's rows from one descriptor).
  virtual bool takes_run_groups() const { return false; }
  // Whether post() takes Batch::blocks as well (nccl does: a block of groups is one entry of its
  // announcement; cuda_ipc copies one from one descriptor); callers expand blocks into groups for
  // backends that do not. A backend that takes blocks takes groups too.
  virtual bool takes_group_blocks() const { return false; }

  // kUnsupported for memory this backend cannot reach (e.g. CUDA memory without CUDA-aware UCX).
  virtual Result<std::unique_ptr<MemoryRegistration>> register_memory(void* base, uint64_t length,
                                                                      MemoryLocation where) = 0;

  // The memory object behind host memory that another process of this host may map: a borrowed
  // fd (the caller keeps it open while the registration lives; a backend that needs it longer
  // duplicates it) and the byte offset of `base` inside the object. kvd passes an engine's memfd
  // (sealed against shrinking and growing: base/shared_memory.h).
  struct SharedObject {
    int fd = -1;  // -1: none
    uint64_t offset = 0;
  };
  // register_memory() of memory that lives in `object`. A backend that maps a peer's memory
  // straight into its own process (host_ipc) needs it and answers register_memory() with
  // kUnsupported; every other backend ignores the object (this default).
  virtual Result<std::unique_ptr<MemoryRegistration>> register_shared_memory(
      void* base, uint64_t length, MemoryLocation where, const SharedObject& object) {
    (void)object;
    return register_memory(base, length, where);
  }

  // Allocates `length` bytes where this backend reaches them fastest and registers them; the
  // registration owns the memory and frees it on destruction. For UCX on one host that is a
  // shared-memory segment a peer writes into directly, with no work on this side. kUnsupported
  // where the backend has no allocator of its own: use register_memory() then.
  virtual Result<std::unique_ptr<MemoryRegistration>> allocate_memory(uint64_t length,
                                                                      MemoryLocation where) {
    (void)length;
    (void)where;
    return Status::Unsupported(std::string(name()) + " transport has no memory allocator");
  }

  virtual Result<PeerId> connect(std::string_view peer_address) = 0;

  // A local end reserved for one peer: a handshake sends `address` to that peer instead of
  // address(), and connects to the peer's address with connect_endpoint(..., id). Backends that
  // give each peer resources of its own use it so that a peer's failure stays with that peer (ucx:
  // a worker per peer; a sender SIGKILLed half-way through a write into a shared-memory FIFO
  // wedges the receiving worker for good). connect_endpoint() consumes the endpoint, also when it
  // fails; one never connected is given back with release_endpoint(). The defaults share
  // address() and connect() between all peers.
  struct LocalEndpoint {
    uint64_t id = 0;
    std::string address;
  };
  virtual Result<LocalEndpoint> open_endpoint() { return LocalEndpoint{0, address()}; }
  virtual Result<PeerId> connect_endpoint(std::string_view peer_address, uint64_t endpoint) {
    (void)endpoint;
    return connect(peer_address);
  }
  virtual void release_endpoint(uint64_t endpoint) { (void)endpoint; }
  // Fails the peer's batches in flight with kAborted; later calls naming it get kNotFound. A
  // batch whose copies already run completes only once they stopped touching either side's
  // memory, or once its deadline passed: only a kTimeout completion may come while a copy still
  // runs (one still copying at its deadline), besides the kAborted of a transport destroyed
  // after its bounded wait for them. A batch still queued, not yet started, has nothing running
  // and fails at once.
  virtual void disconnect(PeerId peer) = 0;

  virtual Result<std::unique_ptr<RemoteMemory>> import_remote(PeerId peer,
                                                              std::string_view packed) = 0;

  // Validates every run against both registrations first: a run outside either range rejects
  // the whole batch (kOutOfRange) with nothing posted, and `done` is not called. Otherwise the
  // batch is accepted and `done` runs exactly once.
  virtual Status post(const Batch& batch, Completion done) = 0;

  // Delivered to the peer's handler only after the data of every batch this side posted to that
  // peer before the call has landed there.
  virtual Status notify(PeerId peer, std::string message) = 0;
  virtual void set_notification_handler(NotificationHandler handler) = 0;

  // ---- Write grants (issue 19) ----------------------------------------------------------------
  // A backend with a checked put path of its own (ucx's active-message puts: checks_write_grants()
  // true) lets a registration be guarded: from guard_writes() on, a peer's put into it lands only
  // inside a live grant of that peer (grant_writes(): ranges of the registration, by offset), and
  // a put outside every grant is refused and the sender's endpoint closed (never answered: an
  // answer would be an address oracle). revoke_writes() ends every range of a grant at once;
  // a put that arrives later is refused the same way. Grant ids are the caller's (any non-zero
  // value, unique among live grants). The check is one interval lookup per put message, not per
  // byte. Backends without such a path (nccl, cuda_ipc, local; ucx's RMA lanes, which UCX serves
  // without kvd) accept the calls and check nothing: their writes are bounded by the
  // registration alone. Unguarded registrations take any peer's puts inside their bounds.
  struct WriteRange {
    uint64_t offset = 0;
    uint64_t length = 0;
  };
  virtual bool checks_write_grants() const { return false; }
  virtual Status guard_writes(const MemoryRegistration& memory) {
    (void)memory;
    return Status::Ok();
  }
  virtual Status grant_writes(uint64_t grant, PeerId peer, const MemoryRegistration& memory,
                              std::span<const WriteRange> ranges) {
    (void)grant;
    (void)peer;
    (void)memory;
    (void)ranges;
    return Status::Ok();
  }
  virtual void revoke_writes(uint64_t grant) { (void)grant; }
};

// What plans made for `transport`'s batches may hold (LayerPlan::Create): blocks of groups where
// it takes them, else groups where it takes those, else runs.
inline PlanEntries PlanEntriesFor(const Transport& transport) {
  if (transport.takes_group_blocks()) return PlanEntries::kGroupBlocks;
  return transport.takes_run_groups() ? PlanEntries::kGroups : PlanEntries::kRuns;
}

// Backends by name: "ucx", "local" (same process, memcpy; for embedded mode and tests),
// "host_ipc" (host memory between processes of one host, one memcpy: host_ipc_transport.h), and,
// where built, "nccl" and "cuda_ipc" ("ipc" too: kvd's short name; BackendInfo::name is the full
// one). kUnsupported when this build lacks the backend.
// "ucx" is UCX behind the staged decorator (transport/staged/staged_transport.h): host memory
// goes to UCX unchanged; GPU memory too where UCX has CUDA support, and where it has not (Debian's
// build) through pinned host slots and the copy kernels, so a CUDA build serves GPU regions over
// "ucx" either way. Both ends of a "ucx" connection must be such builds (notifications carry a
// tag byte). Host batches of many short runs go through the same staging with memcpy (the
// chooser). Its settings: staging_bytes, staging_slots, stage_host, stage_runs_below (see that
// header).
Result<std::unique_ptr<Transport>> CreateTransport(std::string_view backend,
                                                   const TransportOptions& options = {});
// The backends this build has, in order of preference for "auto".
std::vector<std::string> AvailableTransports();
// What `backend` can do and which settings it takes ("auto": the first available), without
// creating one. kUnsupported, like CreateTransport, for a backend this build lacks.
Result<BackendInfo> DescribeTransport(std::string_view backend);
// Whether `backend` takes every key in `options`, once: one of its own, or any key where it takes
// UCX configuration. kInvalidArgument naming the first key it does not take (and the keys it
// does) or the first given twice. CreateTransport is less strict (nccl and cuda_ipc pass over keys
// they do not know): callers that take settings from a user check them first.
Status CheckSettings(std::string_view backend, const TransportOptions& options);

}  // namespace kv::transport
