// Gets of a peer's staged region, both ends. The requester makes an alias: a region id naming
// its destination for this get alone, and asks the holder (kGetRequest, in parts) to put the
// runs into it. The holder checks them against its region and runs an ordinary staged put over
// its connection back (its own link, slots and acks), then answers each part with kGetDone. The
// requester's get completes when every part is done; it fails by its deadline or a refusal, and
// then forgets the alias first, so a late chunk of the holder's is refused (kNotFound) instead
// of landing after the caller was told the get ended. Worker thread only, except PostGet.
#include <algorithm>

#include "transport/settings.h"
#include "transport/staged/core.h"

namespace kv::transport::staged {

Status Core::PostGet(const Batch& batch, const StagedRemote& remote, Completion done) {
  auto get = std::make_shared<GetJob>();
  {
    std::lock_guard lock(mu_);
    if (connected_.count(remote.peer()) == 0)
      return Status::NotFound("peer " + std::to_string(remote.peer()) + " is not connected");
    get->alias = next_region_++;
    regions_[get->alias] = {.base = static_cast<char*>(batch.local->base()),
                            .length = batch.local->length(),
                            .location = batch.local->location(),
                            .alias = true};
  }
  get->holder_region = remote.region();
  for (size_t at = 0; at < batch.runs.size(); at += kMaxGetRuns) {
    auto part = batch.runs.subspan(at, std::min(kMaxGetRuns, batch.runs.size() - at));
    get->parts.emplace_back(part.begin(), part.end());
  }
  get->deadline = batch.deadline;
  get->done = std::move(done);
  Enqueue([this, peer = remote.peer(), get = std::move(get)]() mutable {
    AddGet(peer, std::move(get));
  });
  return Status::Ok();
}

void Core::AddGet(PeerId peer, std::shared_ptr<GetJob> get) {
  OutLink& link = Out(peer);
  get->seq = link.next_get++;
  link.gets[get->seq] = get;
  alias_gets_[get->alias] = {peer, get};
  if (link.state == OutLink::State::kFailed)
    return FailGet(link, get,
                   Status::Unavailable("peer " + std::to_string(peer) +
                                       ": its staged link failed; connect again"));
  if (get->parts.empty()) return FinishGet(link, get);
  // The holder needs our link open (its connection back to us) before it can answer.
  if (Status s = Open(link); !s.ok()) return FailLink(link, s, nullptr);
  SendGets(link);
}

void Core::SendGets(OutLink& link) {
  if (link.state != OutLink::State::kReady) return;
  for (const auto& [seq, get] : std::map(link.gets)) {
    if (get->sent || get->failed) continue;
    get->sent = true;
    const auto left = get->deadline - Clock::now();
    const int64_t ms = std::clamp<int64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(left).count(), 1, kMaxTimeoutMs);
    for (uint32_t part = 0; part < get->parts.size(); ++part) {
      GetRequestMsg request{{instance_, link.peer},     seq,        part,
                            get->holder_region,         get->alias, static_cast<uint64_t>(ms),
                            std::move(get->parts[part])};
      if (Status s = inner_->notify(link.peer, EncodeGetRequest(request)); !s.ok())
        return FailLink(link, s, nullptr);
    }
  }
}

void Core::OnGetDone(std::string_view frame) {
  auto done = DecodeGetDone(frame);
  if (!done.ok()) return;
  auto link = out_.find(done->link);
  if (link == out_.end()) return;
  auto it = link->second.gets.find(done->seq);
  if (it == link->second.gets.end()) return;
  std::shared_ptr<GetJob> get = it->second;
  if (!done->status.ok())
    return FailGet(link->second, get, done->status.WithContext("the peer refused a staged get"));
  ++get->parts_done;
  FinishGet(link->second, get);
}

void Core::FailGet(OutLink& link, const std::shared_ptr<GetJob>& get, const Status& why) {
  if (get->failed) return;
  get->failed = true;
  get->status = why;
  ForgetRegion(get->alias);  // nothing the holder still sends can land from now on
  FinishGet(link, get);
}

void Core::FinishGet(OutLink& link, const std::shared_ptr<GetJob>& get) {
  if (!get->done || get->scatters > 0) return;
  if (!get->failed && get->parts_done < get->parts.size()) return;
  ForgetRegion(get->alias);
  alias_gets_.erase(get->alias);
  link.gets.erase(get->seq);
  std::exchange(get->done, nullptr)(get->failed ? get->status : Status::Ok());
}

void Core::ScatterStarted(uint64_t region, int delta) {
  auto it = alias_gets_.find(region);
  if (it == alias_gets_.end()) return;
  auto [peer, get] = it->second;
  get->scatters += delta;
  if (delta < 0) FinishGet(Out(peer), get);
}

void Core::OnGetRequest(std::string_view frame) {
  auto request = DecodeGetRequest(frame);
  InLink* found = request.ok() ? FindLink(request->key) : nullptr;
  if (found == nullptr) return;
  InLink& link = *found;
  GetDoneMsg reply{request->key.link, request->seq, request->part, Status::Ok()};
  Region region;
  {
    std::lock_guard lock(mu_);
    auto r = regions_.find(request->region);
    if (r == regions_.end()) {
      reply.status = Status::NotFound("staged get names region " + std::to_string(request->region) +
                                      ", not registered");
    } else {
      region = r->second.Shape();
    }
  }
  for (const Run& run : request->runs) {
    if (!reply.status.ok()) break;
    if (run.length > region.length || run.src_offset > region.length - run.length)
      reply.status = Status::OutOfRange(
          "staged get run [" + std::to_string(run.src_offset) + ", +" + std::to_string(run.length) +
          ") leaves the region of " + std::to_string(region.length) + " bytes");
  }
  if (!reply.status.ok()) {
    (void)inner_->notify(link.back, EncodeGetDone(reply));
    if (reply.status.code() == Code::kOutOfRange) Drop(link);
    return;
  }
  // An ordinary staged put over our connection back, into the requester's alias.
  auto job = std::make_shared<Job>();
  job->local_base = region.base;
  job->local_at = region.location;
  job->remote_staged = true;
  job->region = request->alias;
  job->chunks = PlanChunks(request->runs, config_.slot_bytes, true);
  job->deadline = Clock::now() + std::chrono::milliseconds(request->timeout_ms);
  const PeerId back = link.back;
  job->done = [this, back, reply](Status s) mutable {
    reply.status = s;
    (void)inner_->notify(back, EncodeGetDone(reply));
  };
  AddJob(back, std::move(job));
}

}  // namespace kv::transport::staged
