#include "transport/host_ipc/host_ipc_transport.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "base/framed_socket.h"
#include "base/thread_name.h"
#include "base/unique_fd.h"
#include "transport/host_ipc/copier.h"
#include "transport/host_ipc/regions.h"
#include "transport/note_gate.h"
#include "transport/run_check.h"
#include "transport/same_host_channel.h"
#include "transport/settings.h"

namespace kv::transport {
namespace {

using host_ipc::kMagic;
using host_ipc::WireDescriptor;

// A batch to copy, or a notification to send once the batches before it finished.
struct Job {
  PeerId peer = 0;
  bool is_note = false;
  Clock::time_point deadline;
  uint64_t seq = 0, first = 0;  // the gate's: a batch's number; a note's Ticket
  // Batches:
  const char* src = nullptr;
  char* dst = nullptr;
  std::shared_ptr<SharedMemory> mapping;  // keeps the peer's region mapped until the copy ends
  std::vector<Run> runs;
  std::vector<RunGroup> groups;
  Completion done;
  Status status = Status::Ok();  // once copied (or failed)
  // Notes:
  std::string note;
};

// Completions held back while more batches wait to be copied (CopyLoop).
constexpr size_t kMaxDeferred = 16;
constexpr uint64_t kMaxDeferredBytes = 8 << 20;

class HostIpcTransport final : public Transport {
 public:
  HostIpcTransport(std::chrono::milliseconds connect_timeout, int copy_threads)
      : connect_timeout_(connect_timeout), copier_(copy_threads) {}

  Status Start(const std::string& socket_dir) {
    // A peer gone: its queued jobs never run (their batches fail with the channel's status), and
    // its notes go nowhere.
    auto gone = [this](PeerId peer, const Status&, std::vector<Completion>* failed) {
      TakeJobsOf(&queue_, peer, failed);
      gate_.ForgetPeer(peer);
    };
    KV_ASSIGN_OR_RETURN(channel_,
                        SameHostChannel::Open("host_ipc", socket_dir, "hipc", &mu_, gone));
    // The side channel: accepts peers' connections, delivers their notifications, and watches the
    // connections to peers for closing.
    progress_ = std::thread([this] {
      NameThisThread("hipc-progress");
      while (!stop_) channel_->Poll(std::chrono::milliseconds(50));
    });
    copy_thread_ = std::thread([this] {
      NameThisThread("hipc-copy");
      CopyLoop();
    });
    return Status::Ok();
  }

  ~HostIpcTransport() override {
    std::deque<Job> left;
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      left.swap(queue_);
    }
    work_.notify_all();
    if (channel_) channel_->Wake();
    // The copy thread finishes the copy in hand (it completes it), then stops.
    if (copy_thread_.joinable()) copy_thread_.join();
    if (progress_.joinable()) progress_.join();
    for (Job& job : left) {
      if (!job.is_note && job.done) job.done(Status::Aborted("host_ipc transport destroyed"));
    }
  }

  std::string_view name() const override { return "host_ipc"; }
  std::string address() const override { return channel_->address(); }
  bool supports(MemoryKind kind) const override { return kind == MemoryKind::kHost; }
  bool takes_run_groups() const override { return true; }

  Result<std::unique_ptr<MemoryRegistration>> register_memory(void* base, uint64_t length,
                                                              MemoryLocation where) override {
    (void)base;
    (void)length;
    (void)where;
    return Status::Unsupported(
        "host_ipc maps a peer's memory object: register host memory with the fd of its "
        "memfd (register_shared_memory)");
  }

  Result<std::unique_ptr<MemoryRegistration>> register_shared_memory(
      void* base, uint64_t length, MemoryLocation where, const SharedObject& object) override {
    if (where.kind != MemoryKind::kHost) {
      return Status::Unsupported("host_ipc registers host memory only");
    }
    if (base == nullptr || length == 0) {
      return Status::InvalidArgument("register_memory needs a non-null base and a length > 0");
    }
    if (object.fd < 0) {
      return Status::Unsupported(
          "host_ipc maps a peer's memory object: this memory has no fd (register host memory "
          "that lives in a sealed memfd)");
    }
    // Checked here too, so that the exporter learns of a bad object, not only its peers.
    const int seals = fcntl(object.fd, F_GET_SEALS);
    if (seals < 0 || (seals & SharedMemory::kRequiredSeals) != SharedMemory::kRequiredSeals) {
      return Status::InvalidArgument(
          "host_ipc: the memory object is not a memfd sealed against resizing (F_SEAL_SHRINK | "
          "F_SEAL_GROW): a peer mapping it could be killed by SIGBUS");
    }
    struct stat st {};
    if (fstat(object.fd, &st) != 0 || st.st_size < 0 ||
        static_cast<uint64_t>(st.st_size) < object.offset ||
        static_cast<uint64_t>(st.st_size) - object.offset < length) {
      return Status::OutOfRange("host_ipc: the memory object holds " + std::to_string(st.st_size) +
                                " bytes, fewer than offset " + std::to_string(object.offset) +
                                " + length " + std::to_string(length));
    }
    UniqueFd dup(fcntl(object.fd, F_DUPFD_CLOEXEC, 0));
    if (!dup.valid()) return Status::IoError("host_ipc: dup of the memory object's fd failed");
    WireDescriptor wire{};
    const std::shared_ptr<FdServer>& fd_server = channel_->fd_server();
    std::memcpy(wire.fd_path, fd_server->path().data(), fd_server->path().size());  // fits (Open)
    wire.fd_token = fd_server->Add(std::move(dup));
    wire.offset = object.offset;
    wire.length = length;
    return std::unique_ptr<MemoryRegistration>(new host_ipc::Registration(
        base, length, where, channel_->Pack(wire, kMagic), fd_server, wire.fd_token));
  }

  Result<PeerId> connect(std::string_view peer_address) override {
    return channel_->Connect(peer_address, Clock::now() + connect_timeout_);
  }

  void disconnect(PeerId peer) override { channel_->Disconnect(peer); }

  Result<std::unique_ptr<RemoteMemory>> import_remote(PeerId peer,
                                                      std::string_view packed) override {
    KV_ASSIGN_OR_RETURN(const std::string fd_path, channel_->FdPathOf(peer));
    KV_ASSIGN_OR_RETURN(const WireDescriptor wire,
                        channel_->Unpack<WireDescriptor>(packed, kMagic));
    // Only the fd server beside the side channel this peer was connected on: a descriptor cannot
    // send this process to another socket of the host.
    if (fd_path != wire.fd_path) {
      return Status::InvalidArgument("host_ipc descriptor names another process's fd server");
    }
    if (wire.length == 0 || wire.offset + wire.length < wire.offset) {
      return Status::InvalidArgument("host_ipc descriptor range is empty or wraps");
    }
    auto fd = FetchFd(wire.fd_path, wire.fd_token, Clock::now() + connect_timeout_);
    if (!fd.ok()) return fd.status().WithContext("host_ipc: fetching a region's memory object");
    // Adopt refuses an object not sealed against resizing and one shorter than offset + length,
    // and maps the range populated.
    auto mapping = SharedMemory::Adopt(fd->release(), wire.length, wire.offset);
    if (!mapping.ok()) return mapping.status().WithContext("host_ipc: mapping a peer's region");
    return std::unique_ptr<RemoteMemory>(
        new host_ipc::Remote(peer, std::make_shared<SharedMemory>(std::move(mapping).value())));
  }

  Status post(const Batch& batch, Completion done) override {
    auto* local = dynamic_cast<const host_ipc::Registration*>(batch.local);
    auto* remote = dynamic_cast<const host_ipc::Remote*>(batch.remote);
    if (local == nullptr || remote == nullptr) {
      return Status::InvalidArgument("host_ipc: batch names memory of another transport");
    }
    KV_RETURN_IF_ERROR(CheckBatch(batch, /*takes_groups=*/true));
    const bool put = batch.op == Op::kPut;
    char* local_base = static_cast<char*>(local->base());
    Job job;
    job.peer = remote->peer();
    job.deadline = batch.deadline;
    job.src = put ? local_base : remote->base();
    job.dst = put ? remote->base() : local_base;
    job.mapping = remote->mapping();
    job.runs.assign(batch.runs.begin(), batch.runs.end());
    job.groups.assign(batch.groups.begin(), batch.groups.end());
    job.done = std::move(done);
    {
      std::lock_guard lock(mu_);
      KV_RETURN_IF_ERROR(channel_->CheckPeerLocked(job.peer));
      job.seq = gate_.BatchPosted(job.peer);
      queue_.push_back(std::move(job));
    }
    work_.notify_one();
    return Status::Ok();
  }

  Status notify(PeerId peer, std::string message) override {
    if (message.size() > kv::kMaxFrameBytes) {
      return Status::InvalidArgument("host_ipc: notification too large");
    }
    Job job;
    job.peer = peer;
    job.is_note = true;
    job.note = std::move(message);
    {
      std::lock_guard lock(mu_);
      KV_RETURN_IF_ERROR(channel_->CheckPeerLocked(peer));
      const NoteGate::Ticket ticket = gate_.NotePosted(peer);
      job.first = ticket.first;
      job.seq = ticket.last;
      queue_.push_back(std::move(job));  // behind the batches posted before it
    }
    work_.notify_one();
    return Status::Ok();
  }

  void set_notification_handler(NotificationHandler handler) override {
    channel_->SetNotificationHandler(std::move(handler));
  }

 private:
  // Completions of batches copied, not yet called, in copy order (the copy thread's).
  struct Finished {
    Completion done;
    Status status;
  };

  // The copy thread: runs the queue in order. Completions are called once the queue ran empty,
  // or kMaxDeferred batches / kMaxDeferredBytes after the first of them, not after each batch:
  // kvd's completion hands over to its io thread (~8 µs on the dev VM, a thread wake-up), and
  // the next batch's copy need not wait for that. Notes do not wait for them either: they go at
  // their turn, once the data before them landed.
  void CopyLoop() {
    std::vector<Finished> finished;
    uint64_t finished_bytes = 0;
    auto flush = [&] {
      for (Finished& f : finished) f.done(std::move(f.status));
      finished.clear();
      finished_bytes = 0;
    };
    while (true) {
      Job job;
      {
        std::unique_lock lock(mu_);
        if (queue_.empty() && !finished.empty() && !stop_) {
          lock.unlock();
          flush();
          continue;
        }
        work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) break;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      if (job.is_note) {
        SendNote(std::move(job));
        continue;
      }
      finished_bytes += RunBatch(job);
      finished.push_back({std::move(job.done), std::move(job.status)});
      if (finished.size() >= kMaxDeferred || finished_bytes >= kMaxDeferredBytes) flush();
    }
    flush();
  }

  // Copies `job` (unless its deadline passed) and sets job.status; returns the bytes it copied.
  uint64_t RunBatch(Job& job) {
    uint64_t bytes = 0;
    if (Clock::now() >= job.deadline) {
      job.status = Status::Timeout("host_ipc: batch passed its deadline before its turn");
    } else {
      copier_.Copy(job.src, job.dst, job.runs, job.groups);
      for (const Run& r : job.runs) bytes += r.length;
      for (const RunGroup& g : job.groups) bytes += g.count * g.length;
    }
    {
      std::lock_guard lock(mu_);
      // A peer that went while the copy ran: the copy is over, and the batch fails as its queued
      // companions did.
      if (job.status.ok()) job.status = channel_->GoneLocked(job.peer);
      gate_.BatchDone(job.peer, job.seq, job.status.ok());  // a peer gone is forgotten: no-op
    }
    job.mapping.reset();  // before the caller learns of it: the last user unmaps here
    return bytes;
  }

  // At its turn every batch before it finished (one thread runs the queue in order).
  void SendNote(Job job) {
    {
      std::lock_guard lock(mu_);
      // Dropped when a batch it follows failed (note_gate.h).
      if (!gate_.MayDeliver(job.peer, NoteGate::Ticket{job.first, job.seq})) return;
    }
    channel_->SendNote(job.peer, job.note, Clock::now() + connect_timeout_);  // a gone peer: none
  }

  const std::chrono::milliseconds connect_timeout_;
  host_ipc::Copier copier_;  // the copy thread's
  std::thread progress_;
  std::thread copy_thread_;

  std::mutex mu_;
  std::unique_ptr<SameHostChannel> channel_;  // its peers guarded by mu_; Poll is progress_'s
  std::condition_variable work_;
  std::atomic<bool> stop_{false};  // written under mu_
  std::deque<Job> queue_;          // guarded by mu_: batches and notes, in posting order
  NoteGate gate_;                  // guarded by mu_
};

}  // namespace

std::span<const SettingInfo> HostIpcSettings() {
  static constexpr SettingInfo kSettings[] = {
      {"socket_dir", "directory of the side-channel and fd-server unix sockets (/tmp)"},
      {"connect_timeout_ms", "connects to a peer's side channel and fd fetches (5000)"},
      {"copy_threads",
       "threads a batch of 1 MiB or more is split over: the copy thread and copy_threads - 1 "
       "helpers (1)"},
  };
  return kSettings;
}

Result<std::unique_ptr<Transport>> CreateHostIpcTransport(const TransportOptions& options) {
  KV_ASSIGN_OR_RETURN(int64_t timeout_ms, IntSetting(options, "host_ipc", "connect_timeout_ms",
                                                     5000, 1, kMaxTimeoutMs));
  KV_ASSIGN_OR_RETURN(int64_t copy_threads, IntSetting(options, "host_ipc", "copy_threads", 1, 1,
                                                       host_ipc::Copier::kMaxThreads));
  std::string socket_dir = "/tmp";
  for (const auto& [k, v] : options.settings) {
    if (k == "socket_dir") socket_dir = v;
  }
  auto transport = std::make_unique<HostIpcTransport>(std::chrono::milliseconds(timeout_ms),
                                                      static_cast<int>(copy_threads));
  KV_RETURN_IF_ERROR(transport->Start(socket_dir));
  return std::unique_ptr<Transport>(std::move(transport));
}

}  // namespace kv::transport
