// A framed message socket (unix or TCP): the side channel of the GPU backends (peer identity,
// batch headers, acks, notifications; EOF = peer gone) and the channel of the test harnesses.
//
// Frames are framing.h's (a little-endian u32 length, then that many bytes), decoded by the same
// FrameDecoder kvd's control plane uses. A frame longer than kMaxFrameBytes is a protocol
// violation. Sending blocks until the frame is written or the deadline passes; receiving is
// incremental (FrameReader) so one thread can poll many sockets.
//
// Sealing: once a side channel's handshake agreed on a key per direction
// (transport/channel_auth.h), Socket::EnableSealing and FrameReader::EnableOpening make every
// later frame an AEAD-sealed one (frame_seal.h): encrypted, and refused when altered, injected,
// replayed or reordered. Without them frames are plaintext.
//
// Thread-safety: Socket::SendFrame may be called from several threads at once (frames are never
// interleaved, and sealed frames are numbered in the order they go on the wire); reading belongs
// to one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "base/frame_seal.h"
#include "base/framing.h"
#include "base/status.h"

namespace kv {

using SteadyTime = std::chrono::steady_clock::time_point;

inline constexpr uint32_t kMaxFrameBytes = 64u << 20;

// An owned, non-blocking socket file descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  // "unix:/path" or "tcp:host:port". Fails with kUnavailable when nobody listens by `deadline`.
  static Result<Socket> Connect(std::string_view endpoint, SteadyTime deadline);

  // Writes one frame; kTimeout at the deadline, kUnavailable when the peer closed. Sealed
  // (EnableSealing): kResourceExhausted once the direction's frame numbers are spent. A frame
  // that failed to go out whole leaves the stream unusable (the caller closes it).
  Status SendFrame(std::string_view payload, SteadyTime deadline);

  // From now on every frame sent is sealed under `key` (crypto::kAeadKeyBytes bytes), numbered
  // from 0. Call once, after the handshake's last plaintext frame went out.
  Status EnableSealing(std::string_view key);

 private:
  int fd_ = -1;
  std::mutex send_mu_;
  std::unique_ptr<FrameSealer> sealer_;  // guarded by send_mu_
};

// A listening socket. Listen("unix:/path") binds a fresh path (an existing file is removed and
// the path unlinked again on destruction); Listen("tcp:127.0.0.1:0") picks a free port.
//
// A unix listener serves its own user only: the path is made 0600, and Accept closes a peer whose
// credentials (SO_PEERCRED) name another user than this process's (root excepted), so the GPU
// backends' side channels and the VMM fd server hand nothing to another account on the host.
// TCP listeners authenticate above this layer.
class Listener {
 public:
  static Result<Listener> Listen(std::string_view endpoint);
  Listener() = default;
  ~Listener();
  Listener(Listener&& other) noexcept;
  Listener& operator=(Listener&& other) noexcept;

  int fd() const { return socket_.fd(); }
  // The endpoint peers connect to, with the actual port for "tcp:...:0".
  const std::string& endpoint() const { return endpoint_; }
  // A pending connection, or an invalid Socket when none is waiting.
  Result<Socket> Accept();
  // Unix peers of another user that Accept closed.
  uint64_t refused() const { return refused_; }

 private:
  Socket socket_;
  std::string endpoint_;
  std::string unix_path_;
  uint64_t refused_ = 0;
};

// Reassembles frames from whatever a non-blocking read returns (a FrameDecoder fed by recv).
class FrameReader {
 public:
  // Reads what is available. kUnavailable on EOF or a reset; kInvalidArgument on an oversized
  // frame, or (EnableOpening) on a frame that does not open: the socket is then unusable, and
  // every later call fails the same way. Frames complete before the error stay ready for Next.
  Status ReadAvailable(int fd);
  // The next complete frame (opened, once EnableOpening was called), if any.
  std::optional<std::string> Next();

  // From now on every frame must be sealed under `key`, numbered from 0, and is handed out
  // opened. Call once, when the handshake's last plaintext frame was taken with Next: frames
  // already read and not yet taken are opened now (kInvalidArgument when one does not open).
  Status EnableOpening(std::string_view key);

 private:
  FrameDecoder decoder_{kMaxFrameBytes};
  std::deque<std::string> ready_;
  std::unique_ptr<FrameOpener> opener_;
  Status broken_;  // the frame that did not open: reported by every later ReadAvailable
};

// Waits until `fd` is readable or the deadline passes. True when readable (or hung up).
bool WaitReadable(int fd, SteadyTime deadline);

// Reads exactly one frame, waiting up to the deadline: for hand-shakes on a fresh connection.
Result<std::string> ReceiveFrame(int fd, FrameReader& reader, SteadyTime deadline);

}  // namespace kv
