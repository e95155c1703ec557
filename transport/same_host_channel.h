// The side channel of the same-host backends (cuda_ipc, host_ipc): the unix socket a transport
// listens on, one connection to each peer it connected to, and the fd server beside the socket
// that hands the fds of its registered memory objects to peers (base/fd_share.h); with the
// descriptors and registrations that name that fd server.
//
// Address: "<host id>|unix:<socket_dir>/kvd-<tag>-<pid>-<n>.sock"; the fd server listens at that
// path + ".fd". A peer on another host (or this host booted again) is refused: its memory means
// nothing here.
//
// Wire: a notification is one frame (base/framed_socket.h) on the connection its sender opened.
// Nothing else travels on it and nothing comes back, so the connecting side never reads: its
// connection turning readable means the peer closed it, and the peer is then dead. A peer is dead
// too once a notification to it could not be sent. A dead peer stays known (posting to it gives
// kUnavailable) until Disconnect().
//
// Gone hook: when a peer dies or is disconnected, `gone` runs with the backend's mutex held. The
// backend drops the peer's queued work there, adding the completions of its batches that never
// ran to *failed, and lets the batches already running fail with `why` once they stopped. The
// channel then calls those completions, with no lock held, with `why`: kUnavailable ("peer process
// is gone") for a dead peer, kAborted for a disconnected one.
//
// Locking: the peer table is guarded by the mutex the backend passes to Open, which guards the
// backend's own state too, so that the backend checks a peer and queues work for it atomically.
// Methods named *Locked want it held; the others take it and must be called without it. Poll()
// belongs to one thread at a time (the backend's progress thread); Wake() may be called anywhere,
// with or without the mutex.
//
// Waits: Connect and SendNote until their deadlines; Poll for at most `wait`.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/fd_share.h"
#include "base/framed_socket.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "transport/transport.h"

namespace kv::transport {

constexpr size_t kHostIdBytes = 48;   // the host id in a descriptor, with its NUL
constexpr size_t kFdPathBytes = 108;  // sizeof(sockaddr_un::sun_path): the fd server's path, NUL

// Distinguishes hosts (and reboots of one host): the boot id, else the host name; at most
// kHostIdBytes - 1 bytes.
std::string HostId();

// Removes `peer`'s jobs from `queue` (any container of jobs with `peer`, `is_note` and `done`),
// adding their batches' completions to *failed: the usual body of a gone hook.
template <typename Queue>
void TakeJobsOf(Queue* queue, PeerId peer, std::vector<Completion>* failed) {
  for (auto it = queue->begin(); it != queue->end();) {
    if (it->peer != peer) {
      ++it;
      continue;
    }
    if (!it->is_note && it->done) failed->push_back(std::move(it->done));
    it = queue->erase(it);
  }
}

// A registered region: what the backend packed for its peers' import_remote(), and the token under
// which the channel's fd server serves the region's memory object to them (none: null server).
// Deregistering stops serving the fd: peers that mapped the object keep their mappings; new imports
// get kNotFound. Each backend derives its own final class, so that a batch naming another
// backend's registration is told apart by its type and refused.
class SameHostRegistration : public MemoryRegistration {
 public:
  SameHostRegistration(void* base, uint64_t length, MemoryLocation where, std::string packed,
                       std::shared_ptr<FdServer> fd_server, uint64_t fd_token)
      : base_(base),
        length_(length),
        where_(where),
        packed_(std::move(packed)),
        fd_server_(std::move(fd_server)),
        fd_token_(fd_token) {}
  ~SameHostRegistration() override {
    if (fd_server_) fd_server_->Remove(fd_token_);
  }
  void* base() const override { return base_; }
  uint64_t length() const override { return length_; }
  MemoryLocation location() const override { return where_; }
  std::string packed_descriptor() const override { return packed_; }

 private:
  void* base_;
  uint64_t length_;
  MemoryLocation where_;
  std::string packed_;
  std::shared_ptr<FdServer> fd_server_;
  uint64_t fd_token_;
};

class SameHostChannel {
 public:
  using Gone = std::function<void(PeerId peer, const Status& why, std::vector<Completion>* failed)>;

  // Listens at "<socket_dir>/kvd-<tag>-<pid>-<n>.sock" and starts the fd server beside it.
  // kInvalidArgument when the fd server's path would not fit kFdPathBytes. `name` prefixes every
  // error. `mu` and `gone` must outlive the channel.
  // First removes the pairs of sockets of that naming that processes killed without closing their
  // channel (SIGKILL, a crash) left in socket_dir: those whose process is gone and whose socket
  // refuses connections. A live channel's process is seen alive and its sockets left alone; one
  // of another PID namespace sharing the directory is left once it listens.
  static Result<std::unique_ptr<SameHostChannel>> Open(std::string name,
                                                       const std::string& socket_dir,
                                                       std::string_view tag, std::mutex* mu,
                                                       Gone gone);
  // Closes every connection. The caller has stopped calling Poll. The fd server lives on while
  // registrations hold it.
  ~SameHostChannel() = default;
  SameHostChannel(const SameHostChannel&) = delete;
  SameHostChannel& operator=(const SameHostChannel&) = delete;

  const std::string& host_id() const { return host_id_; }
  std::string address() const { return host_id_ + "|" + listener_.endpoint(); }
  // Shared with the registrations whose fds it serves.
  const std::shared_ptr<FdServer>& fd_server() const { return fd_server_; }

  // A descriptor's bytes (Wire: a backend's fixed-size struct with `char magic[8]`, `char
  // fd_path[kFdPathBytes]` and `char host_id[kHostIdBytes]`): `wire` with `magic` and this host's
  // id filled in.
  template <typename Wire>
  std::string Pack(Wire wire, const char (&magic)[8]) const {
    std::memcpy(wire.magic, magic, sizeof(wire.magic));
    std::memcpy(wire.host_id, host_id_.data(), host_id_.size());
    return std::string(reinterpret_cast<const char*>(&wire), sizeof(wire));
  }
  // The descriptor in `packed`, its strings NUL-terminated: kInvalidArgument for a blob of another
  // size or magic, kIncompatible for one from another host. Its other fields are the caller's to
  // check.
  template <typename Wire>
  Result<Wire> Unpack(std::string_view packed, const char (&magic)[8]) const {
    if (packed.size() != sizeof(Wire)) {
      return Status::InvalidArgument(name_ + " descriptor has " + std::to_string(packed.size()) +
                                     " bytes, expected " + std::to_string(sizeof(Wire)));
    }
    Wire wire;
    std::memcpy(&wire, packed.data(), sizeof(wire));
    if (std::memcmp(wire.magic, magic, sizeof(wire.magic)) != 0) {
      return Status::InvalidArgument("not a " + name_ + " descriptor");
    }
    wire.host_id[kHostIdBytes - 1] = '\0';
    wire.fd_path[kFdPathBytes - 1] = '\0';
    if (host_id_ != wire.host_id) {
      return Status::Incompatible(name_ + " descriptor comes from another host");
    }
    return wire;
  }

  // Connects to the side channel at `address` (another channel's address()) and numbers the peer.
  // kInvalidArgument for a malformed address, kIncompatible for another host's, and
  // Socket::Connect's errors (kUnavailable when nobody listens by `deadline`).
  Result<PeerId> Connect(std::string_view address, SteadyTime deadline);
  // Forgets `peer` and runs the gone hook with kAborted; nothing when it is unknown.
  void Disconnect(PeerId peer) { Drop(peer, /*forget=*/true); }
  // The path of `peer`'s fd server ("<its socket>.fd"); kNotFound when it is unknown.
  Result<std::string> FdPathOf(PeerId peer) const;

  // For posting: kNotFound when `peer` is unknown, kUnavailable when it is dead.
  Status CheckPeerLocked(PeerId peer) const;
  // For work accepted before: kAborted when `peer` was disconnected, kUnavailable when it is
  // dead, Ok otherwise.
  Status GoneLocked(PeerId peer) const;

  // Sends `note` to `peer` unless it is unknown or dead; a failed send makes it dead.
  void SendNote(PeerId peer, std::string_view note, SteadyTime deadline);
  // Called with every notification a peer sends here, on the thread in Poll.
  void SetNotificationHandler(NotificationHandler handler);

  // One pass of the side channel: waits (ppoll) at most `wait` for a connection, a notification,
  // a peer's connection closing or Wake(); then accepts, delivers and marks dead. Returns whether
  // Wake() was called since the last pass.
  bool Poll(std::chrono::nanoseconds wait);
  // Ends the wait of the current (or the next) Poll.
  void Wake();

 private:
  struct Peer {
    Socket socket;
    std::string fd_path;  // the peer's fd server: "<its socket>.fd"
    bool dead = false;    // guarded by *mu_
  };
  struct Incoming {
    Socket socket;
    FrameReader reader;
  };
  SameHostChannel(std::string name, std::mutex* mu, Gone gone);
  // Disconnect() (`forget`: the peer is erased) or the peer died (it is marked dead, once).
  void Drop(PeerId peer, bool forget);
  // The peer never writes on the socket we opened, so readability there means it closed.
  void CheckOutgoing(PeerId peer);
  void ReadNotifications(const std::vector<pollfd>& fds);

  const std::string name_;
  const std::string host_id_;
  std::mutex* const mu_;
  const Gone gone_;
  Listener listener_;
  std::shared_ptr<FdServer> fd_server_;
  UniqueFd wake_fd_;                // eventfd
  std::vector<Incoming> incoming_;  // Poll's

  std::map<PeerId, std::shared_ptr<Peer>> peers_;  // guarded by *mu_
  PeerId next_peer_ = 1;                           // guarded by *mu_
  NotificationHandler handler_;                    // guarded by *mu_
};

}  // namespace kv::transport
