// The receiving half of the staged transport: a sender's link opened (connect back, slots
// granted), its chunks checked against the registration and scattered, acks, and the user's
// notifications released in order behind the scatters. Worker thread only (core.h), but for
// ScatterHere and what it calls, on the inner's thread.
#include <cstring>

#include "transport/intervals.h"
#include "transport/staged/core.h"

namespace kv::transport::staged {

void Core::OnHello(std::string_view frame) {
  auto hello = DecodeHello(frame);
  if (!hello.ok()) return;
  size_t links = 0;
  {
    std::lock_guard lock(links_mu_);
    if (in_.count(hello->key) != 0) return;
    links = in_.size();
  }
  // Acks go back over a connection of our own: the inner transport names no sender.
  auto back = inner_->connect(hello->reply_address);
  if (!back.ok()) return;  // the sender's batches fail by their deadline
  WelcomeMsg welcome;
  welcome.link = hello->key.link;
  welcome.slot_bytes = hello->slot_bytes;
  std::vector<std::unique_ptr<Slot>> slots;
  if (hello->slots < 2 || hello->slots > kMaxSlots || hello->slot_bytes < kMinSlotBytes ||
      hello->slot_bytes > kMaxSlotBytes) {
    welcome.status = Status::ResourceExhausted(
        "staging slots asked: " + std::to_string(hello->slots) + " of " +
        std::to_string(hello->slot_bytes) + " bytes; the limits are 2.." +
        std::to_string(kMaxSlots) + " of " + std::to_string(kMinSlotBytes) + ".." +
        std::to_string(kMaxSlotBytes));
  } else if (links >= kMaxInboundLinks) {
    welcome.status = Status::ResourceExhausted(
        "this transport serves " + std::to_string(kMaxInboundLinks) + " staged links already");
  }
  for (uint32_t i = 0; welcome.status.ok() && i < hello->slots; ++i) {
    auto slot = stager().AllocateSlot(*inner_, hello->slot_bytes, true);
    if (!slot.ok()) {
      welcome.status = slot.status();
      break;
    }
    welcome.descriptors.push_back((*slot)->registration().packed_descriptor());
    slots.push_back(std::move(*slot));
  }
  if (!welcome.status.ok()) {
    welcome.descriptors.clear();
    (void)inner_->notify(*back, EncodeWelcome(welcome));
    inner_->disconnect(*back);
    return;
  }
  if (!inner_->notify(*back, EncodeWelcome(welcome)).ok()) return;
  // A chunk that arrives before this is handed to the worker (ScatterHere finds no link), which
  // takes it after this task.
  std::lock_guard lock(links_mu_);
  InLink& link = in_[hello->key];
  link.back = *back;
  link.slot_bytes = hello->slot_bytes;
  link.slots = std::move(slots);
}

InLink* Core::FindLink(const LinkKey& key) {
  std::lock_guard lock(links_mu_);
  auto it = in_.find(key);
  return it == in_.end() || it->second.dropped ? nullptr : &it->second;
}

void Core::OnData(std::string_view frame, std::shared_ptr<InEntry> entry) {
  auto data = DecodeData(frame);
  InLink* link = data.ok() ? FindLink(data->key) : nullptr;
  // Nobody to answer: a malformed frame, an unknown or a dropped link.
  if (link == nullptr) return DeliverInbound(entry.get());
  Status s = Scatter(*data, *link, entry);
  if (s.ok()) return;
  (void)inner_->notify(link->back, EncodeAck({data->key.link, data->seq, data->slot, s}));
  if (s.code() == Code::kOutOfRange) Drop(*link);
  DeliverInbound(entry.get());
}

bool Core::ScatterHere(std::string_view frame, InEntry* entry) {
  auto data = DecodeData(frame);
  if (!data.ok()) return false;
  {
    std::lock_guard lock(mu_);
    auto r = regions_.find(data->region);
    if (r == regions_.end() || r->second.location.kind != MemoryKind::kHost || r->second.alias)
      return false;
  }
  InLink* link = FindLink(data->key);
  if (link == nullptr) return false;
  Region region;
  auto runs = CheckChunk(*data, *link, region);
  // A region deregistered and another registered since the first look: the worker's copier.
  if (runs.ok() && region.location.kind != MemoryKind::kHost) return false;
  if (runs.ok()) CopyHostRuns(link->slots[data->slot]->data(), region.base, *runs);
  const Status s = runs.status();
  (void)inner_->notify(link->back, EncodeAck({data->key.link, data->seq, data->slot, s}));
  if (s.code() == Code::kOutOfRange) Drop(*link);
  DeliverInbound(entry);
  return true;
}

Result<std::vector<Run>> Core::CheckChunk(const DataMsg& m, const InLink& link, Region& region) {
  const std::string chunk = "staged chunk " + std::to_string(m.seq);
  if (m.slot >= link.slots.size())
    return Status::OutOfRange(chunk + " names slot " + std::to_string(m.slot) + " of " +
                              std::to_string(link.slots.size()));
  if (m.ranges > link.slot_bytes / kTableEntryBytes ||
      m.payload_bytes > link.slot_bytes - TableBytes(m.ranges))
    return Status::OutOfRange(chunk + " does not fit its slot");
  {
    std::lock_guard lock(mu_);
    auto r = regions_.find(m.region);
    if (r == regions_.end())
      return Status::NotFound(chunk + " names region " + std::to_string(m.region) +
                              ", which is not registered (any more)");
    region = r->second.Shape();
  }
  const char* slot = link.slots[m.slot]->data();
  std::vector<Run> runs;
  runs.reserve(m.ranges);
  uint64_t at = TableBytes(m.ranges);
  for (uint64_t i = 0; i < m.ranges; ++i) {
    uint64_t offset = 0, length = 0;
    std::memcpy(&offset, slot + i * kTableEntryBytes, 8);
    std::memcpy(&length, slot + i * kTableEntryBytes + 8, 8);
    if (length == 0 || length > region.length || offset > region.length - length ||
        length > TableBytes(m.ranges) + m.payload_bytes - at)
      return Status::OutOfRange(chunk + " range " + std::to_string(i) + " [" +
                                std::to_string(offset) + ", +" + std::to_string(length) +
                                ") leaves the region of " + std::to_string(region.length) +
                                " bytes or the slot");
    runs.push_back({at, offset, length});
    at += length;
  }
  if (at != TableBytes(m.ranges) + m.payload_bytes)
    return Status::OutOfRange(chunk + ": its ranges do not add up to its payload");
  if (region.guarded) {
    // Write grants (core.h, Region): every range inside one interval of a live grant.
    std::lock_guard lock(mu_);
    auto r = regions_.find(m.region);
    if (r == regions_.end()) return Status::NotFound(chunk + ": its region went");
    for (const Run& run : runs) {
      bool granted = false;
      for (const auto& [grant, intervals] : r->second.grants) {
        if (Contains(intervals, run.dst_offset, run.length)) {
          granted = true;
          break;
        }
      }
      if (!granted) {
        return Status::OutOfRange(chunk + " writes where no live grant of the region allows it");
      }
    }
  }
  return runs;
}

Status Core::Scatter(const DataMsg& m, InLink& link, std::shared_ptr<InEntry> entry) {
  Region region;
  KV_ASSIGN_OR_RETURN(std::vector<Run> runs, CheckChunk(m, link, region));
  ++copies_in_flight_;
  ScatterStarted(m.region, +1);
  AckMsg ack{m.key.link, m.seq, m.slot, Status::Ok()};
  const PeerId back = link.back;
  const uint64_t region_id = m.region;
  auto finished = [this, ack, back, entry, region_id](Status status) mutable {
    --copies_in_flight_;
    ScatterStarted(region_id, -1);
    ack.status = status;
    (void)inner_->notify(back, EncodeAck(ack));
    DeliverInbound(entry.get());
  };
  // A host scatter (into a get's alias, or of a chunk that came before its link was known: what
  // ScatterHere leaves to the worker) is a memcpy done here: its ack leaves at once, not after
  // the scatters of every other chunk this worker pass holds (sender.cc, StartChunk).
  if (region.location.kind == MemoryKind::kHost) {
    CopyHostRuns(link.slots[m.slot]->data(), region.base, runs);
    finished(Status::Ok());
    return Status::Ok();
  }
  Status copying = stager().Copy(*link.slots[m.slot], region.base, region.location, true, runs,
                                 [this, finished](Status status) mutable {
                                   Enqueue([finished, status]() mutable { finished(status); });
                                 });
  if (!copying.ok()) {
    --copies_in_flight_;
    ScatterStarted(region_id, -1);
  }
  return copying;
}

void Core::Drop(InLink& link) {
  // The connection back stays: closing it now could lose the refusal still being sent. A hostile
  // peer may still be writing: the slots stay until the transport goes (InLink).
  std::lock_guard lock(links_mu_);
  link.dropped = true;
}

void Core::DeliverInbound(InEntry* finished) {
  std::unique_lock lock(in_mu_);
  if (finished != nullptr) finished->done = true;
  // Another thread delivering re-reads the queue after each note: it delivers ours too.
  if (delivering_) return;
  delivering_ = true;
  for (;;) {
    while (!inbound_.empty() && inbound_.front()->data && inbound_.front()->done)
      inbound_.pop_front();
    if (inbound_.empty() || inbound_.front()->data) break;
    std::string note = inbound_.front()->note;
    lock.unlock();
    // Delivered while still queued, so the inner's thread cannot deliver a later note first.
    Deliver(note);
    lock.lock();
    inbound_.pop_front();
  }
  delivering_ = false;
}

}  // namespace kv::transport::staged
