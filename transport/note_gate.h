// Keeps a notification from reaching its peer after a batch it follows has failed.
//
// Transport::notify() promises delivery only once the data of every batch posted to that peer
// before it has landed. When one of those batches fails instead (its deadline passed, a CUDA
// error), the promise cannot be kept, and delivering the note anyway would tell the peer's engine
// that a layer is in place whose bytes never arrived. So a note is held to the batches of its
// peer from the oldest still unfinished when it was posted to the last posted before it: if any
// of them fails, the note is dropped (the peer then learns of the failure through its request
// failing, never through wrong data). One in that range that had failed already drops it too.
// The gate cannot tell which request a batch carried: a note of another request caught behind
// the failed batch is dropped too, and that request then fails at its lease instead of landing.
// Batches older than that range that had failed are its poster's to know about: kvd skips the
// notices of requests whose batches it saw fail (daemon/send_queue.cc).
//
// Not thread-safe: callers serialise (cuda_ipc under its lock).
#pragma once

#include <cstdint>
#include <set>
#include <unordered_map>

#include "transport/transport.h"

namespace kv::transport {

class NoteGate {
 public:
  // The batches a note waits on: sequence numbers [first, last] of its peer.
  struct Ticket {
    uint64_t first = 1;
    uint64_t last = 0;
  };

  // Registers a batch posted to `peer`; returns its sequence number.
  uint64_t BatchPosted(PeerId peer);
  // A note posted to `peer` now.
  Ticket NotePosted(PeerId peer) const;
  // The batch finished: its data landed, or not.
  void BatchDone(PeerId peer, uint64_t seq, bool landed);
  // Whether every batch the note waits on finished, landed or not.
  bool Finished(PeerId peer, const Ticket& ticket) const;
  // Whether a note may go, once every batch before it finished: no batch it waits on failed.
  bool MayDeliver(PeerId peer, const Ticket& ticket) const;
  // The peer is gone: its notes go nowhere.
  void ForgetPeer(PeerId peer);

  // Failures remembered per peer; past it the oldest is forgotten (notes posted that long before
  // are long delivered or dropped).
  static constexpr size_t kMaxFailures = 4096;

 private:
  struct PeerState {
    std::set<uint64_t> unfinished;
    std::set<uint64_t> failed;
  };
  std::unordered_map<PeerId, PeerState> peers_;
  uint64_t next_ = 1;
};

}  // namespace kv::transport
