#include "transport/cuda_ipc/cuda_ipc_transport.h"

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "base/fd_share.h"
#include "base/framed_socket.h"
#include "gpu/cuda_util.h"
#include "gpu/ipc_memory.h"
#include "transport/cuda_ipc/ipc_regions.h"
#include "transport/cuda_ipc/poster.h"
#include "transport/note_gate.h"
#include "transport/run_check.h"
#include "transport/same_host_channel.h"
#include "transport/settings.h"

namespace kv::transport {
namespace {

using cuda_ipc::IpcRegistration;
using cuda_ipc::IpcRemote;
using cuda_ipc::kMagic;
using cuda_ipc::WireDescriptor;
using gpu::CudaEvent;

// Batches go round-robin onto the poster's streams, each with its own copier, so consecutive
// batches may overlap on the device (one stream left the link idle between batches).
constexpr int kChannels = cuda_ipc::Poster::kChannels;
// How long the progress thread polls in-flight batches without sleeping (see ProgressLoop).
constexpr auto kSpinWindow = std::chrono::milliseconds(10);

class CudaIpcTransport final : public Transport {
 public:
  CudaIpcTransport(int device, std::chrono::milliseconds connect_timeout,
                   std::optional<kernels::CopyPath> copy_path, bool busy_poll, TraceFn trace)
      : device_(device),
        connect_timeout_(connect_timeout),
        copy_path_(copy_path),
        busy_poll_(busy_poll),
        trace_(std::move(trace)) {}

  Status Start(const std::string& socket_dir) {
    KV_ASSIGN_OR_RETURN(poster_, cuda_ipc::Poster::Start(
                                     device_, copy_path_, busy_poll_,
                                     [this](cuda_ipc::PostJob job, cuda_ipc::Launch launch) {
                                       OnLaunched(std::move(job), std::move(launch));
                                     },
                                     trace_));
    // A peer gone: its batches in pending_ fail with `why` once their events fired, its notes
    // there are dropped, and its jobs still queued at the poster never launch. (Taking them under
    // mu_ keeps post()'s lock order: mu_, then the poster's.)
    auto gone = [this](PeerId peer, const Status& why, std::vector<Completion>* failed) {
      FailPendingOf(peer, why);
      gate_.ForgetPeer(peer);
      poster_->TakeQueued(peer, failed);
    };
    KV_ASSIGN_OR_RETURN(channel_, SameHostChannel::Open("cuda_ipc", socket_dir, "ipc", &mu_, gone));
    progress_ = std::thread([this] { ProgressLoop(); });
    return Status::Ok();
  }

  ~CudaIpcTransport() override {
    // The progress thread first (it calls into the poster), then the poster: its last job still
    // lands in pending_, and its destructor waits, bounded, for the copies still writing into
    // peer mappings before those batches fail here.
    stop_ = true;
    if (channel_) channel_->Wake();
    if (progress_.joinable()) progress_.join();
    poster_.reset();
    for (Pending& p : pending_) {
      if (!p.is_note) p.done(Status::Aborted("cuda_ipc transport destroyed"));
    }
  }

  std::string_view name() const override { return "cuda_ipc"; }
  std::string address() const override { return channel_->address(); }
  bool supports(MemoryKind kind) const override { return kind == MemoryKind::kCuda; }
  bool takes_run_groups() const override { return true; }
  // A page's heads in LBNHC -> BLHNC as one entry: the block kernel copies it from one
  // descriptor, and kvd's io thread plans and posts an eighth of the entries.
  bool takes_group_blocks() const override { return true; }

  Result<std::unique_ptr<MemoryRegistration>> register_memory(void* base, uint64_t length,
                                                              MemoryLocation where) override {
    if (where.kind != MemoryKind::kCuda) {
      return Status::Unsupported("cuda_ipc registers CUDA device memory only");
    }
    // Memory this process imported (an engine's region in kvd) is exported under its owner's
    // handle: ExportDeviceMemory looks it up in the process-wide cache of open mappings.
    auto exported = gpu::ExportDeviceMemory(base, length, where.device);
    if (!exported.ok()) return exported.status().WithContext("cuda_ipc");
    WireDescriptor wire{};
    wire.share = static_cast<uint32_t>(exported->kind);
    uint64_t token = 0;
    if (exported->kind == gpu::ShareKind::kPosixFd) {
      // A VMM allocation's fd cannot travel in the descriptor: peers fetch it from the channel's
      // fd server, whose path fits (SameHostChannel::Open).
      const std::string& fd_path = channel_->fd_server()->path();
      token = channel_->fd_server()->Add(std::move(exported->fd));
      wire.fd_token = token;
      std::memcpy(wire.fd_path, fd_path.data(), fd_path.size());
    } else {
      std::memcpy(&wire.handle, exported->handle.data(), sizeof(wire.handle));
    }
    wire.offset = exported->offset;
    wire.length = length;
    wire.allocation_bytes = exported->allocation_bytes;
    return std::unique_ptr<MemoryRegistration>(
        new IpcRegistration(base, length, where, channel_->Pack(wire, kMagic),
                            token != 0 ? channel_->fd_server() : nullptr, token));
  }

  Result<PeerId> connect(std::string_view peer_address) override {
    return channel_->Connect(peer_address, Clock::now() + connect_timeout_);
  }

  void disconnect(PeerId peer) override { channel_->Disconnect(peer); }

  Result<std::unique_ptr<RemoteMemory>> import_remote(PeerId peer,
                                                      std::string_view packed) override {
    KV_RETURN_IF_ERROR(channel_->FdPathOf(peer).status());  // kNotFound: an unknown peer
    KV_ASSIGN_OR_RETURN(WireDescriptor wire, channel_->Unpack<WireDescriptor>(packed, kMagic));
    if (wire.length == 0 || wire.offset > wire.allocation_bytes ||
        wire.length > wire.allocation_bytes - wire.offset) {
      return Status::InvalidArgument("cuda_ipc descriptor range lies outside its allocation");
    }
    if (wire.share != static_cast<uint32_t>(gpu::ShareKind::kCudaIpc) &&
        wire.share != static_cast<uint32_t>(gpu::ShareKind::kPosixFd)) {
      return Status::InvalidArgument("cuda_ipc descriptor of unknown share kind");
    }
    std::shared_ptr<gpu::IpcMemory> mapping;
    if (wire.share == static_cast<uint32_t>(gpu::ShareKind::kPosixFd)) {
      auto fd = kv::FetchFd(wire.fd_path, wire.fd_token, Clock::now() + connect_timeout_);
      if (!fd.ok()) return fd.status().WithContext("cuda_ipc: fetching a VMM region's fd");
      KV_ASSIGN_OR_RETURN(
          mapping, gpu::OpenVmmMemory(std::move(fd).value(), wire.allocation_bytes, device_));
    } else {
      KV_ASSIGN_OR_RETURN(mapping, gpu::OpenIpcMemory({reinterpret_cast<const char*>(&wire.handle),
                                                       sizeof(wire.handle)},
                                                      device_));
    }
    if (wire.offset > mapping->bytes() || wire.length > mapping->bytes() - wire.offset) {
      return Status::InvalidArgument(
          "cuda_ipc descriptor range lies outside the allocation it "
          "opens (" +
          std::to_string(mapping->bytes()) + " bytes)");
    }
    return std::unique_ptr<RemoteMemory>(
        new IpcRemote(peer, std::move(mapping), wire.offset, wire.length));
  }

  // Validates here, on the caller's thread; encoding and launching happen on the poster's
  // (poster.h), which hands the batch back through OnLaunched.
  Status post(const Batch& batch, Completion done) override {
    auto* local = dynamic_cast<const IpcRegistration*>(batch.local);
    auto* remote = dynamic_cast<const IpcRemote*>(batch.remote);
    if (local == nullptr || remote == nullptr) {
      return Status::InvalidArgument("cuda_ipc: batch names memory of another transport");
    }
    KV_RETURN_IF_ERROR(CheckBatch(batch, /*takes_groups=*/true, /*takes_blocks=*/true));
    const bool put = batch.op == Op::kPut;
    char* local_base = static_cast<char*>(local->base());
    cuda_ipc::PostJob job;
    job.peer = remote->peer();
    job.deadline = batch.deadline;
    job.src = put ? static_cast<const void*>(local_base) : remote->base();
    job.dst = put ? static_cast<void*>(remote->base()) : local_base;
    job.runs.assign(batch.runs.begin(), batch.runs.end());
    job.groups.assign(batch.groups.begin(), batch.groups.end());
    job.blocks.assign(batch.blocks.begin(), batch.blocks.end());
    job.done = std::move(done);
    // Numbered and queued under one lock: the poster's order is the gate's.
    std::lock_guard lock(mu_);
    KV_RETURN_IF_ERROR(channel_->CheckPeerLocked(job.peer));
    job.seq = gate_.BatchPosted(job.peer);
    poster_->Submit(std::move(job));
    return Status::Ok();
  }

  Status notify(PeerId peer, std::string message) override {
    if (message.size() > kv::kMaxFrameBytes) {
      return Status::InvalidArgument("cuda_ipc: notification too large");
    }
    cuda_ipc::PostJob job;
    job.peer = peer;
    job.is_note = true;
    job.deadline = Clock::now() + connect_timeout_;
    job.note = std::move(message);
    std::lock_guard lock(mu_);
    KV_RETURN_IF_ERROR(channel_->CheckPeerLocked(peer));
    const NoteGate::Ticket ticket = gate_.NotePosted(peer);
    job.first = ticket.first;
    job.seq = ticket.last;
    poster_->Submit(std::move(job));  // behind the batches posted before it (poster.h)
    return Status::Ok();
  }

  void set_notification_handler(NotificationHandler handler) override {
    channel_->SetNotificationHandler(std::move(handler));
  }

 private:
  // A batch on the stream, or a notification waiting for the batches posted before it (the gate
  // knows them).
  struct Pending {
    PeerId peer = 0;
    bool is_note = false;
    int channel = -1;  // batches: the poster's channel it runs on
    CudaEvent event;
    Completion done;
    Clock::time_point deadline;
    std::string note;
    Status launch_error = Status::Ok();  // what the batch completes with once its event fired
    uint64_t seq = 0, first = 0;         // the gate's: a batch's number; a note's Ticket
  };

  // On the poster's thread, in launch order (submission order, except that a batch taken into
  // another's launch goes with it): the batch's copies are enqueued (or failed), or the note's
  // turn came; either now waits in pending_ for the progress thread.
  void OnLaunched(cuda_ipc::PostJob job, cuda_ipc::Launch launch) {
    if (trace_ && !job.is_note) trace_("i_launched", job.seq);
    Status failed = Status::Ok();  // a batch that completes here, with this
    {
      std::lock_guard lock(mu_);
      Status gone = channel_->GoneLocked(job.peer);
      if (!gone.ok() && (job.is_note || launch.event.get() == nullptr)) {
        failed = std::move(gone);  // a note goes nowhere; a batch without an event never ran
      } else if (job.is_note) {
        Pending& note = pending_.emplace_back();
        note.peer = job.peer;
        note.is_note = true;
        note.deadline = job.deadline;
        note.note = std::move(job.note);
        note.seq = job.seq;
        note.first = job.first;
      } else if (launch.event.get() != nullptr) {
        Pending& batch = pending_.emplace_back();
        batch.peer = job.peer;
        batch.channel = launch.channel;
        batch.event = std::move(launch.event);
        batch.done = std::move(job.done);
        batch.deadline = job.deadline;
        // A gone peer's batch may be copying already: like FailPendingOf's, it fails only once
        // its event fired (or its deadline passed).
        batch.launch_error = launch.status.ok() ? std::move(gone) : std::move(launch.status);
        batch.seq = job.seq;
      } else {
        // Without an event, nothing of the batch runs: it fails now, before any note behind it.
        gate_.BatchDone(job.peer, job.seq, /*landed=*/false);
        failed = launch.status.ok() ? Status::Internal("cuda_ipc: no event behind a launch")
                                    : std::move(launch.status);
      }
    }
    if (!failed.ok() && !job.is_note) {
      if (job.done) job.done(std::move(failed));
      return;
    }
    channel_->Wake();  // the progress thread starts watching the batch's event, or the note, now
  }

  // Makes `why` the outcome of `peer`'s batches in pending_ and drops its notes (caller holds
  // mu_). The batches still complete only once their events fired (or their deadlines passed):
  // a copy on the stream goes on reading the caller's memory and writing the peer's mapping, and
  // a caller told early would free or reuse that memory under it.
  void FailPendingOf(PeerId peer, const Status& why) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->peer != peer) {
        ++it;
      } else if (it->is_note) {
        it = pending_.erase(it);
      } else {
        if (it->launch_error.ok()) it->launch_error = why;
        ++it;
      }
    }
  }

  // The side channel's passes (same_host_channel.h), each followed by a look at pending_.
  void ProgressLoop() {
    Clock::time_point last_progress = Clock::now();
    bool progressed = false;  // a batch was posted or completed since the last pass
    while (!stop_) {
      bool busy = false;
      {
        std::lock_guard lock(mu_);
        busy = !pending_.empty();
      }
      // With batches in flight the loop does not sleep: it queries their events on every pass,
      // so a finished copy completes within microseconds (a host function behind each copy woke
      // it far later: benchmarks/gpu.md, run 3). After kSpinWindow without progress (a batch gated
      // on a slow engine event, or a very long copy) it sleeps 100 us between passes instead of
      // holding a core.
      const auto now = Clock::now();
      if (!busy || progressed) last_progress = now;
      const bool spin = busy && now - last_progress < kSpinWindow;
      progressed = channel_->Poll(std::chrono::microseconds(!busy ? 50'000 : spin ? 0 : 100));
      progressed |= CompleteReady();
    }
  }

  // Asks the driver, without mu_, which batches of each channel finished: a channel runs its
  // batches in queue order, so each channel's answers stop at its first unfinished batch.
  // Outside the lock because a cudaEventQuery costs 1.3-2.1 µs on the GPU hosts and this thread
  // polls without pause: holding mu_ across the queries kept post(), notify() and the poster's
  // OnLaunched waiting (benchmarks/pd_gpu.md, twenty-seventh session). The handles stay valid
  // unlocked: only this thread removes batches from pending_ and recycles their events.
  void QueryChannels() {
    for (auto& events : probe_events_) events.clear();
    {
      std::lock_guard lock(mu_);
      for (const Pending& p : pending_) {
        if (!p.is_note) probe_events_[p.channel].push_back(p.event.get());
      }
    }
    for (int c = 0; c < kChannels; ++c) {
      probes_[c].clear();
      for (cudaEvent_t event : probe_events_[c]) {
        probes_[c].push_back(gpu::QueryEvent(event));
        if (!probes_[c].back().ok() || !*probes_[c].back()) break;
      }
    }
  }

  // Returns whether any batch finished (or failed).
  bool CompleteReady() {
    std::vector<std::pair<Completion, Status>> finished;
    std::vector<uint64_t> finished_seqs;  // for trace_ only
    std::vector<Pending> notes;
    std::vector<CudaEvent> spare;
    QueryChannels();
    {
      std::lock_guard lock(mu_);
      // The k-th batch of a channel in pending_ is the k-th QueryChannels asked about: batches
      // launched since come after it. Past the answers, a channel's batches are unfinished, and
      // only deadlines need a look.
      std::array<size_t, kChannels> asked{};
      const auto now = Clock::now();
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->is_note) {
          // The batches ahead of it may finish in this pass, or have failed before reaching
          // pending_: ask the gate, which knows them all.
          const NoteGate::Ticket ticket{it->first, it->seq};
          if (!gate_.Finished(it->peer, ticket)) {
            ++it;
            continue;
          }
          // Dropped when a batch it waited on failed (note_gate.h).
          if (gate_.MayDeliver(it->peer, ticket)) notes.push_back(std::move(*it));
          it = pending_.erase(it);
          continue;
        }
        const size_t k = asked[it->channel]++;
        const std::vector<Result<bool>>& answers = probes_[it->channel];
        Result<bool> done = k < answers.size() ? answers[k] : Result<bool>(false);
        if (done.ok() && !*done && now < it->deadline) {
          ++it;
          continue;
        }
        Status status = !done.ok() ? done.status()
                        : *done    ? it->launch_error
                                   : Status::Timeout("cuda_ipc: batch passed its deadline");
        // Only an event whose work completed is reused; one of a failed or late batch is not.
        if (done.ok() && *done) spare.push_back(std::move(it->event));
        gate_.BatchDone(it->peer, it->seq, status.ok());
        if (trace_) finished_seqs.push_back(it->seq);
        finished.emplace_back(std::move(it->done), std::move(status));
        it = pending_.erase(it);
      }
    }
    for (CudaEvent& event : spare) poster_->Recycle(std::move(event));
    for (uint64_t seq : finished_seqs) trace_("i_done", seq);
    for (auto& [done, status] : finished) done(std::move(status));
    // A peer gone by now gets none; one whose send fails is dead from then on.
    for (Pending& note : notes) channel_->SendNote(note.peer, note.note, note.deadline);
    return !finished.empty();
  }

  const int device_;
  const std::chrono::milliseconds connect_timeout_;
  const std::optional<kernels::CopyPath> copy_path_;
  const bool busy_poll_;
  const TraceFn trace_;
  std::atomic<bool> stop_{false};
  std::thread progress_;
  std::unique_ptr<cuda_ipc::Poster>
      poster_;  // its thread calls OnLaunched: reset in the destructor

  std::mutex mu_;
  std::unique_ptr<SameHostChannel> channel_;  // its peers guarded by mu_; Poll is progress_'s
  std::deque<Pending> pending_;
  NoteGate gate_;  // guarded by mu_
  // QueryChannels' per channel: the events asked about, and the answers. progress_'s alone.
  std::array<std::vector<cudaEvent_t>, kChannels> probe_events_;
  std::array<std::vector<Result<bool>>, kChannels> probes_;
};

}  // namespace

std::span<const SettingInfo> CudaIpcSettings() {
  static constexpr SettingInfo kSettings[] = {
      {"device", "CUDA ordinal of the copy streams (kvd: --device)"},
      {"socket_dir", "directory of the side-channel unix sockets (/tmp)"},
      {"connect_timeout_ms", "connects to a peer's side channel (5000)"},
      {"copy_path", "auto|kernel|engine: force the copy kernel or the copy engine (auto)"},
      {"busy_poll",
       "0|1: the posting thread spins instead of sleeping, one core (0; kvd --busy-poll)"},
  };
  return kSettings;
}

Result<std::unique_ptr<Transport>> CreateCudaIpcTransport(const TransportOptions& options) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Status::Unsupported("cuda_ipc: no CUDA device visible");
  }
  int current = 0;
  cudaGetDevice(&current);
  KV_ASSIGN_OR_RETURN(int64_t device, IntSetting(options, "cuda_ipc", "device", current, 0));
  KV_ASSIGN_OR_RETURN(int64_t timeout_ms, IntSetting(options, "cuda_ipc", "connect_timeout_ms",
                                                     5000, 0, kMaxTimeoutMs));
  KV_ASSIGN_OR_RETURN(int64_t busy_poll, IntSetting(options, "cuda_ipc", "busy_poll", 0, 0, 1));
  if (device >= count) {
    return Status::InvalidArgument("cuda_ipc: device " + std::to_string(device) + " of " +
                                   std::to_string(count));
  }
  std::string socket_dir = "/tmp";
  std::optional<kernels::CopyPath> copy_path;
  for (const auto& [k, v] : options.settings) {
    if (k == "socket_dir") socket_dir = v;
    if (k != "copy_path") continue;
    if (v == "kernel") {
      copy_path = kernels::CopyPath::kKernel;
    } else if (v == "engine") {
      copy_path = kernels::CopyPath::kCopyEngine;
    } else if (v != "auto") {
      return Status::InvalidArgument("cuda_ipc: copy_path='" + v + "' is not auto|kernel|engine");
    }
  }
  auto transport = std::make_unique<CudaIpcTransport>(static_cast<int>(device),
                                                      std::chrono::milliseconds(timeout_ms),
                                                      copy_path, busy_poll != 0, options.trace);
  KV_RETURN_IF_ERROR(transport->Start(socket_dir));
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace kv::transport
