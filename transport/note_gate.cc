#include "transport/note_gate.h"

namespace kv::transport {

uint64_t NoteGate::BatchPosted(PeerId peer) {
  const uint64_t seq = next_++;
  peers_[peer].unfinished.insert(seq);
  return seq;
}

NoteGate::Ticket NoteGate::NotePosted(PeerId peer) const {
  auto it = peers_.find(peer);
  if (it == peers_.end() || it->second.unfinished.empty()) return Ticket{next_, next_ - 1};
  return Ticket{*it->second.unfinished.begin(), next_ - 1};
}

void NoteGate::BatchDone(PeerId peer, uint64_t seq, bool landed) {
  auto it = peers_.find(peer);
  if (it == peers_.end() || it->second.unfinished.erase(seq) == 0) return;
  if (landed) return;
  it->second.failed.insert(seq);
  if (it->second.failed.size() > kMaxFailures) it->second.failed.erase(it->second.failed.begin());
}

bool NoteGate::Finished(PeerId peer, const Ticket& ticket) const {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return true;
  auto unfinished = it->second.unfinished.lower_bound(ticket.first);
  return unfinished == it->second.unfinished.end() || *unfinished > ticket.last;
}

bool NoteGate::MayDeliver(PeerId peer, const Ticket& ticket) const {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return true;
  auto failed = it->second.failed.lower_bound(ticket.first);
  return failed == it->second.failed.end() || *failed > ticket.last;
}

void NoteGate::ForgetPeer(PeerId peer) {
  peers_.erase(peer);
}

}  // namespace kv::transport
