// SendQueue (send_queue.h): groups merged by source region, destination region and engine
// event, posted together once per pass of the io loop (or sooner, when the link is about to
// idle: FlushIfDue).
#include "daemon/send_queue.h"

#include <boost/asio/post.hpp>

namespace kv::daemon {

namespace {

// What RecycleRuns keeps: room for a wave of 8 requests of 4096 tokens over 32 layers split
// for two decode ranks (64 groups of 32768 runs, 48 MiB), the shape kvbench pd measures.
constexpr size_t kMaxSpareRunBytes = size_t{128} << 20;

// failed_ holds requests by id and generation: a late failure of an ended request's batch must
// not drop the notices of a later request under the same id (NextRequestGeneration).
std::string FailedSendKey(const std::string& request_id, uint64_t generation) {
  return request_id + '\0' + std::to_string(generation);
}
std::string FailedSendKey(const SendGroup::Part& part) {
  return FailedSendKey(part.request_id, part.generation);
}

}  // namespace

SendQueue::SendQueue(boost::asio::io_context& io, EventGate* gate, Hooks hooks)
    : io_(io), gate_(gate), hooks_(std::move(hooks)) {}

Result<SendQueue::Queued> SendQueue::Send(uint64_t engine_id, const std::shared_ptr<Region>& source,
                                          const std::shared_ptr<transport::RemoteMemory>& remote,
                                          int layer, bool wait_for_engine,
                                          const std::string& request_id, uint64_t generation,
                                          Clock::time_point deadline,
                                          const std::function<Status(Plan*)>& append) {
  const int event_layer = wait_for_engine ? layer : -1;
  SendGroup* group = nullptr;
  for (SendGroup& g : groups_) {
    if (g.engine_id == engine_id && g.source == source && g.remote == remote &&
        g.event_layer == event_layer) {
      group = &g;
      break;
    }
  }
  if (group == nullptr) {
    group = &groups_.emplace_back();
    group->engine_id = engine_id;
    group->source = source;
    group->remote = remote;
    group->event_layer = event_layer;
    if (!spare_runs_.empty()) {
      group->plan.runs = std::move(spare_runs_.back());
      spare_runs_.pop_back();
      spare_run_bytes_ -= group->plan.runs.capacity() * sizeof(Run);
    }
  }
  const uint64_t runs_before = group->plan.run_count();
  const uint64_t bytes_before = group->plan.bytes;
  const Status appended = append(&group->plan);
  const Queued queued{group->plan.run_count() - runs_before, group->plan.bytes - bytes_before};
  if (!appended.ok() || queued.runs == 0) {
    // A group without parts was created above, so it is the last one.
    if (group->parts.empty()) {
      RecycleRuns(std::move(group->plan.runs));
      groups_.pop_back();
    }
    KV_RETURN_IF_ERROR(appended);
    return queued;
  }
  group->parts.push_back(SendGroup::Part{request_id, layer, queued.bytes});
  group->parts.back().generation = generation;
  group->deadline = std::min(group->deadline, deadline);
  ScheduleFlush();
  return queued;
}

void SendQueue::RecycleRuns(std::vector<Run> runs) {
  const size_t bytes = runs.capacity() * sizeof(Run);
  if (bytes == 0 || spare_run_bytes_ + bytes > kMaxSpareRunBytes) return;
  runs.clear();
  spare_run_bytes_ += bytes;
  spare_runs_.push_back(std::move(runs));
}

void SendQueue::Notice(transport::PeerId peer, const std::string& request_id, int layer,
                       std::string message) {
  notices_.push_back(QueuedNotice{peer, request_id, layer, std::move(message)});
  ScheduleFlush();
}

void SendQueue::ScheduleFlush() {
  if (flush_scheduled_) return;
  flush_scheduled_ = true;
  boost::asio::post(io_, [this] { Flush(); });
}

void SendQueue::FlushIfDue() {
  if (flush_scheduled_ &&
      bytes_posted_ - bytes_landed_.load(std::memory_order_relaxed) < kLowWaterBytes) {
    Flush();
  }
}

void SendQueue::PostIfIdle() {
  if (groups_.empty() || bytes_posted_ != bytes_landed_.load(std::memory_order_relaxed)) return;
  std::vector<SendGroup> groups = std::move(groups_);
  groups_.clear();
  for (SendGroup& group : groups) Post(group, /*defer_failures=*/true);
}

void SendQueue::Flush() {
  flush_scheduled_ = false;
  std::vector<SendGroup> groups = std::move(groups_);
  std::vector<QueuedNotice> notices = std::move(notices_);
  groups_.clear();
  notices_.clear();
  for (SendGroup& group : groups) Post(group);
  HandOver(std::move(notices));
}

void SendQueue::Post(SendGroup& group, bool defer_failures) {
  transport::Batch batch;
  batch.op = transport::Op::kPut;
  batch.local = group.source->registration.get();
  batch.remote = group.remote.get();
  batch.runs = group.plan.runs;
  batch.groups = group.plan.groups;  // only where the transport takes_run_groups()
  batch.blocks = group.plan.blocks;  // only where it takes_group_blocks()
  batch.deadline = group.deadline;
  auto done = [this, parts = group.parts, source = group.source,
               remote = group.remote](Status s) mutable {
    uint64_t landed = 0;
    for (const SendGroup::Part& part : parts) {
      Trace("flushed", part.request_id, part.layer);
      landed += part.bytes;
    }
    bytes_landed_.fetch_add(landed, std::memory_order_relaxed);
    if (!s.ok()) {
      std::lock_guard lock(failed_mu_);
      for (const SendGroup::Part& part : parts) failed_.insert(FailedSendKey(part));
    }
    // Called exactly once (transport.h): the parts move on to the io thread, uncopied.
    boost::asio::post(io_, [this, parts = std::move(parts), s = std::move(s)] {
      hooks_.done(parts, s);
      if (s.ok()) return;
      std::lock_guard lock(failed_mu_);  // ended by the hook: no longer live
      for (const SendGroup::Part& part : parts) failed_.erase(FailedSendKey(part));
    });
  };
  const Status posted = hooks_.post(group.engine_id, group.event_layer, batch, std::move(done));
  RecycleRuns(std::move(group.plan.runs));  // post() copied them
  if (posted.ok()) {
    ++batches_posted_;
    for (const SendGroup::Part& part : group.parts) bytes_posted_ += part.bytes;
  }
  if (!posted.ok() && defer_failures) {
    // Its notices, queued for Flush, are dropped there (failed_), as those of a batch that
    // completed with an error.
    {
      std::lock_guard lock(failed_mu_);
      for (const SendGroup::Part& part : group.parts) failed_.insert(FailedSendKey(part));
    }
    boost::asio::post(io_, [this, parts = std::move(group.parts), posted] {
      for (const SendGroup::Part& part : parts) {
        if (hooks_.generation_of(part.request_id) == part.generation) {
          hooks_.fail(part.request_id, posted.WithContext("request " + part.request_id + " layer " +
                                                          std::to_string(part.layer)));
        }
      }
      std::lock_guard lock(failed_mu_);  // ended by the hook: no longer live
      for (const SendGroup::Part& part : parts) failed_.erase(FailedSendKey(part));
    });
    return;
  }
  for (const SendGroup::Part& part : group.parts) {
    if (posted.ok()) {
      Trace("post", part.request_id, part.layer, part.bytes);
    } else {
      hooks_.fail(part.request_id, posted.WithContext("request " + part.request_id + " layer " +
                                                      std::to_string(part.layer)));
    }
  }
}

void SendQueue::HandOver(std::vector<QueuedNotice> notices) {
  {
    // A batch of it failed since (Flush in send_queue.h). Decided under the lock, once, so that
    // notify() runs outside it; the set is almost always empty.
    std::lock_guard lock(failed_mu_);
    if (!failed_.empty()) {
      std::erase_if(notices, [&](const QueuedNotice& notice) {
        const std::optional<uint64_t> generation = hooks_.generation_of(notice.request_id);
        return generation && failed_.count(FailedSendKey(notice.request_id, *generation)) > 0;
      });
    }
  }
  for (QueuedNotice& notice : notices) {
    const std::optional<uint64_t> generation = hooks_.generation_of(notice.request_id);
    if (!generation) continue;  // failed above, or ended meanwhile
    // Behind the batches of its peer the event gate holds, if any; a held notice the transport
    // refuses later fails its request then, as one refused now does here.
    auto refused = [this, id = notice.request_id, generation = *generation](Status s) {
      boost::asio::post(io_, [this, id, generation, s] {
        if (hooks_.generation_of(id) == generation) {
          hooks_.fail(id, s.WithContext("request " + id));
        }
      });
    };
    Status s = gate_->Notify(notice.peer, std::move(notice.message), std::move(refused));
    if (!s.ok()) {
      hooks_.fail(notice.request_id, s.WithContext("request " + notice.request_id));
      continue;
    }
    Trace("notify", notice.request_id, notice.layer);
  }
}

}  // namespace kv::daemon
