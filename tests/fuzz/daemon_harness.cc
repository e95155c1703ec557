#include "tests/fuzz/daemon_harness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "base/fd_passing.h"
#include "transport/transport.h"

namespace kv::fuzz {
namespace {

using Clock = std::chrono::steady_clock;

int MillisLeft(Deadline deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1000));
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kvd fuzz harness: %s\n", what.c_str());
  std::abort();
}

constexpr uint64_t kStatusSeq = uint64_t{1} << 60;

}  // namespace

// ---- Channel ----

Channel::~Channel() {
  if (fd_ >= 0) close(fd_);
}

bool Channel::SendRaw(std::string_view bytes, int attach_fd) {
  const Deadline deadline = Clock::now() + std::chrono::seconds(2);
  size_t at = 0;
  while (open() && at < bytes.size()) {
    const ssize_t n =
        SendWithFd(fd_, bytes.data() + at, bytes.size() - at, at == 0 ? attach_fd : -1);
    if (n > 0) {
      at += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (Clock::now() >= deadline) break;  // kvd stopped reading: give the connection up
      pollfd p{fd_, POLLOUT, 0};
      (void)poll(&p, 1, MillisLeft(deadline));
      continue;
    }
    break;
  }
  if (at < bytes.size()) broken_ = true;
  return !broken_;
}

bool Channel::SendFrame(const google::protobuf::Message& m, int attach_fd) {
  std::string frame;
  if (!AppendFrame(m.SerializeAsString(), &frame, 64u << 20).ok()) return false;
  return SendRaw(frame, attach_fd);
}

std::optional<std::string> Channel::NextFrame(Deadline deadline, bool* timed_out) {
  *timed_out = false;
  for (;;) {
    auto frame = decoder_.Next();
    if (!frame.ok()) return std::nullopt;
    if (frame->has_value()) return std::move(**frame);
    if (fd_ < 0) return std::nullopt;
    pollfd p{fd_, POLLIN, 0};
    const int ready = poll(&p, 1, MillisLeft(deadline));
    if (ready == 0 && Clock::now() >= deadline) {
      *timed_out = true;
      return std::nullopt;
    }
    if (ready <= 0) continue;
    char buf[65536];
    const ssize_t n = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      broken_ = true;
      return std::nullopt;
    }
    if (n > 0) decoder_.Append(buf, static_cast<size_t>(n));
  }
}

bool Channel::FinishAndDrain(Deadline deadline) {
  if (fd_ < 0) return true;
  (void)shutdown(fd_, SHUT_WR);
  char buf[65536];
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    const int ready = poll(&p, 1, MillisLeft(deadline));
    if (ready == 0 && Clock::now() >= deadline) return false;
    if (ready <= 0) continue;
    const ssize_t n = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

// ---- Harness ----

Harness& Harness::Get(const HarnessOptions& options) {
  static Harness* harness = [&] {
    auto* made = new Harness(options);  // never deleted: kvd is shut down at exit instead
    std::atexit([] {
      Harness& h = Get({});
      h.daemon_->Shutdown();
      h.peer_memory_.reset();
      h.peer_transport_.reset();
    });
    return made;
  }();
  return *harness;
}

bool Harness::WaitPeerReady(const std::string& name, Deadline deadline) {
  for (;;) {
    const proto::DaemonStatus status = daemon_->Snapshot();
    for (const auto& peer : status.peers()) {
      if (peer.name() == name && peer.state() == "ready") return true;
    }
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Harness::Harness(const HarnessOptions& options) {
  auto peer = transport::CreateTransport("local");
  if (!peer.ok()) Die("fuzz peer transport: " + peer.status().ToString());
  peer_transport_ = std::move(*peer);
  peer_transport_->set_notification_handler([](std::string_view) {});
  peer_bytes_.reset(new char[kPeerMemoryBytes]());
  auto memory =
      peer_transport_->register_memory(peer_bytes_.get(), kPeerMemoryBytes, MemoryLocation::Host());
  if (!memory.ok()) Die("fuzz peer memory: " + memory.status().ToString());
  peer_memory_ = std::move(*memory);
  peer_address_ = peer_transport_->address();
  peer_descriptor_ = peer_memory_->packed_descriptor();

  daemon::DaemonOptions d;
  d.name = "fuzz-kvd";
  d.listen = "127.0.0.1:0";
  d.transport_name = "local";
  d.max_frame_bytes = 64 * 1024;
  d.lease = std::chrono::milliseconds(2000);
  d.handshake_timeout = std::chrono::milliseconds(2000);
  d.partial_frame_timeout = std::chrono::milliseconds(500);
  d.offload_bytes = 4u << 20;
  d.auth_secret = options.auth_secret;
  auto started = daemon::Daemon::Start(std::move(d));
  if (!started.ok()) Die("kvd did not start: " + started.status().ToString());
  daemon_ = std::move(*started);
  listen_ = daemon_->listen_address();
}

std::unique_ptr<Channel> Harness::AttachEngine() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) Die("socketpair failed");
  if (!daemon_->AttachEngine(fds[1]).ok()) {
    close(fds[0]);
    return nullptr;
  }
  (void)fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return std::make_unique<Channel>(fds[0]);
}

std::unique_ptr<Channel> Harness::ConnectPeer() {
  const int port = std::stoi(listen_.substr(listen_.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) Die("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return nullptr;
  }
  (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return std::make_unique<Channel>(fd);
}

int Harness::MakeSealedMemfd(uint64_t bytes) {
  const int fd = memfd_create("fuzz-cache", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) Die("memfd_create failed");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    Die("sealing a memfd failed");
  }
  return fd;
}

bool Harness::StatusRoundTrip(Channel& engine, Deadline deadline) {
  proto::EngineMessage query;
  query.set_seq(kStatusSeq);
  query.mutable_status();
  if (!engine.SendFrame(query)) return false;
  for (;;) {
    bool timed_out = false;
    auto frame = engine.NextFrame(deadline, &timed_out);
    if (!frame) return false;
    proto::DaemonMessage m;
    if (!m.ParseFromString(*frame)) Die("kvd sent an engine a frame that is no DaemonMessage");
    if (m.seq() == kStatusSeq && m.has_reply()) {
      if (!m.reply().has_status()) Die("kvd answered a status query without a status");
      return true;
    }
  }
}

void Harness::ExpectAlive(std::chrono::milliseconds timeout) {
  const Deadline deadline = Clock::now() + timeout;
  auto engine = AttachEngine();
  if (!engine) Die("kvd refused a fresh engine");
  proto::EngineMessage hello;
  hello.set_seq(1);
  auto* h = hello.mutable_hello();
  h->set_protocol_version(proto::PROTOCOL_VERSION);
  h->set_instance("fuzz-probe");
  h->set_tp_size(1);
  if (!engine->SendFrame(hello) || !StatusRoundTrip(*engine, deadline)) {
    Die("kvd did not answer a fresh engine's status query within " +
        std::to_string(timeout.count()) + " ms");
  }
}

}  // namespace kv::fuzz
