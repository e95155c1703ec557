// The "host_ipc" backend: moves plan runs between host memory of two processes of one host with
// one memcpy per run, straight between the initiator's memory and its mapping of the peer's.
//
// Why: kvd's host regions are the engines' sealed memfds (base/shared_memory.h). UCX moves
// registered (not UCX-allocated) host memory between two processes of one host by emulated RMA,
// two copies through its shared-memory FIFO; here the peer's memfd itself is mapped, so a put or
// a get is the one copy a memcpy ceiling makes (the host analogue of cuda_ipc, and of UCX's
// xpmem).
//
// register_memory() refuses memory without its object (kUnsupported):
// register_shared_memory() takes the object's fd (borrowed; duplicated here) and serves the
// duplicate from an FdServer (base/fd_share.h) at "<socket>.fd" under a random token the packed
// descriptor names, with the offset of `base` in the object and the length. The object must be
// sealed against shrinking and growing and hold offset + length bytes (kInvalidArgument /
// kOutOfRange otherwise). import_remote() fetches a duplicate (SCM_RIGHTS; only from the fd
// server of the peer it names), checks the seals and the object's size again
// (SharedMemory::Adopt: a peer cannot shrink it under us and SIGBUS this process), and maps the
// registered range MAP_SHARED, populated; the mapping lives until the RemoteMemory and every
// batch that names it let go.
//
// post() checks every run against both registrations (run_check.h) on the caller's thread and
// queues the batch; one copy thread runs the queue in order: a batch whose deadline passed
// before its turn fails kTimeout with nothing copied, otherwise its runs (and the rows of its run
// groups) are memcpy'd (copier.h: split over helper threads when copy_threads > 1). Completions
// come in posting order (except batches failed by disconnect() or a peer's death, which complete
// at once), called on the copy thread once the queue ran empty or at most 16 batches / 8 MiB
// after their copy ended, so that a caller's completion work (kvd's hand-over to its io thread)
// does not hold up the next copy. A notification, sent by the copy thread at its turn, follows
// the data of every batch posted before it, without waiting for their completions; one behind a
// batch that failed is dropped (note_gate.h).
//
// Side channel: address() is "<host id>|unix:<path>" of a unix socket the backend listens on
// (0600, this user only: base/framed_socket.h). It carries notifications and liveness: a peer
// whose socket closes is dead, its queued batches fail with kUnavailable at once (one being
// copied completes once its copy finished: our mapping of the peer's memory outlives the
// peer), and later posts to it are refused with kUnavailable. No write grants are checked
// (checks_write_grants() false): a peer maps the whole registered region, like UCX's RMA lanes and
// cuda_ipc (SECURITY.md).
//
// Settings (TransportOptions): "socket_dir" (default /tmp), "connect_timeout_ms" (side-channel
// connects and fd fetches; default 5000), "copy_threads" (default 1: two threads doubled a bare
// memcpy on the dev VM but not kvd's P/D there, benchmarks/pd.md).
#pragma once

#include <memory>
#include <span>

#include "transport/transport.h"

namespace kv::transport {

Result<std::unique_ptr<Transport>> CreateHostIpcTransport(const TransportOptions& options);
// The settings above, documented.
std::span<const SettingInfo> HostIpcSettings();

}  // namespace kv::transport
