// The receiving half of the staged transport: a sender's link opened (connect back, slots
// granted), its chunks checked against the registration and scattered, acks, and the user's
// notifications released in order behind the scatters. Worker thread only (core.h).
#include <cstring>

#include "transport/intervals.h"
#include "transport/staged/core.h"

namespace kv::transport::staged {

void Core::OnHello(std::string_view frame) {
  auto hello = DecodeHello(frame);
  if (!hello.ok() || in_.count(hello->key) != 0) return;
  // Acks go back over a connection of our own: the inner transport names no sender.
  auto back = inner_->connect(hello->reply_address);
  if (!back.ok()) return;  // the sender's batches fail by their deadline
  WelcomeMsg welcome;
  welcome.link = hello->key.link;
  welcome.slot_bytes = hello->slot_bytes;
  InLink link;
  link.back = *back;
  link.slot_bytes = hello->slot_bytes;
  if (hello->slots < 2 || hello->slots > kMaxSlots || hello->slot_bytes < kMinSlotBytes ||
      hello->slot_bytes > kMaxSlotBytes) {
    welcome.status = Status::ResourceExhausted(
        "staging slots asked: " + std::to_string(hello->slots) + " of " +
        std::to_string(hello->slot_bytes) + " bytes; the limits are 2.." +
        std::to_string(kMaxSlots) + " of " + std::to_string(kMinSlotBytes) + ".." +
        std::to_string(kMaxSlotBytes));
  } else if (in_.size() >= kMaxInboundLinks) {
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
    link.slots.push_back(std::move(*slot));
  }
  if (!welcome.status.ok()) {
    welcome.descriptors.clear();
    (void)inner_->notify(link.back, EncodeWelcome(welcome));
    inner_->disconnect(link.back);
    return;
  }
  if (!inner_->notify(link.back, EncodeWelcome(welcome)).ok()) return;
  in_.emplace(hello->key, std::move(link));
}

void Core::OnData(std::string_view frame, std::shared_ptr<InEntry> entry) {
  auto data = DecodeData(frame);
  auto it = data.ok() ? in_.find(data->key) : in_.end();
  if (it == in_.end() || it->second.dropped) {
    // Nobody to answer: a malformed frame, an unknown or a dropped link.
    entry->done = true;
    return DeliverInbound();
  }
  InLink& link = it->second;
  Status s = Scatter(*data, link, entry);
  if (s.ok()) return;
  (void)inner_->notify(link.back, EncodeAck({data->key.link, data->seq, data->slot, s}));
  if (s.code() == Code::kOutOfRange) Drop(link);
  entry->done = true;
  DeliverInbound();
}

Status Core::Scatter(const DataMsg& m, InLink& link, std::shared_ptr<InEntry> entry) {
  const std::string chunk = "staged chunk " + std::to_string(m.seq);
  if (m.slot >= link.slots.size())
    return Status::OutOfRange(chunk + " names slot " + std::to_string(m.slot) + " of " +
                              std::to_string(link.slots.size()));
  if (m.ranges > link.slot_bytes / kTableEntryBytes ||
      m.payload_bytes > link.slot_bytes - TableBytes(m.ranges))
    return Status::OutOfRange(chunk + " does not fit its slot");
  Region region;
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
    entry->done = true;
    DeliverInbound();
  };
  // A host scatter is done before Copy returns (stager.h): its ack leaves at once, not after
  // the scatters of every other chunk this worker pass holds (sender.cc, StartChunk).
  const bool host = region.location.kind == MemoryKind::kHost;
  Status copying = stager().Copy(*link.slots[m.slot], region.base, region.location, true, runs,
                                 [this, finished, host](Status status) mutable {
                                   if (host) return finished(status);
                                   Enqueue([finished, status]() mutable { finished(status); });
                                 });
  if (!copying.ok()) {
    --copies_in_flight_;
    ScatterStarted(region_id, -1);
  }
  return copying;
}

void Core::Drop(InLink& link) {
  // The connection back stays: closing it now could lose the refusal still being sent.
  link.dropped = true;
  // A hostile peer may still be writing: the memory stays until the transport goes.
  for (auto& slot : link.slots) retired_.push_back(std::move(slot));
  link.slots.clear();
}

void Core::DeliverInbound() {
  for (;;) {
    std::string note;
    {
      std::lock_guard lock(in_mu_);
      while (!inbound_.empty() && inbound_.front()->data && inbound_.front()->done)
        inbound_.pop_front();
      if (inbound_.empty() || inbound_.front()->data) return;
      note = inbound_.front()->note;
    }
    // Delivered while still queued, so the inner's thread cannot deliver a later note first.
    Deliver(note);
    std::lock_guard lock(in_mu_);
    inbound_.pop_front();
  }
}

}  // namespace kv::transport::staged
