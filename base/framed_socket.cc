#include "base/framed_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

namespace kv {
namespace {

Status Errno(std::string_view what) {
  return Status::IoError(std::string(what) + ": " + std::strerror(errno));
}

int PollTimeoutMs(SteadyTime deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left.count(), 1000));
}

Status SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return Errno("fcntl");
  return Status::Ok();
}

struct Endpoint {
  bool is_unix = false;
  std::string path;  // unix
  std::string host;  // tcp
  uint16_t port = 0;
};

Result<Endpoint> ParseEndpoint(std::string_view text) {
  Endpoint ep;
  if (text.starts_with("unix:")) {
    ep.is_unix = true;
    ep.path = std::string(text.substr(5));
    if (ep.path.empty() || ep.path.size() >= sizeof(sockaddr_un::sun_path)) {
      return Status::InvalidArgument("unix socket path empty or longer than " +
                                     std::to_string(sizeof(sockaddr_un::sun_path) - 1) + ": '" +
                                     ep.path + "'");
    }
    return ep;
  }
  if (text.starts_with("tcp:")) {
    std::string_view rest = text.substr(4);
    size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
      return Status::InvalidArgument("expected tcp:host:port, got '" + std::string(text) + "'");
    }
    ep.host = std::string(rest.substr(0, colon));
    std::string port(rest.substr(colon + 1));
    char* end = nullptr;
    long value = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || value < 0 || value > 65535) {
      return Status::InvalidArgument("bad port in '" + std::string(text) + "'");
    }
    ep.port = static_cast<uint16_t>(value);
    return ep;
  }
  return Status::InvalidArgument("endpoint must start with unix: or tcp:, got '" +
                                 std::string(text) + "'");
}

Result<sockaddr_in> ResolveIpv4(const Endpoint& ep) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(ep.port);
  if (inet_pton(AF_INET, ep.host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(ep.host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) {
    return Status::NotFound("cannot resolve host '" + ep.host + "'");
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
  freeaddrinfo(found);
  return addr;
}

}  // namespace

// ---- Socket -------------------------------------------------------------------------------------

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

Socket::Socket(Socket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), sealer_(std::move(other.sealer_)) {}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    sealer_ = std::move(other.sealer_);
  }
  return *this;
}

Status Socket::EnableSealing(std::string_view key) {
  KV_ASSIGN_OR_RETURN(FrameSealer sealer, FrameSealer::Create(key));
  std::lock_guard lock(send_mu_);
  sealer_ = std::make_unique<FrameSealer>(std::move(sealer));
  return Status::Ok();
}

Result<Socket> Socket::Connect(std::string_view endpoint, SteadyTime deadline) {
  KV_ASSIGN_OR_RETURN(Endpoint ep, ParseEndpoint(endpoint));
  sockaddr_storage storage{};
  socklen_t length = 0;
  if (ep.is_unix) {
    auto* un = reinterpret_cast<sockaddr_un*>(&storage);
    un->sun_family = AF_UNIX;
    std::memcpy(un->sun_path, ep.path.c_str(), ep.path.size() + 1);
    length = sizeof(sockaddr_un);
  } else {
    KV_ASSIGN_OR_RETURN(sockaddr_in in, ResolveIpv4(ep));
    std::memcpy(&storage, &in, sizeof(in));
    length = sizeof(in);
  }
  // A listener that is not up yet refuses: retry until the deadline rather than fail a peer that
  // is still starting.
  while (true) {
    Socket s(::socket(ep.is_unix ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s.valid()) return Errno("socket");
    if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&storage), length) == 0) {
      if (!ep.is_unix) {
        int one = 1;
        setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      }
      KV_RETURN_IF_ERROR(SetNonBlocking(s.fd()));
      return s;
    }
    if (errno != ECONNREFUSED && errno != ENOENT && errno != EINTR) {
      return Status::Unavailable("connect " + std::string(endpoint) + ": " + std::strerror(errno));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Unavailable("nobody listens at " + std::string(endpoint));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Status Socket::SendFrame(std::string_view payload, SteadyTime deadline) {
  // framing.h's header, then the payload in place: one sendmsg of two pieces, no copy of the
  // payload (batch headers and notices of the GPU backends go through here).
  if (payload.size() > kMaxFrameBytes) {
    return Status::InvalidArgument("frame of " + std::to_string(payload.size()) +
                                   " bytes exceeds the limit of " + std::to_string(kMaxFrameBytes));
  }
  char header[kFrameHeaderBytes];
  PutFrameHeader(static_cast<uint32_t>(payload.size()), header);
  std::lock_guard lock(send_mu_);
  std::string_view parts[2] = {std::string_view(header, kFrameHeaderBytes), payload};
  std::string sealed;  // EnableSealing: the whole frame, sealed under the lock in wire order
  if (sealer_) {
    KV_RETURN_IF_ERROR(sealer_->Append(payload, &sealed, kMaxFrameBytes));
    parts[0] = sealed;
    parts[1] = std::string_view();
  }
  size_t first = 0;
  while (first < 2) {
    iovec iov[2];
    int count = 0;
    for (size_t i = first; i < 2; ++i) {
      iov[count++] = {const_cast<char*>(parts[i].data()), parts[i].size()};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    ssize_t wrote = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (wrote >= 0) {
      for (size_t left = static_cast<size_t>(wrote); first < 2;) {
        const size_t take = std::min(left, parts[first].size());
        parts[first].remove_prefix(take);
        left -= take;
        if (!parts[first].empty()) break;
        ++first;
      }
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return Status::Timeout("framed socket send blocked past the deadline");
      }
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, PollTimeoutMs(deadline));
      continue;
    }
    return Status::Unavailable(std::string("framed socket send: ") + std::strerror(errno));
  }
  return Status::Ok();
}

// ---- Listener -----------------------------------------------------------------------------------

Result<Listener> Listener::Listen(std::string_view endpoint) {
  KV_ASSIGN_OR_RETURN(Endpoint ep, ParseEndpoint(endpoint));
  Listener l;
  l.socket_ = Socket(::socket(ep.is_unix ? AF_UNIX : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!l.socket_.valid()) return Errno("socket");
  if (ep.is_unix) {
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    std::memcpy(un.sun_path, ep.path.c_str(), ep.path.size() + 1);
    ::unlink(ep.path.c_str());
    if (::bind(l.fd(), reinterpret_cast<sockaddr*>(&un), sizeof(un)) != 0) {
      return Errno("bind " + ep.path);
    }
    if (::chmod(ep.path.c_str(), 0600) != 0) return Errno("chmod " + ep.path);
    l.unix_path_ = ep.path;
    l.endpoint_ = "unix:" + ep.path;
  } else {
    int one = 1;
    setsockopt(l.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    KV_ASSIGN_OR_RETURN(sockaddr_in in, ResolveIpv4(ep));
    if (::bind(l.fd(), reinterpret_cast<sockaddr*>(&in), sizeof(in)) != 0) {
      return Errno("bind " + std::string(endpoint));
    }
    socklen_t len = sizeof(in);
    if (::getsockname(l.fd(), reinterpret_cast<sockaddr*>(&in), &len) != 0) {
      return Errno("getsockname");
    }
    l.endpoint_ = "tcp:" + ep.host + ":" + std::to_string(ntohs(in.sin_port));
  }
  if (::listen(l.fd(), 64) != 0) return Errno("listen");
  KV_RETURN_IF_ERROR(SetNonBlocking(l.fd()));
  return l;
}

Listener::~Listener() {
  if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
}

Listener::Listener(Listener&& other) noexcept
    : socket_(std::move(other.socket_)),
      endpoint_(std::move(other.endpoint_)),
      unix_path_(std::exchange(other.unix_path_, {})) {}

Listener& Listener::operator=(Listener&& other) noexcept {
  if (this != &other) {
    if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
    socket_ = std::move(other.socket_);
    endpoint_ = std::move(other.endpoint_);
    unix_path_ = std::exchange(other.unix_path_, {});
  }
  return *this;
}

Result<Socket> Listener::Accept() {
  while (true) {
    int fd = ::accept4(socket_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Socket();
      return Errno("accept");
    }
    Socket peer(fd);
    if (!unix_path_.empty()) {
      ucred cred{};
      socklen_t len = sizeof(cred);
      const uid_t self = ::geteuid();
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
          (cred.uid != self && cred.uid != 0)) {
        ++refused_;
        continue;  // closes it
      }
    } else {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    return peer;
  }
}

// ---- FrameReader --------------------------------------------------------------------------------

Status FrameReader::ReadAvailable(int fd) {
  char chunk[64 << 10];
  Status end = Status::Ok();  // EOF or a reset: reported after the frames read before it
  while (true) {
    ssize_t got = ::recv(fd, chunk, sizeof(chunk), 0);
    if (got > 0) {
      decoder_.Append(chunk, static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    end = got == 0
              ? Status::Unavailable("peer closed the framed socket")
              : Status::Unavailable(std::string("framed socket read: ") + std::strerror(errno));
    break;
  }
  KV_RETURN_IF_ERROR(broken_);
  while (true) {
    KV_ASSIGN_OR_RETURN(std::optional<std::string> frame, decoder_.Next());
    if (!frame) return end;
    if (opener_) {
      auto message = opener_->Open(*frame);
      if (!message.ok()) {
        broken_ = message.status();
        return broken_;
      }
      *frame = std::move(message).value();
    }
    ready_.push_back(std::move(*frame));
  }
}

Status FrameReader::EnableOpening(std::string_view key) {
  KV_ASSIGN_OR_RETURN(FrameOpener opener, FrameOpener::Create(key));
  opener_ = std::make_unique<FrameOpener>(std::move(opener));
  // Frames already read came after the handshake too: they must open like every later one.
  for (std::string& frame : ready_) {
    auto message = opener_->Open(frame);
    if (!message.ok()) {
      broken_ = message.status();
      ready_.clear();
      return broken_;
    }
    frame = std::move(message).value();
  }
  return Status::Ok();
}

std::optional<std::string> FrameReader::Next() {
  if (ready_.empty()) return std::nullopt;
  std::string frame = std::move(ready_.front());
  ready_.pop_front();
  return frame;
}

bool WaitReadable(int fd, SteadyTime deadline) {
  while (true) {
    pollfd p{fd, POLLIN, 0};
    int ready = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return true;  // let the read report the error
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
}

Result<std::string> ReceiveFrame(int fd, FrameReader& reader, SteadyTime deadline) {
  while (true) {
    if (auto frame = reader.Next()) return std::move(*frame);
    if (!WaitReadable(fd, deadline)) return Status::Timeout("no frame from peer before deadline");
    // A peer that sends and closes delivers its last frame with the EOF: hand the frame out
    // first; the next call reports the EOF.
    const Status read = reader.ReadAvailable(fd);
    if (auto frame = reader.Next()) return std::move(*frame);
    KV_RETURN_IF_ERROR(read);
  }
}

}  // namespace kv
