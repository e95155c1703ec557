#include "daemon/event_gate.h"

#include <sys/prctl.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "base/thread_name.h"

namespace kv::daemon {

using transport::PeerId;

EventGate::EventGate(transport::Transport* transport) : transport_(transport) {
  thread_ = std::thread([this] {
    NameThisThread("kvd-gate");
    Loop();
  });
}

EventGate::~EventGate() {
  std::list<Held> left;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    left.swap(held_);
    waiting_.clear();
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Held& h : left) h.fail(Status::Aborted("kvd's event gate stopped; nothing was started"));
}

Status EventGate::Post(const transport::Batch& batch, EventProbe fired, transport::Completion done,
                       EventKey key) {
  if (fired) {
    Result<bool> now = fired();
    if (!now.ok()) return now.status().WithContext("the engine's event");
    if (*now) fired = nullptr;  // fired already: nothing to wait for
  }
  if (!fired) return transport_->post(batch, std::move(done));
  if (batch.remote == nullptr) return Status::InvalidArgument("a batch names no remote memory");
  // Shared by the post and the failure paths: exactly one of them calls it.
  auto shared_done = std::make_shared<transport::Completion>(std::move(done));
  Held h;
  h.fired = std::move(fired);
  h.key = key;
  h.deadline = batch.deadline;
  h.peer = batch.remote->peer();
  h.start = [this, op = batch.op, local = batch.local, remote = batch.remote,
             runs = std::vector<Run>(batch.runs.begin(), batch.runs.end()),
             groups = std::vector<RunGroup>(batch.groups.begin(), batch.groups.end()),
             blocks = std::vector<GroupBlocks>(batch.blocks.begin(), batch.blocks.end()),
             deadline = batch.deadline, shared_done] {
    const transport::Batch b{op, local, remote, runs, deadline, groups, blocks};
    // Refused, post() does not call it: the poller fails the batch with the refusal instead.
    return transport_->post(b, [shared_done](Status s) { (*shared_done)(std::move(s)); });
  };
  h.fail = [shared_done](Status why) { (*shared_done)(std::move(why)); };
  {
    std::lock_guard lock(mu_);
    h.seq = notes_.BatchPosted(h.peer);
    held_.push_back(std::move(h));
    added_ = true;
  }
  wake_.notify_one();  // a poller with nothing held sleeps until there is
  return Status::Ok();
}

Status EventGate::Notify(PeerId peer, std::string message, std::function<void(Status)> refused) {
  // Under mu_, like every note the poller hands on: notes of one peer reach the transport in the
  // order they came.
  std::lock_guard lock(mu_);
  const transport::NoteGate::Ticket ticket = notes_.NotePosted(peer);
  auto waiting = waiting_.find(peer);
  if ((waiting == waiting_.end() || waiting->second.empty()) && notes_.Finished(peer, ticket)) {
    return transport_->notify(peer, std::move(message));
  }
  waiting_[peer].push_back(HeldNote{ticket, std::move(message), std::move(refused)});
  return Status::Ok();
}

void EventGate::Hold(EventProbe fired, Clock::time_point deadline, std::function<void()> start,
                     std::function<void(Status)> fail, EventKey key) {
  if (fired) {
    Result<bool> now = fired();
    if (!now.ok()) return fail(now.status().WithContext("the engine's event"));
    if (*now) fired = nullptr;
  }
  if (!fired) return start();
  Held h;
  h.fired = std::move(fired);
  h.key = key;
  h.deadline = deadline;
  h.start = [start = std::move(start)] {
    start();
    return Status::Ok();
  };
  h.fail = std::move(fail);
  {
    std::lock_guard lock(mu_);
    held_.push_back(std::move(h));
    added_ = true;
  }
  wake_.notify_one();
}

void EventGate::Disconnect(PeerId peer) {
  std::vector<Held> aborted;
  {
    std::lock_guard lock(mu_);
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->seq == 0 || it->peer != peer) {
        ++it;
        continue;
      }
      aborted.push_back(std::move(*it));
      it = held_.erase(it);
    }
    waiting_.erase(peer);
    notes_.ForgetPeer(peer);
  }
  for (Held& h : aborted) {
    h.fail(
        Status::Aborted("peer disconnected while the batch waited for its engine's event; "
                        "nothing was posted"));
  }
  transport_->disconnect(peer);
}

size_t EventGate::held() const {
  std::lock_guard lock(mu_);
  return held_.size();
}

void EventGate::Loop() {
  // So that a wait of kPoll lasts about that, not the default 50 us of timer slack more (best
  // effort: without it an event is seen up to 50 us later).
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
  std::vector<Held> start;
  std::vector<std::pair<Held, Status>> failed;
  struct Finished {
    PeerId peer;
    uint64_t seq;
    bool posted;
  };
  std::vector<Finished> finished;
  auto last_opened = Clock::now();
  std::unique_lock lock(mu_);
  while (true) {
    if (held_.empty()) {
      wake_.wait(lock, [&] { return stop_ || !held_.empty(); });
    } else {
      const bool spinning = Clock::now() - last_opened < kSpin;
      wake_.wait_for(lock, spinning ? kPoll : kBackoff, [&] { return stop_; });
    }
    if (stop_) return;
    // New work is polled closely again, even behind work of an engine long silent.
    if (added_) {
      added_ = false;
      last_opened = Clock::now();
    }
    AskKeys(lock);
    if (stop_) return;
    if (TakeOpenLocked(&start, &failed)) last_opened = Clock::now();
    if (start.empty() && failed.empty()) continue;
    lock.unlock();
    // Deadlines and events that failed first: their batches are recorded in notes_ already.
    for (auto& [h, why] : failed) h.fail(std::move(why));
    failed.clear();
    for (Held& h : start) {
      Status started = h.start();
      if (h.seq != 0) finished.push_back({h.peer, h.seq, started.ok()});
      if (!started.ok()) failed.emplace_back(std::move(h), std::move(started));
    }
    start.clear();
    lock.lock();
    for (const Finished& f : finished) BatchDoneLocked(f.peer, f.seq, f.posted);
    finished.clear();
    if (failed.empty()) continue;
    // Refused by the transport: failed once the refusal is recorded (see TakeOpenLocked).
    lock.unlock();
    for (auto& [h, why] : failed) h.fail(std::move(why));
    failed.clear();
    lock.lock();
  }
}

void EventGate::AskKeys(std::unique_lock<std::mutex>& lock) {
  asks_.clear();
  answers_.clear();
  for (const Held& h : held_) {
    if (h.key.empty()) continue;
    const bool asked = std::any_of(asks_.begin(), asks_.end(),
                                   [&](const auto& ask) { return ask.first == h.key; });
    if (!asked) asks_.emplace_back(h.key, h.fired);
  }
  if (asks_.empty()) return;
  // The probes are copies (they keep what they ask open), so work that leaves held_ meanwhile
  // (Disconnect) takes nothing from under them.
  lock.unlock();
  for (auto& [key, probe] : asks_) answers_.emplace_back(key, probe());
  asks_.clear();
  lock.lock();
}

bool EventGate::TakeOpenLocked(std::vector<Held>* start,
                               std::vector<std::pair<Held, Status>>* failed) {
  const size_t before = start->size() + failed->size();
  const size_t failed_before = failed->size();
  // A keyed probe's answer is AskKeys'; work held since it asked waits for the next pass.
  auto answer = [&](Held& h) -> Result<bool> {
    if (h.key.empty()) return h.fired();
    for (const auto& [key, answered] : answers_) {
      if (key == h.key) return answered;
    }
    return false;
  };
  const auto now = Clock::now();
  for (auto it = held_.begin(); it != held_.end();) {
    if (now >= it->deadline) {
      failed->emplace_back(std::move(*it),
                           Status::Timeout("the engine's event did not fire before the deadline; "
                                           "nothing was started"));
    } else if (Result<bool> fired = answer(*it); !fired.ok()) {
      failed->emplace_back(std::move(*it), fired.status().WithContext("the engine's event"));
    } else if (*fired) {
      start->push_back(std::move(*it));
    } else {
      ++it;
      continue;
    }
    it = held_.erase(it);
  }
  for (size_t i = failed_before; i < failed->size(); ++i) {
    const Held& h = (*failed)[i].first;
    if (h.seq != 0) BatchDoneLocked(h.peer, h.seq, /*posted=*/false);
  }
  return start->size() + failed->size() > before;
}

void EventGate::BatchDoneLocked(PeerId peer, uint64_t seq, bool posted) {
  notes_.BatchDone(peer, seq, posted);
  ReleaseNotesLocked(peer);
}

void EventGate::ReleaseNotesLocked(PeerId peer) {
  auto waiting = waiting_.find(peer);
  if (waiting == waiting_.end()) return;
  std::deque<HeldNote>& notes = waiting->second;
  while (!notes.empty() && notes_.Finished(peer, notes.front().ticket)) {
    HeldNote& note = notes.front();
    if (notes_.MayDeliver(peer, note.ticket)) {
      Status s = transport_->notify(peer, std::move(note.message));
      if (!s.ok() && note.refused) note.refused(std::move(s));
    }
    notes.pop_front();
  }
  if (notes.empty()) waiting_.erase(waiting);
}

}  // namespace kv::daemon
