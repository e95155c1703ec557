// The staged transport: a decorator that gives a host-only inner transport (Debian's UCX, built
// without CUDA) GPU regions, by staging them through pinned host slots with the copy kernels.
//
// What passes straight through: memory the inner transport reaches itself (host memory, and
// GPU memory where the inner has CUDA support) is registered, imported and posted by the inner
// transport unchanged: same descriptors, same speed. Everything else is "staged".
//
// Host memory takes either path, batch by batch (the chooser): a host registration is the
// inner registration plus a staged region id, its descriptor carries both, and a put or get
// between two such regions goes staged when its mean run is shorter than stage_runs_below bytes
// (one memcpy gather, one inner put of the chunk, one memcpy scatter instead of one inner put
// per run: 512-byte runs cost UCX a put each), else straight to the inner transport. Only the
// side that posts decides: the receiver serves whichever arrives, so both ends agree by
// construction. Deregistering a region forgets its id before the inner registration goes.
//
//  put: the batch is cut into chunks that fit a slot (chunker.h). Per chunk the sender gathers
//    the runs from its region into one of its send slots (stager.h: kernels or copy engine on a
//    stream of its own), the inner transport puts the slot into a receive slot the receiver
//    granted this link, then a kData control notification (inner notify: ordered after that
//    data) tells the receiver to scatter the slot into its region. The receiver checks every
//    range against its registration first, scatters, and acks once the scatter finished on its
//    device; only then is the receive slot reused and, after the last chunk, the batch complete.
//    Slots alternate (staging_slots of each), so the gather of chunk i+1 and the scatter of
//    chunk i-1 overlap the wire of chunk i. A staged source and a direct (inner) destination
//    skip the receiver: gather, then an inner put straight into the destination.
//    Host memory: a chunk leaves as soon as it is gathered; batches of one small chunk each,
//    queued behind each other for one remote region, share a slot (up to 2 MiB: one table, put,
//    kData and ack); the receiver scatters and acks a chunk into host memory on the inner's
//    thread that delivered its kData (core.h).
//    Nothing waits for an engine: kvd posts a put out of an engine's cache only once the
//    engine's event fired (daemon/event_gate.h).
//  links: the first staged put to a peer opens a link: kHello carries the sender's address, the
//    receiver connects back (acks travel that way), allocates the receive slots and answers
//    kWelcome with their descriptors.
//  get: the mirror image, run by the holder (getter.cc): kGetRequest names the runs and an alias
//    of the requester's destination; the holder checks them against its region and puts them,
//    staged, over its own link back; kGetDone per part. A get of a peer's direct (inner) memory
//    into a staged region is kUnsupported.
//
// Notifications: a user's notification is held back until every staged batch posted before it
// to that peer has been handed to the inner transport, and at the receiver until every scatter
// announced before it has finished, so it still arrives after the data of every earlier batch.
// User and control notifications are told apart by a tag byte (wire.h); both ends must be
// staged transports (a "ucx" transport always is, see transport.h).
//
// Failure: a staged batch past its deadline (other than one still waiting for its event, above),
// an inner error or a refused chunk fails its link:
// every batch on it completes (kTimeout for the late one, the error for the refused one,
// kUnavailable for the others) once no copy still touches its memory, and later batches to that
// peer complete with kUnavailable; connect() again for a new link. A peer whose control message
// names ranges outside a registration or a slot is answered with kOutOfRange and dropped (its
// later messages are ignored). A dead receiver fails the batch by its deadline.
//
// Limits: a receiver serves at most 64 sender links (core.h) and keeps a link's receive slots
// until it is destroyed (it cannot tell a dead sender from an idle one, and a live one may still
// write into them), so a sender that reconnects often exhausts it; then kHello is refused and
// that sender's staged batches fail with kResourceExhausted.
//
// The inner transport must run its completions and handler on its own thread, never inside
// post() or notify(), and set_notification_handler() must return only once no call of the old
// handler is running (UCX does both).
//
// Settings (TransportOptions; removed before the rest go to the inner transport):
//   staging_bytes  bytes per slot (default 16 MiB, at least 4096)
//   staging_slots  send slots per link and receive slots asked of the peer (default 4, 2..64)
//   stage_host=1   stage every batch of host registrations, with memcpy: the whole protocol on
//                  a CPU-only machine, for tests (the registrations are staged only).
//   stage_runs_below  the chooser's threshold above, in bytes of mean run length (default
//                  kDefaultStageRunsBelow, core.h; 0: host registrations are the inner's alone,
//                  every host batch direct).
// Threading: every method is thread-safe; completions and notifications run on the inner
// transport's progress thread or on the decorator's worker thread, never under a lock of ours.
#pragma once

#include <memory>
#include <span>

#include "transport/backends.h"
#include "transport/transport.h"

namespace kv::transport {

// Creates the inner transport with `options` less the settings above, and wraps it.
Result<std::unique_ptr<Transport>> CreateStagedTransport(BackendFactory inner,
                                                         const TransportOptions& options);
// The settings above, documented.
std::span<const SettingInfo> StagedSettings();

}  // namespace kv::transport
