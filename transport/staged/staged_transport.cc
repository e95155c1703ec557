// The staged transport's verbs (validation on the caller's thread, then a task for the worker),
// its worker loop, shutdown and factory. The protocol: staged_transport.h; threading: core.h.
#include "transport/staged/staged_transport.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <utility>

#include "base/thread_name.h"
#include "transport/intervals.h"
#include "transport/run_check.h"
#include "transport/settings.h"
#include "transport/staged/core.h"

namespace kv::transport {
namespace staged {
namespace {

constexpr auto kShutdownBound = std::chrono::seconds(10);

uint64_t RandomInstance() {
  std::random_device device;
  return (uint64_t{device()} << 32 ^ device()) ^
         static_cast<uint64_t>(Clock::now().time_since_epoch().count());
}

}  // namespace

StagedRegistration::~StagedRegistration() {
  owner_->ForgetRegion(id_);
}

std::string StagedRegistration::packed_descriptor() const {
  return EncodeRegion(
      {owner_->instance(), id_, length_, where_, inner_ ? inner_->packed_descriptor() : ""});
}

bool StagesBetter(std::span<const Run> runs, uint64_t stage_runs_below) {
  if (runs.empty() || stage_runs_below == 0) return false;
  uint64_t bytes = 0;
  for (const Run& r : runs) bytes += r.length;
  return bytes / runs.size() < stage_runs_below;
}

Core::Core(std::unique_ptr<Transport> inner, const Config& config)
    : config_(config), instance_(RandomInstance()), inner_(std::move(inner)) {
  inner_->set_notification_handler([this](std::string_view frame) { OnFrame(frame); });
  worker_ = std::thread([this] {
    NameThisThread("staged-worker");
    WorkerLoop();
  });
}

Core::~Core() {
  // Fail every link and close every connection the decorator opened, then wait (bounded) until
  // no gather or inner put still touches a slot, so the slots can go before the inner does.
  Enqueue([this] {
    for (auto& [peer, link] : out_) {
      FailLink(link, Status::Aborted("the staged transport is shutting down"), nullptr);
      inner_->disconnect(peer);
    }
    std::vector<PeerId> backs;
    {
      std::lock_guard lock(links_mu_);
      for (auto& [key, link] : in_) backs.push_back(link.back);
    }
    for (PeerId back : backs) inner_->disconnect(back);
  });
  {
    std::unique_lock lock(queue_mu_);
    stop_ = true;
    queue_cv_.notify_all();
  }
  worker_.join();
  inner_->set_notification_handler([](std::string_view) {});
  stager_.reset();  // waits for copies in flight
  // Completions the bounded wait above left behind: exactly once, even now.
  for (auto& [peer, link] : out_) {
    for (auto& job : link.jobs) {
      if (job->done) std::exchange(job->done, nullptr)(Status::Aborted("transport destroyed"));
    }
    for (auto& [seq, get] : link.gets) {
      if (get->done) std::exchange(get->done, nullptr)(Status::Aborted("transport destroyed"));
    }
  }
  out_.clear();
  in_.clear();  // no ScatterHere runs any more: the handler above was replaced synchronously
  inner_.reset();
}

void Core::Enqueue(std::function<void()> task) {
  std::lock_guard lock(queue_mu_);
  tasks_.push_back(std::move(task));
  queue_cv_.notify_one();
}

void Core::WorkerLoop() {
  Clock::time_point stop_by = Clock::time_point::max();
  for (;;) {
    std::deque<std::function<void()>> batch;
    {
      std::unique_lock lock(queue_mu_);
      // Deadlines are checked at least this often while batches are in flight; an idle worker
      // sleeps until there is work.
      auto ready = [&] { return !tasks_.empty() || stop_; };
      if (Active() || Busy())
        queue_cv_.wait_for(lock, std::chrono::milliseconds(20), ready);
      else
        queue_cv_.wait(lock, ready);
      batch.swap(tasks_);
      if (stop_ && stop_by == Clock::time_point::max()) stop_by = Clock::now() + kShutdownBound;
    }
    for (auto& task : batch) task();
    CheckDeadlines();
    if (stop_by != Clock::time_point::max() && (!Busy() || Clock::now() > stop_by)) {
      std::lock_guard lock(queue_mu_);
      if (tasks_.empty() || Clock::now() > stop_by) return;
    }
  }
}

Stager& Core::stager() {
  if (!stager_) stager_ = std::make_unique<Stager>();
  return *stager_;
}

bool Core::supports(MemoryKind kind) const {
  return inner_->supports(kind) || (kind == MemoryKind::kCuda && BuiltWithCuda());
}

Result<std::unique_ptr<MemoryRegistration>> Core::register_memory(void* base, uint64_t length,
                                                                  MemoryLocation where) {
  const bool host = where.kind == MemoryKind::kHost;
  const bool staged = host ? config_.stage_host : !inner_->supports(where.kind);
  // A host region both paths reach: the inner registration, and a region id for staged batches.
  const bool both = host && !staged && config_.stage_runs_below > 0;
  if (!staged && !both) return inner_->register_memory(base, length, where);
  std::unique_ptr<MemoryRegistration> inner;
  if (both) {
    KV_ASSIGN_OR_RETURN(inner, inner_->register_memory(base, length, where));
  }
  if (!BuiltWithCuda() && where.kind == MemoryKind::kCuda)
    return Status::Unsupported(
        "this UCX has no CUDA memory support and this build has no CUDA to stage GPU memory "
        "through pinned host memory");
  if (base == nullptr || length == 0)
    return Status::InvalidArgument("register_memory needs a non-null base and a length > 0");
  if (where.kind == MemoryKind::kCuda)
    Enqueue([this, device = where.device] { stager().Warm(device); });
  std::lock_guard lock(mu_);
  const uint64_t id = next_region_++;
  regions_[id] = {static_cast<char*>(base), length, where};
  return std::unique_ptr<MemoryRegistration>(
      new StagedRegistration(this, id, base, length, where, std::move(inner)));
}

Status Core::guard_writes(const MemoryRegistration& memory) {
  auto* staged = dynamic_cast<const StagedRegistration*>(&memory);
  if (staged == nullptr) return inner_->guard_writes(memory);
  if (staged->inner() != nullptr) KV_RETURN_IF_ERROR(inner_->guard_writes(*staged->inner()));
  std::lock_guard lock(mu_);
  auto r = regions_.find(staged->id());
  if (r == regions_.end()) return Status::NotFound("staged: no such registration");
  r->second.guarded = true;
  return Status::Ok();
}

Status Core::grant_writes(uint64_t grant, PeerId peer, const MemoryRegistration& memory,
                          std::span<const WriteRange> ranges) {
  auto* staged = dynamic_cast<const StagedRegistration*>(&memory);
  if (staged == nullptr) return inner_->grant_writes(grant, peer, memory, ranges);
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  intervals.reserve(ranges.size());
  for (const WriteRange& w : ranges) {
    if (w.length == 0) continue;
    if (w.offset > staged->length() || w.length > staged->length() - w.offset) {
      return Status::OutOfRange("staged: a write grant runs past its registration");
    }
    intervals.emplace_back(w.offset, w.offset + w.length);
  }
  SortAndMerge(intervals);
  if (staged->inner() != nullptr) {
    KV_RETURN_IF_ERROR(inner_->grant_writes(grant, peer, *staged->inner(), ranges));
  }
  std::lock_guard lock(mu_);
  auto r = regions_.find(staged->id());
  if (r == regions_.end()) return Status::NotFound("staged: no such registration");
  auto& held = r->second.grants[grant];
  held.insert(held.end(), intervals.begin(), intervals.end());
  if (held.size() != intervals.size()) std::sort(held.begin(), held.end());
  granted_regions_[grant].push_back(staged->id());
  return Status::Ok();
}

void Core::revoke_writes(uint64_t grant) {
  inner_->revoke_writes(grant);
  std::lock_guard lock(mu_);
  auto it = granted_regions_.find(grant);
  if (it == granted_regions_.end()) return;
  for (uint64_t id : it->second) {
    auto r = regions_.find(id);
    if (r != regions_.end()) r->second.grants.erase(grant);
  }
  granted_regions_.erase(it);
}

void Core::ForgetRegion(uint64_t id) {
  std::lock_guard lock(mu_);
  regions_.erase(id);
}

Result<PeerId> Core::connect(std::string_view peer_address) {
  KV_ASSIGN_OR_RETURN(PeerId peer, inner_->connect(peer_address));
  std::lock_guard lock(mu_);
  connected_.insert(peer);
  return peer;
}

Result<PeerId> Core::connect_endpoint(std::string_view peer_address, uint64_t endpoint) {
  KV_ASSIGN_OR_RETURN(PeerId peer, inner_->connect_endpoint(peer_address, endpoint));
  std::lock_guard lock(mu_);
  connected_.insert(peer);
  return peer;
}

void Core::disconnect(PeerId peer) {
  {
    std::lock_guard lock(mu_);
    connected_.erase(peer);
  }
  inner_->disconnect(peer);
  Enqueue([this, peer] {
    auto it = out_.find(peer);
    if (it == out_.end()) return;
    FailLink(it->second, Status::Aborted("peer " + std::to_string(peer) + " disconnected"),
             nullptr);
  });
}

Result<std::unique_ptr<RemoteMemory>> Core::import_remote(PeerId peer, std::string_view packed) {
  if (!IsRegionDescriptor(packed)) return inner_->import_remote(peer, packed);
  KV_ASSIGN_OR_RETURN(RegionDescriptor d, DecodeRegion(packed));
  std::unique_ptr<RemoteMemory> inner;
  if (!d.inner.empty()) {
    if (d.location.kind != MemoryKind::kHost)
      return Status::InvalidArgument("a staged descriptor names direct memory that is not host");
    KV_ASSIGN_OR_RETURN(inner, inner_->import_remote(peer, d.inner));
  }
  std::lock_guard lock(mu_);
  if (connected_.count(peer) == 0)
    return Status::NotFound("peer " + std::to_string(peer) + " is not connected");
  return std::unique_ptr<RemoteMemory>(new StagedRemote(this, peer, d, std::move(inner)));
}

Status Core::post(const Batch& batch, Completion done) {
  KV_RETURN_IF_ERROR(CheckBatch(batch));
  auto* local = dynamic_cast<const StagedRegistration*>(batch.local);
  auto* remote = dynamic_cast<const StagedRemote*>(batch.remote);
  if (local == nullptr && remote == nullptr) return inner_->post(batch, std::move(done));
  if ((local != nullptr && local->owner() != this) ||
      (remote != nullptr && remote->owner() != this))
    return Status::InvalidArgument("batch names memory of another transport");
  // Where the inner transport reaches a side directly: its inner registration or import.
  const MemoryRegistration* inner_local = local == nullptr ? batch.local : local->inner();
  const RemoteMemory* inner_remote = remote == nullptr ? batch.remote : remote->inner();
  if (inner_local != nullptr && inner_remote != nullptr) {
    // Host to host, both ends registered with both paths: the chooser picks one per batch.
    const bool choose = local != nullptr && remote != nullptr;
    if (!choose || !StagesBetter(batch.runs, config_.stage_runs_below)) {
      Batch direct = batch;
      direct.local = inner_local;
      direct.remote = inner_remote;
      return inner_->post(direct, std::move(done));
    }
  }
  if (batch.op == Op::kGet) {
    if (remote == nullptr)
      return Status::Unsupported(
          "a staged get reads a peer's staged region; this one names direct (inner) memory");
    return PostGet(batch, *remote, std::move(done));
  }
  // A staged source and a destination the inner reaches: gather, then straight into it.
  if (inner_local == nullptr && inner_remote != nullptr) {
    Batch direct = batch;
    direct.remote = inner_remote;
    return PostStaged(direct, false, std::move(done));
  }
  return PostStaged(batch, remote != nullptr, std::move(done));
}

Status Core::PostStaged(const Batch& batch, bool remote_staged, Completion done) {
  auto* remote = remote_staged ? static_cast<const StagedRemote*>(batch.remote) : nullptr;
  const PeerId peer = batch.remote->peer();
  {
    std::lock_guard lock(mu_);
    if (connected_.count(peer) == 0)
      return Status::NotFound("peer " + std::to_string(peer) + " is not connected");
    staged_peers_.insert(peer);
  }
  auto job = std::make_shared<Job>();
  job->local_base = static_cast<char*>(batch.local->base());
  job->local_at = batch.local->location();
  job->remote_staged = remote_staged;
  job->region = remote != nullptr ? remote->region() : 0;
  job->inner_remote = remote != nullptr ? nullptr : batch.remote;
  job->chunks = PlanChunks(batch.runs, config_.slot_bytes, job->remote_staged);
  job->deadline = batch.deadline;
  job->done = std::move(done);
  Enqueue([this, peer, job = std::move(job)]() mutable { AddJob(peer, std::move(job)); });
  return Status::Ok();
}

Status Core::notify(PeerId peer, std::string message) {
  {
    std::lock_guard lock(mu_);
    if (connected_.count(peer) == 0)
      return Status::NotFound("peer " + std::to_string(peer) + " is not connected");
    if (staged_peers_.count(peer) != 0) {
      Enqueue([this, peer, m = std::move(message)]() mutable { AddNote(peer, std::move(m)); });
      return Status::Ok();
    }
  }
  // No staged batch ever went to this peer: the inner transport orders the note on its own.
  return inner_->notify(peer, EncodeUser(message));
}

void Core::set_notification_handler(NotificationHandler handler) {
  auto shared = std::make_shared<const NotificationHandler>(std::move(handler));
  std::lock_guard lock(mu_);
  handler_ = std::move(shared);
}

void Core::Deliver(std::string_view message) {
  std::shared_ptr<const NotificationHandler> handler;
  {
    std::lock_guard lock(mu_);
    handler = handler_;
  }
  if (handler && *handler) (*handler)(message);
}

void Core::OnFrame(std::string_view frame) {
  if (!frame.empty() && frame[0] == kUserTag) {
    {
      std::lock_guard lock(in_mu_);
      if (!inbound_.empty()) {
        auto entry = std::make_shared<InEntry>();
        entry->note = std::string(frame.substr(1));
        inbound_.push_back(std::move(entry));
        return;
      }
    }
    Deliver(frame.substr(1));  // nothing queued before it
    return;
  }
  auto type = PeekControl(frame);
  if (!type.ok()) return;  // not ours: a peer that is no staged transport; nothing to answer
  std::string copy(frame);
  switch (*type) {
    case ControlType::kHello:
      Enqueue([this, f = std::move(copy)] { OnHello(f); });
      break;
    case ControlType::kWelcome:
      Enqueue([this, f = std::move(copy)] { OnWelcome(f); });
      break;
    case ControlType::kAck:
      Enqueue([this, f = std::move(copy)] { OnAck(f); });
      break;
    case ControlType::kGetRequest:
      Enqueue([this, f = std::move(copy)] { OnGetRequest(f); });
      break;
    case ControlType::kGetDone:
      Enqueue([this, f = std::move(copy)] { OnGetDone(f); });
      break;
    case ControlType::kData: {
      // Queued here, on the thread that delivers notifications, so that a note after it waits.
      auto entry = std::make_shared<InEntry>();
      entry->data = true;
      {
        std::lock_guard lock(in_mu_);
        inbound_.push_back(entry);
      }
      if (ScatterHere(copy, entry.get())) break;
      Enqueue([this, f = std::move(copy), entry] { OnData(f, entry); });
      break;
    }
  }
}

Result<Config> ParseConfig(const TransportOptions& options) {
  Config c;
  KV_ASSIGN_OR_RETURN(
      int64_t bytes,
      IntSetting(options, "staged", "staging_bytes", static_cast<int64_t>(c.slot_bytes),
                 static_cast<int64_t>(kMinSlotBytes), static_cast<int64_t>(kMaxSlotBytes)));
  KV_ASSIGN_OR_RETURN(int64_t slots,
                      IntSetting(options, "staged", "staging_slots", c.slots, 2, kMaxSlots));
  KV_ASSIGN_OR_RETURN(int64_t host, IntSetting(options, "staged", "stage_host", 0, 0, 1));
  KV_ASSIGN_OR_RETURN(int64_t below, IntSetting(options, "staged", "stage_runs_below",
                                                static_cast<int64_t>(c.stage_runs_below), 0,
                                                static_cast<int64_t>(kMaxSlotBytes)));
  c.stage_runs_below = static_cast<uint64_t>(below);
  c.slot_bytes = static_cast<uint64_t>(bytes);
  c.slots = static_cast<uint32_t>(slots);
  c.stage_host = host != 0;
  return c;
}

}  // namespace staged

std::span<const SettingInfo> StagedSettings() {
  static constexpr SettingInfo kSettings[] = {
      {"staging_bytes", "bytes of a pinned staging slot for GPU regions (16777216, >= 4096)"},
      {"staging_slots", "staging slots per link and direction, 2..64 (4)"},
      {"stage_host", "1: stage host regions too, with memcpy (tests; 0)"},
      {"stage_runs_below",
       "host batches whose mean run is shorter go gather -> one put -> scatter (4096; 0: "
       "never)"},
  };
  return kSettings;
}

Result<std::unique_ptr<Transport>> CreateStagedTransport(BackendFactory inner,
                                                         const TransportOptions& options) {
  KV_ASSIGN_OR_RETURN(staged::Config config, staged::ParseConfig(options));
  TransportOptions rest;
  for (const auto& setting : options.settings) {
    if (setting.first != "staging_bytes" && setting.first != "staging_slots" &&
        setting.first != "stage_host" && setting.first != "stage_runs_below")
      rest.settings.push_back(setting);
  }
  KV_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, inner(rest));
  return std::unique_ptr<Transport>(new staged::Core(std::move(t), config));
}

}  // namespace kv::transport
