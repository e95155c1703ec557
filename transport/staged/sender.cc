// The sending half of the staged transport: outbound links, the chunk pipeline (gather into a
// send slot, inner put into the receiver's slot, kData), acks, deadlines and the user's
// notifications held behind staged batches. Worker thread only (core.h).
#include <algorithm>
#include <cstring>

#include "transport/staged/core.h"

namespace kv::transport::staged {

OutLink& Core::Out(PeerId peer) {
  OutLink& link = out_[peer];
  link.peer = peer;
  return link;
}

void Core::AddJob(PeerId peer, std::shared_ptr<Job> job) {
  OutLink& link = Out(peer);
  job->seq = link.next_job++;
  link.jobs.push_back(job);
  if (link.state == OutLink::State::kFailed) {
    job->failed = true;
    job->status = Status::Unavailable("peer " + std::to_string(peer) +
                                      ": its staged link failed; connect again");
  }
  MaybeComplete(link, job);
  Pump(link);
}

void Core::AddNote(PeerId peer, std::string message) {
  OutLink& link = Out(peer);
  if (link.state == OutLink::State::kFailed) return;  // as the inner does for a dead peer
  link.notes.emplace_back(link.next_job - 1, std::move(message));
  FlushNotes(link);
}

void Core::FlushNotes(OutLink& link) {
  // Every job up to `issued_through` has handed all its chunks to the inner transport.
  uint64_t issued_through = link.next_job - 1;
  for (const auto& job : link.jobs) {
    if (!job->failed && job->issued < job->chunks.size()) {
      issued_through = job->seq - 1;
      break;
    }
  }
  while (!link.notes.empty() && link.notes.front().first <= issued_through) {
    Status s = inner_->notify(link.peer, EncodeUser(link.notes.front().second));
    link.notes.pop_front();
    if (!s.ok()) {
      FailLink(link, s, nullptr);
      return;
    }
  }
}

Status Core::PrepareSlots(OutLink& link) {
  if (!link.send_slots.empty()) return Status::Ok();
  for (uint32_t i = 0; i < config_.slots; ++i) {
    KV_ASSIGN_OR_RETURN(auto slot, stager().AllocateSlot(*inner_, config_.slot_bytes, false));
    link.send_slots.push_back(std::move(slot));
    link.free_send.push_back(i);
  }
  return Status::Ok();
}

Status Core::Open(OutLink& link) {
  if (link.state != OutLink::State::kIdle) return Status::Ok();
  link.state = OutLink::State::kOpening;
  HelloMsg hello{{instance_, link.peer}, inner_->address(), config_.slots, config_.slot_bytes};
  return inner_->notify(link.peer, EncodeHello(hello));
}

void Core::Pump(OutLink& link) {
  if (link.state == OutLink::State::kFailed) return;
  for (size_t i = 0; i < link.jobs.size(); ++i) {
    std::shared_ptr<Job> job = link.jobs[i];
    if (job->failed || job->started == job->chunks.size()) continue;
    if (Status s = PrepareSlots(link); !s.ok()) return FailLink(link, s, job.get());
    if (job->remote_staged && link.state != OutLink::State::kReady) {
      if (Status s = Open(link); !s.ok()) return FailLink(link, s, job.get());
      return;  // chunks wait for the receiver's slots; later jobs wait behind them
    }
    while (job->started < job->chunks.size()) {
      if (link.free_send.empty() || (job->remote_staged && link.free_recv.empty())) return;
      StartChunk(link, job, i);
      if (link.state == OutLink::State::kFailed) return;
    }
  }
}

std::vector<std::shared_ptr<Job>> Core::Riders(const OutLink& link, size_t position) const {
  auto shares = [](const Job& j) {
    return j.remote_staged && j.local_at.kind == MemoryKind::kHost && j.chunks.size() == 1 &&
           j.started == 0 && !j.failed;
  };
  const Job& lead = *link.jobs[position];
  std::vector<std::shared_ptr<Job>> riders;
  if (!shares(lead)) return riders;
  const uint64_t limit = std::min(kShareSlotBytes, config_.slot_bytes);
  uint64_t payload = lead.chunks[0].payload_bytes;
  uint64_t used = lead.chunks[0].payload_offset + payload;  // table and payload
  // In queue order, stopping at the first that may not ride: jobs still start in post order.
  for (size_t i = position + 1; i < link.jobs.size(); ++i) {
    const Job& next = *link.jobs[i];
    if (!shares(next) || next.region != lead.region) break;
    const Chunk& c = next.chunks[0];
    if (payload + c.payload_bytes > limit ||
        used + c.payload_offset + c.payload_bytes > config_.slot_bytes)
      break;
    payload += c.payload_bytes;
    used += c.payload_offset + c.payload_bytes;
    riders.push_back(link.jobs[i]);
  }
  return riders;
}

void Core::StartSharedChunk(OutLink& link, std::vector<std::shared_ptr<Job>> jobs) {
  const uint32_t send = link.free_send.back();
  link.free_send.pop_back();
  const uint32_t recv = link.free_recv.back();
  link.free_recv.pop_back();
  Slot& slot = *link.send_slots[send];
  uint64_t ranges = 0;
  for (const auto& job : jobs) ranges += job->chunks[0].runs.size();
  // One range table for every job's pieces, then their payloads in the same order.
  char* table = slot.data();
  uint64_t at = TableBytes(ranges);
  Clock::time_point deadline = jobs.front()->deadline;
  std::vector<Run> gather;
  for (const auto& job : jobs) {
    ++job->started;
    deadline = std::min(deadline, job->deadline);
    gather.clear();
    for (const Run& r : job->chunks[0].runs) {
      std::memcpy(table, &r.dst_offset, 8);
      std::memcpy(table + 8, &r.length, 8);
      table += kTableEntryBytes;
      gather.push_back({r.src_offset, at, r.length});
      at += r.length;
    }
    CopyHostRuns(job->local_base, slot.data(), gather);  // Riders: host jobs only
  }
  const uint64_t payload = at - TableBytes(ranges);
  const PeerId peer = link.peer;
  std::shared_ptr<Job> lead = jobs.front();
  const std::vector<Run> whole = {{0, 0, at}};
  ++puts_in_flight_;
  Status posted =
      inner_->post({Op::kPut, &slot.registration(), link.recv_slots[recv].get(), whole, deadline},
                   [this, peer, lead, send](Status s) {
                     Enqueue([=, this] { PutDone(peer, lead, send, false, s); });
                   });
  if (!posted.ok()) {
    --puts_in_flight_;
    return FailLink(link, posted, lead.get());
  }
  const uint64_t seq = link.next_data++;
  DataMsg data{{instance_, peer}, seq, lead->region, recv, ranges, payload};
  if (Status s = inner_->notify(peer, EncodeData(data)); !s.ok())
    return FailLink(link, s, lead.get());
  for (const auto& job : jobs) ++job->issued;
  link.awaiting_ack[seq] = {std::move(jobs), recv};
  FlushNotes(link);
}

void Core::StartChunk(OutLink& link, const std::shared_ptr<Job>& job, size_t position) {
  if (std::vector<std::shared_ptr<Job>> riders = Riders(link, position); !riders.empty()) {
    riders.insert(riders.begin(), job);
    return StartSharedChunk(link, std::move(riders));
  }
  const size_t index = job->started++;
  const Chunk& chunk = job->chunks[index];
  const uint32_t send = link.free_send.back();
  link.free_send.pop_back();
  uint32_t recv = 0;
  Slot& slot = *link.send_slots[send];
  if (job->remote_staged) {
    recv = link.free_recv.back();
    link.free_recv.pop_back();
    // The range table the receiver scatters by, ahead of the payload.
    char* table = slot.data();
    for (const Run& r : chunk.runs) {
      std::memcpy(table, &r.dst_offset, 8);
      std::memcpy(table + 8, &r.length, 8);
      table += kTableEntryBytes;
    }
  }
  ++job->copying;
  ++copies_in_flight_;
  const PeerId peer = link.peer;
  // A host gather is a memcpy on this thread: its chunk goes to the wire at once, so the gather
  // of the next chunk overlaps this one's put and the receiver's scatter. Handed over as a task
  // instead, every chunk the free slots allowed was gathered before the first left, and sender
  // and receiver took turns: 4 gathers, 4 puts, 4 scatters, 4 acks (a chunk's post-to-ack
  // 0.44 ms, 4.2 GB/s on the README demo shape; benchmarks/pd.md, "demoucx").
  if (job->local_at.kind == MemoryKind::kHost) {
    CopyHostRuns(job->local_base, slot.data(), GatherRuns(chunk));
    return IssueChunk(link, job, index, send, recv, Status::Ok());
  }
  Status s = stager().Copy(slot, job->local_base, job->local_at, false, GatherRuns(chunk),
                           [this, peer, job, index, send, recv](Status status) {
                             Enqueue([=, this] {
                               OutLink& link = Out(peer);
                               IssueChunk(link, job, index, send, recv, status);
                               if (link.state != OutLink::State::kFailed) Pump(link);
                             });
                           });
  if (!s.ok()) {
    --job->copying;
    --copies_in_flight_;
    return FailLink(link, s, job.get());
  }
}

void Core::IssueChunk(OutLink& link, const std::shared_ptr<Job>& job, size_t index, uint32_t send,
                      uint32_t recv, const Status& status) {
  --job->copying;
  --copies_in_flight_;
  const PeerId peer = link.peer;
  if (!status.ok()) FailLink(link, status, job.get());
  if (link.state == OutLink::State::kFailed || job->failed) {
    if (link.state != OutLink::State::kFailed) link.free_send.push_back(send);
    MaybeComplete(link, job);
    return;
  }
  const Chunk& chunk = job->chunks[index];
  Slot& slot = *link.send_slots[send];
  std::vector<Run> runs;
  const RemoteMemory* destination = job->inner_remote;
  if (job->remote_staged) {
    runs = {{0, 0, chunk.payload_offset + chunk.payload_bytes}};
    destination = link.recv_slots[recv].get();
  } else {
    runs = SlotToRemoteRuns(chunk);
  }
  const bool finishes = !job->remote_staged;
  ++puts_in_flight_;
  Status posted = inner_->post({Op::kPut, &slot.registration(), destination, runs, job->deadline},
                               [this, peer, job, send, finishes](Status s) {
                                 Enqueue([=, this] { PutDone(peer, job, send, finishes, s); });
                               });
  if (!posted.ok()) {
    --puts_in_flight_;
    return FailLink(link, posted, job.get());
  }
  if (job->remote_staged) {
    const uint64_t seq = link.next_data++;
    DataMsg data{{instance_, peer}, seq, job->region, recv, chunk.runs.size(), chunk.payload_bytes};
    if (Status s = inner_->notify(peer, EncodeData(data)); !s.ok())
      return FailLink(link, s, job.get());
    link.awaiting_ack[seq] = {{job}, recv};
  }
  ++job->issued;
  FlushNotes(link);
}

void Core::PutDone(PeerId peer, std::shared_ptr<Job> job, uint32_t send, bool finishes,
                   Status status) {
  --puts_in_flight_;
  OutLink& link = Out(peer);
  if (link.state == OutLink::State::kFailed) return MaybeComplete(link, job);
  if (!status.ok()) return FailLink(link, status, job.get());
  link.free_send.push_back(send);
  if (finishes) ++job->finished;
  MaybeComplete(link, job);
  Pump(link);
}

void Core::OnWelcome(std::string_view frame) {
  auto welcome = DecodeWelcome(frame);
  if (!welcome.ok()) return;
  auto it = out_.find(welcome->link);
  if (it == out_.end() || it->second.state != OutLink::State::kOpening) return;
  OutLink& link = it->second;
  if (!welcome->status.ok())
    return FailLink(link, welcome->status.WithContext("the peer refused a staged link"), nullptr);
  if (welcome->slot_bytes != config_.slot_bytes || welcome->descriptors.size() != config_.slots)
    return FailLink(link, Status::Incompatible("the peer granted other staging slots than asked"),
                    nullptr);
  for (uint32_t i = 0; i < welcome->descriptors.size(); ++i) {
    auto remote = inner_->import_remote(link.peer, welcome->descriptors[i]);
    if (!remote.ok()) return FailLink(link, remote.status(), nullptr);
    if ((*remote)->length() < config_.slot_bytes)
      return FailLink(link, Status::Incompatible("a staging slot of the peer is too short"),
                      nullptr);
    link.recv_slots.push_back(std::move(*remote));
    link.free_recv.push_back(i);
  }
  link.state = OutLink::State::kReady;
  SendGets(link);
  Pump(link);
}

void Core::OnAck(std::string_view frame) {
  auto ack = DecodeAck(frame);
  if (!ack.ok()) return;
  auto it = out_.find(ack->link);
  if (it == out_.end()) return;
  OutLink& link = it->second;
  auto waiting = link.awaiting_ack.find(ack->seq);
  if (waiting == link.awaiting_ack.end() || waiting->second.slot != ack->slot) return;
  std::vector<std::shared_ptr<Job>> jobs = std::move(waiting->second.jobs);
  link.awaiting_ack.erase(waiting);
  if (!ack->status.ok())
    return FailLink(link, ack->status.WithContext("the peer refused a staged chunk"),
                    jobs.front().get());
  link.free_recv.push_back(ack->slot);
  for (const auto& job : jobs) {
    ++job->finished;
    MaybeComplete(link, job);
  }
  Pump(link);
}

void Core::FailLink(OutLink& link, const Status& why, const Job* culprit) {
  if (link.state == OutLink::State::kFailed) return;
  link.state = OutLink::State::kFailed;
  link.notes.clear();
  link.awaiting_ack.clear();
  const std::string peer = "peer " + std::to_string(link.peer);
  for (const auto& job : std::deque<std::shared_ptr<Job>>(link.jobs)) {
    if (!job->failed) {
      job->failed = true;
      job->status = job.get() == culprit || culprit == nullptr
                        ? why.WithContext(peer)
                        : Status::Unavailable(peer + ": its staged link failed: " + why.message());
    }
    MaybeComplete(link, job);
  }
  for (const auto& [seq, get] : std::map(link.gets)) FailGet(link, get, why.WithContext(peer));
}

void Core::MaybeComplete(OutLink& link, const std::shared_ptr<Job>& job) {
  if (!job->done || job->copying > 0) return;
  if (!job->failed && job->finished < job->chunks.size()) return;
  Completion done = std::move(job->done);
  job->done = nullptr;
  std::erase(link.jobs, job);
  done(job->failed ? job->status : Status::Ok());
  if (link.state != OutLink::State::kFailed) FlushNotes(link);
}

void Core::CheckDeadlines() {
  const auto now = Clock::now();
  for (auto& [peer, link] : out_) {
    for (const auto& job : std::deque<std::shared_ptr<Job>>(link.jobs)) {
      if (job->failed || now <= job->deadline) continue;
      FailLink(link, Status::Timeout("a staged batch missed its deadline"), job.get());
      break;
    }
    for (const auto& [seq, get] : std::map(link.gets)) {
      if (!get->failed && now > get->deadline)
        FailGet(link, get, Status::Timeout("a staged get missed its deadline"));
    }
  }
}

bool Core::Busy() const {
  return puts_in_flight_ > 0 || copies_in_flight_ > 0;
}

bool Core::Active() const {
  for (const auto& [peer, link] : out_) {
    if (!link.jobs.empty() || !link.gets.empty()) return true;
  }
  return false;
}

}  // namespace kv::transport::staged
