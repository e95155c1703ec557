// The active-message put path of the ucx backend, used where UCX would emulate a put because the
// endpoint has no RMA lane (tcp in UCX 1.13). UCX's emulation has the target answer every put
// from inside its own handler; when that answer finds the sender dead, UCX 1.13 calls ucs_fatal
// and the target process (a decode kvd) aborts (benchmarks/pd.md, issue 5). Here the sender
// carries the bytes in eager active messages (no rendezvous: nothing for the receiver to answer
// inside UCX), the receiver copies them into host memory it registered, and acknowledges the
// batch with a message of its own sent after progress returns; a failed ack aborts nothing, it
// leaves the sender's batch to its deadline. The copy is a memcpy: a put into device memory
// over this path is refused, though the registration exists (a known gap).
//
// Wire: per run, messages of at most kPutChunk (header {seq, receiver address}); then an end
// message {seq, total bytes}; the receiver acks {seq, 0 or 1 = refused} once it has the total.
// A batch completes when its flush and its ack both did, or fails with its peer (endpoint error,
// deadline: FailPeer), never twice. A notification leaves only after every batch started before
// it finished (puts acked, gets flushed), so it still arrives after the data it announces.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "transport/intervals.h"
#include "transport/ucx/ucx_engine.h"

namespace kv::transport::ucx {

uint64_t LocalRegions::Add(void* base, uint64_t length) {
  std::lock_guard lock(mu_);
  const uint64_t token = next_++;
  ranges_[token] = {reinterpret_cast<uintptr_t>(base), length, false};
  return token;
}

void LocalRegions::Remove(uint64_t token) {
  std::lock_guard lock(mu_);
  ranges_.erase(token);
  std::erase_if(grants_, [token](const auto& entry) { return entry.first.first == token; });
}

Status LocalRegions::Guard(uint64_t token) {
  std::lock_guard lock(mu_);
  auto it = ranges_.find(token);
  if (it == ranges_.end()) return Status::NotFound("ucx: no such host registration");
  it->second.guarded = true;
  return Status::Ok();
}

Status LocalRegions::Grant(uint64_t grant, PeerId peer, uint64_t token,
                           std::span<const Transport::WriteRange> ranges) {
  if (grant == 0 || peer == 0) return Status::InvalidArgument("ucx: grant and peer must be set");
  uint64_t base = 0, size = 0;
  {
    std::lock_guard lock(mu_);
    auto region = ranges_.find(token);
    if (region == ranges_.end()) return Status::NotFound("ucx: no such host registration");
    base = region->second.base;
    size = region->second.length;
  }
  // Checked, sorted and merged without the lock: the progress thread copies under it.
  std::vector<std::pair<uint64_t, uint64_t>> intervals;
  intervals.reserve(ranges.size());
  for (const Transport::WriteRange& r : ranges) {
    if (r.length == 0) continue;
    if (r.offset > size || r.length > size - r.offset) {
      return Status::OutOfRange("ucx: a write grant of " + std::to_string(r.length) + " bytes at " +
                                std::to_string(r.offset) + " runs past the registration's " +
                                std::to_string(size));
    }
    intervals.emplace_back(base + r.offset, base + r.offset + r.length);
  }
  SortAndMerge(intervals);
  std::lock_guard lock(mu_);
  if (ranges_.count(token) == 0) return Status::NotFound("ucx: no such host registration");
  std::vector<Granted>& granted = grants_[{token, peer}];
  auto g = std::find_if(granted.begin(), granted.end(),
                        [grant](const Granted& x) { return x.grant == grant; });
  if (g == granted.end()) {
    granted.push_back(Granted{grant, std::move(intervals)});
    by_grant_[grant].emplace_back(token, peer);
    return Status::Ok();
  }
  // More ranges for a grant this region has already: rare (a request names a region once).
  g->intervals.insert(g->intervals.end(), intervals.begin(), intervals.end());
  SortAndMerge(g->intervals);
  return Status::Ok();
}

void LocalRegions::Revoke(uint64_t grant) {
  std::lock_guard lock(mu_);
  auto it = by_grant_.find(grant);
  if (it == by_grant_.end()) return;
  for (const auto& key : it->second) {
    auto g = grants_.find(key);
    if (g == grants_.end()) continue;  // its region went
    std::erase_if(g->second, [grant](const Granted& x) { return x.grant == grant; });
    if (g->second.empty()) grants_.erase(g);
  }
  by_grant_.erase(it);
}

bool LocalRegions::CopyIn(uint64_t address, const void* data, uint64_t length, PeerId sender) {
  std::lock_guard lock(mu_);
  for (const auto& [token, range] : ranges_) {
    const uint64_t base = range.base, size = range.length;
    if (address >= base && length <= size && address - base <= size - length) {
      if (range.guarded) {
        auto g = grants_.find({token, sender});
        if (g == grants_.end()) return false;
        bool granted = false;
        for (const Granted& x : g->second) {
          if (Contains(x.intervals, address, length)) {
            granted = true;
            break;
          }
        }
        if (!granted) return false;
      }
      std::memcpy(reinterpret_cast<void*>(address), data, length);
      return true;
    }
  }
  return false;
}

bool Engine::UseAmPuts(ucp_ep_h ep) const {
  if (put_path_ != PutPath::kAuto) return put_path_ == PutPath::kMessages;
  // UCX 1.13 has no query for an endpoint's lanes; its printed configuration lists a "put[n]"
  // protocol per RMA lane and none when puts would be emulated.
  char* text = nullptr;
  size_t size = 0;
  FILE* out = ::open_memstream(&text, &size);
  if (out == nullptr) return false;
  ucp_ep_print_info(ep, out);
  std::fclose(out);
  const bool rma = std::string_view(text, size).find("put[") != std::string_view::npos;
  std::free(text);
  return !rma;
}

Status Engine::SetAmHandlers(WorkerSlot* slot) {
  const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
      {kPutDataAmId, &Engine::OnPutData},
      {kPutEndAmId, &Engine::OnPutEnd},
      {kPutAckAmId, &Engine::OnPutAck}};
  for (const auto& [id, cb] : handlers) {
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                    UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = id;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    am.cb = cb;
    am.arg = slot;
    if (ucs_status_t s = ucp_worker_set_am_recv_handler(slot->worker.get(), &am); s != UCS_OK)
      return FromUcs(s, "ucp_worker_set_am_recv_handler");
  }
  return Status::Ok();
}

void Engine::StartAm(Peer* peer, BatchState* batch) {
  batch->am = true;
  am_batches_[batch->seq] = batch;
  size_t messages = 1;
  for (const Run& run : batch->runs) messages += (run.length + kPutChunk - 1) / kPutChunk;
  // UCX may read a header after the call returns (a send left pending); the batch outlives its
  // sends, and reserving up front keeps the headers where they are.
  batch->headers.reserve(messages);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  uint64_t sent = 0;
  for (const Run& run : batch->runs) {
    for (uint64_t at = 0; at < run.length && batch->failure.ok(); at += kPutChunk) {
      const uint64_t n = std::min(kPutChunk, run.length - at);
      const PutHeader& header = batch->headers.emplace_back(
          PutHeader{batch->seq, batch->remote_address + run.dst_offset + at});
      ucs_status_ptr_t request = ucp_am_send_nbx(peer->ep, kPutDataAmId, &header, sizeof header,
                                                 batch->local + run.src_offset + at, n, &param);
      if (UCS_PTR_IS_ERR(request)) {
        batch->failure = FromUcs(UCS_PTR_STATUS(request), "ucp_am_send_nbx");
      } else if (request != nullptr) {
        ucp_request_free(request);
      }
      sent += n;
    }
  }
  if (batch->failure.ok()) {
    const PutHeader& end = batch->headers.emplace_back(PutHeader{batch->seq, sent});
    ucs_status_ptr_t request =
        ucp_am_send_nbx(peer->ep, kPutEndAmId, &end, sizeof end, nullptr, 0, &param);
    if (UCS_PTR_IS_ERR(request)) {
      batch->failure = FromUcs(UCS_PTR_STATUS(request), "ucp_am_send_nbx");
    } else if (request != nullptr) {
      ucp_request_free(request);
    }
  }
  // The flush bounds the sends (a force-closed endpoint fails it, or FinishOrphans does), the
  // ack says they landed.
  FlushBatch(peer->ep, batch);
}

void Engine::BatchFlushed(BatchState* batch, ucs_status_t status) {
  if (batch->am && status == UCS_OK && batch->failure.ok() && !batch->acked) {
    batch->flushed = true;  // the ack finishes it, or FailPeer
    return;
  }
  Finish(batch, status);
}

bool Engine::AmNoteReady(Peer* peer, uint64_t note) {
  if (peer->am_unacked.empty()) return true;
  peer->am_notes.emplace_back(note, next_put_seq_ - 1);
  return false;
}

void Engine::AmBatchDone(BatchState* batch) {
  am_batches_.erase(batch->seq);
  auto it = peers_.find(batch->peer);
  if (it == peers_.end()) return;
  Peer* peer = it->second.get();
  peer->am_unacked.erase(batch->seq);
  while (!peer->am_notes.empty()) {
    const auto [note, barrier] = peer->am_notes.front();
    if (!peer->am_unacked.empty() && *peer->am_unacked.begin() <= barrier) break;
    peer->am_notes.pop_front();
    MarkNoteReady(peer->id, note);
  }
}

namespace {

bool ReadHeader(const void* header, size_t length, PutHeader* out) {
  if (length != sizeof(PutHeader)) return false;  // not from this backend
  std::memcpy(out, header, sizeof *out);
  return true;
}

ucp_ep_h ReplyEp(const ucp_am_recv_param_t* param) {
  return (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
}

}  // namespace

ucs_status_t Engine::OnPutData(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param) {
  auto* slot = static_cast<WorkerSlot*>(arg);
  PutHeader h;
  if (!ReadHeader(header, header_length, &h)) return UCS_OK;
  ucp_ep_h reply = ReplyEp(param);
  Incoming& in = slot->incoming[{reinterpret_cast<uintptr_t>(reply), h.seq}];
  // Never trust the header: only memory this process registered is written. A rendezvous
  // message (not sent by this backend) is dropped unreceived and refuses its batch.
  // Into a guarded registration, only inside a live grant of this sender (transport.h).
  const bool eager = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) == 0;
  if (!eager || in.refused ||
      !slot->engine->regions_.CopyIn(h.value, data, length, slot->engine->SenderOf(slot, reply))) {
    in.refused = true;
  }
  in.bytes += length;
  slot->engine->MaybeAck(slot, h.seq, reply);
  return UCS_OK;
}

ucs_status_t Engine::OnPutEnd(void* arg, const void* header, size_t header_length, void*, size_t,
                              const ucp_am_recv_param_t* param) {
  auto* slot = static_cast<WorkerSlot*>(arg);
  PutHeader h;
  if (!ReadHeader(header, header_length, &h)) return UCS_OK;
  ucp_ep_h reply = ReplyEp(param);
  slot->incoming[{reinterpret_cast<uintptr_t>(reply), h.seq}].expected = h.value;
  slot->engine->MaybeAck(slot, h.seq, reply);
  return UCS_OK;
}

PeerId Engine::SenderOf(const WorkerSlot* slot, ucp_ep_h reply_ep) const {
  if (slot->owner != nullptr) return slot->owner->id;
  if (reply_ep == nullptr) return 0;
  for (const auto& [id, peer] : peers_) {
    if (peer->ep == reply_ep) return id;
  }
  return 0;
}

void Engine::MaybeAck(WorkerSlot* slot, uint64_t seq, ucp_ep_h reply_ep) {
  auto it = slot->incoming.find({reinterpret_cast<uintptr_t>(reply_ep), seq});
  if (it == slot->incoming.end() || it->second.bytes != it->second.expected) return;
  // A refused write is never answered (security issue 19): a "refused" ack told a prober which
  // addresses are registered (2,756 zero-length probes located a 256 MiB region). Its sender's
  // endpoint is closed instead, after progress returns (SendAcks); its batch fails there.
  acks_.push_back(Ack{slot->weak_from_this(), slot->owner != nullptr, reply_ep, PutHeader{seq, 0},
                      it->second.refused});
  slot->incoming.erase(it);
}

void Engine::SendAcks() {
  // A send below may run a handler (self transport) that queues another ack: it lands in acks_.
  sending_acks_.swap(acks_);
  for (const Ack& ack : sending_acks_) {
    std::shared_ptr<WorkerSlot> slot = ack.slot.lock();
    if (!slot) continue;
    ucp_ep_h ep =
        ack.via_owner ? (slot->owner != nullptr ? slot->owner->ep : nullptr) : ack.reply_ep;
    if (ep == nullptr) continue;  // the sender failed meanwhile: nobody waits for this ack
    if (ack.refused) {
      // Our peer on that endpoint, if we have one (its own worker, or an endpoint of ours that
      // UCX answers on); an unknown sender on the shared worker just never hears back.
      PeerId offender = 0;
      if (ack.via_owner) {
        offender = slot->owner->id;
      } else {
        for (const auto& [id, peer] : peers_) {
          if (peer->ep == ack.reply_ep) offender = id;
        }
      }
      if (offender != 0) {
        FailPeer(offender, Status::InvalidArgument(
                               "peer " + std::to_string(offender) +
                               " wrote outside the memory registered and granted to it here; "
                               "endpoint closed"));
      }
      continue;
    }
    auto* header = new PutHeader(ack.header);
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    param.cb.send = [](void* request, ucs_status_t, void* user_data) {
      delete static_cast<PutHeader*>(user_data);
      ucp_request_free(request);
    };
    param.user_data = header;
    ucs_status_ptr_t request =
        ucp_am_send_nbx(ep, kPutAckAmId, header, sizeof *header, nullptr, 0, &param);
    if (!UCS_PTR_IS_PTR(request)) delete header;
  }
  sending_acks_.clear();  // keeps the capacity: no allocation per turn
}

ucs_status_t Engine::OnPutAck(void* arg, const void* header, size_t header_length, void*, size_t,
                              const ucp_am_recv_param_t*) {
  auto* slot = static_cast<WorkerSlot*>(arg);
  Engine* engine = slot->engine;
  PutHeader h;
  if (!ReadHeader(header, header_length, &h)) return UCS_OK;
  auto it = engine->am_batches_.find(h.seq);
  if (it == engine->am_batches_.end()) return UCS_OK;  // finished already (failed)
  BatchState* batch = it->second;
  auto peer = engine->peers_.find(batch->peer);
  // Only the worker the batch went out on may finish it.
  if (peer == engine->peers_.end() || peer->second->slot.get() != slot || batch->acked)
    return UCS_OK;
  batch->acked = true;
  if (h.value != 0 && batch->failure.ok()) {
    batch->failure = Status::InvalidArgument(
        "peer " + std::to_string(batch->peer) +
        " refused a put: a run named memory outside the host memory it registered");
  }
  if (batch->flushed) engine->Finish(batch, UCS_OK);
  return UCS_OK;
}

}  // namespace kv::transport::ucx
