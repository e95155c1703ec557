// The in-process kvd the daemon fuzz targets feed (tests/fuzz/daemon_fuzz.cc): one
// kv::daemon::Daemon per process, started on first use through its public API only
// (daemon/daemon.h) with the `local` transport on loopback, and the two kinds of connection a
// fuzz input speaks on: an engine's (AttachEngine on a socketpair) and a peer's (TCP to kvd's
// peer port). The fuzz peer owns a `local` transport of its own, so its hello names a transport
// address kvd can connect to, and one registered host range whose descriptor a Want may name.
//
// Not thread-safe: libFuzzer runs one input at a time. Every wait has a deadline; a kvd that stops
// answering is reported by the caller (abort), which is what the fuzzer looks for.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "base/framing.h"
#include "daemon/daemon.h"
#include "protocol/kvd.pb.h"
#include "transport/transport.h"

namespace kv::fuzz {

using Deadline = std::chrono::steady_clock::time_point;

// One framed connection to kvd, owned by the harness. Writes give up at their deadline (kvd may
// stop reading a connection it is about to close); reads collect frames until a deadline.
class Channel {
 public:
  explicit Channel(int fd) : fd_(fd) {}
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  bool open() const { return fd_ >= 0 && !broken_; }
  // Writes `bytes` (one sendmsg with `attach_fd` when >= 0); false once the connection is gone.
  bool SendRaw(std::string_view bytes, int attach_fd = -1);
  bool SendFrame(const google::protobuf::Message& m, int attach_fd = -1);
  // The next frame kvd sent, nullopt at EOF, on a broken stream or at the deadline (then
  // *timed_out is set).
  std::optional<std::string> NextFrame(Deadline deadline, bool* timed_out);
  // Half-closes the sending side and reads until kvd closes too: every byte sent before was
  // read by kvd. False when kvd did not close by the deadline.
  bool FinishAndDrain(Deadline deadline);

 private:
  int fd_ = -1;
  bool broken_ = false;
  FrameDecoder decoder_{64u << 20};
};

struct HarnessOptions {
  std::string auth_secret;  // empty: loopback-only peers, no authentication
};

class Harness {
 public:
  // The process's harness, created with `options` on the first call. kvd is shut down at exit
  // (atexit), before the statics its threads use are destroyed.
  static Harness& Get(const HarnessOptions& options);

  daemon::Daemon& daemon() { return *daemon_; }
  // "127.0.0.1:PORT" of kvd's peer port.
  const std::string& listen_address() const { return listen_; }
  // The fuzz peer's transport address and a descriptor of its registered range.
  const std::string& peer_transport_address() const { return peer_address_; }
  const std::string& peer_descriptor() const { return peer_descriptor_; }
  uint64_t peer_memory_bytes() const { return kPeerMemoryBytes; }

  // A new engine connection (AttachEngine on a socketpair); null if kvd refused it.
  std::unique_ptr<Channel> AttachEngine();
  // A new TCP connection to kvd's peer port; null if connect failed.
  std::unique_ptr<Channel> ConnectPeer();

  // A sealed memfd of `bytes` (zero-filled, sparse) for a RegisterRegion; the caller closes it.
  static int MakeSealedMemfd(uint64_t bytes);

  // A status round trip on `engine` (hello'd or not): true when kvd answered. Reads and drops
  // the replies and events before the answer.
  static bool StatusRoundTrip(Channel& engine, Deadline deadline);
  // kvd answers a fresh engine's hello and status query; aborts the process when it does not
  // within `timeout` (a hung or dead kvd is the finding).
  void ExpectAlive(std::chrono::milliseconds timeout);

  // Whether kvd lists a peer named `name` as ready by the deadline (Snapshot polled every ms).
  bool WaitPeerReady(const std::string& name, Deadline deadline);

  static constexpr uint64_t kPeerMemoryBytes = 1u << 20;

 private:
  explicit Harness(const HarnessOptions& options);

  std::shared_ptr<daemon::Daemon> daemon_;
  std::string listen_;
  std::unique_ptr<transport::Transport> peer_transport_;
  std::unique_ptr<char[]> peer_bytes_;
  std::unique_ptr<transport::MemoryRegistration> peer_memory_;
  std::string peer_address_;
  std::string peer_descriptor_;
};

}  // namespace kv::fuzz
