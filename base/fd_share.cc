#include "base/fd_share.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "base/fd_passing.h"
#include "base/hmac.h"

namespace kv {
namespace {

constexpr char kRequestMagic[8] = "kvdfd01";
constexpr size_t kRequestBytes = sizeof(kRequestMagic) + sizeof(uint64_t);
// A client gets this long to send its request: the server answers one connection at a time.
constexpr auto kRequestWindow = std::chrono::milliseconds(1000);
constexpr uint32_t kMaxReplyBytes = 4096;

enum ReplyCode : char { kReplyOk = 0, kReplyNotFound = 1, kReplyRefused = 2 };

// Writes one frame (u32 LE length, code, text) with `fd` attached to its first byte when valid.
void SendReply(int socket, ReplyCode code, std::string_view text, int fd) {
  const uint32_t n = static_cast<uint32_t>(1 + text.size());
  std::string frame = {static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(n >> 16),
                       static_cast<char>(n >> 24), static_cast<char>(code)};
  frame.append(text);
  size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t wrote =
        SendWithFd(socket, frame.data() + sent, frame.size() - sent, sent == 0 ? fd : -1);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) return;  // the client gave up (a tiny reply never fills a fresh socket)
    sent += static_cast<size_t>(wrote);
  }
}

// From the CSPRNG: a token is the only thing between a process of this user and the fd.
uint64_t RandomToken() {
  uint64_t token = 0;
  auto bytes = crypto::RandomBytes(sizeof(token));
  if (bytes.ok() && bytes->size() == sizeof(token)) {
    std::memcpy(&token, bytes->data(), sizeof(token));
  } else {
    // getrandom(2) without OpenSSL's pool: never a guessable fallback.
    while (::getrandom(&token, sizeof(token), 0) != static_cast<ssize_t>(sizeof(token))) {
    }
  }
  return token;
}

}  // namespace

Result<std::unique_ptr<FdServer>> FdServer::Start(const std::string& path) {
  KV_ASSIGN_OR_RETURN(Listener listener, Listener::Listen("unix:" + path));
  UniqueFd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake.valid()) return Status::IoError(std::string("eventfd: ") + std::strerror(errno));
  return std::unique_ptr<FdServer>(new FdServer(std::move(listener), path, std::move(wake)));
}

FdServer::FdServer(Listener listener, std::string path, UniqueFd wake)
    : listener_(std::move(listener)), path_(std::move(path)), wake_(std::move(wake)) {
  thread_ = std::thread([this] { Serve(); });
}

FdServer::~FdServer() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  thread_.join();
}

uint64_t FdServer::Add(UniqueFd fd) {
  std::lock_guard lock(mu_);
  uint64_t token = 0;
  while (token == 0 || fds_.count(token) != 0) token = RandomToken();
  fds_.emplace(token, std::move(fd));
  return token;
}

void FdServer::Remove(uint64_t token) {
  std::lock_guard lock(mu_);
  fds_.erase(token);
}

void FdServer::Serve() {
  while (true) {
    pollfd fds[2] = {{wake_.get(), POLLIN, 0}, {listener_.fd(), POLLIN, 0}};
    // Only the destructor's wake ends this loop: a failed poll (ENOMEM) is retried, not taken as
    // a reason to stop serving while peers still fetch (they would wait out their deadlines).
    if (::poll(fds, 2, -1) < 0) {
      if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (fds[0].revents != 0) return;
    while (true) {
      auto client = listener_.Accept();
      if (!client.ok()) {
        // EMFILE and the like leave the connection queued, so the next poll would return at once:
        // pause (or stop) rather than spin.
        pollfd wake{wake_.get(), POLLIN, 0};
        ::poll(&wake, 1, 10);
        break;
      }
      if (!client->valid()) break;
      Answer(std::move(client).value());
    }
  }
}

void FdServer::Answer(Socket client) {
  ucred cred{};
  socklen_t length = sizeof(cred);
  if (::getsockopt(client.fd(), SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0 ||
      cred.uid != ::getuid()) {
    SendReply(client.fd(), kReplyRefused, "only processes of the exporting user are served", -1);
    return;
  }
  FrameReader reader;
  auto request =
      ReceiveFrame(client.fd(), reader, std::chrono::steady_clock::now() + kRequestWindow);
  if (!request.ok() || request->size() != kRequestBytes ||
      std::memcmp(request->data(), kRequestMagic, sizeof(kRequestMagic)) != 0) {
    SendReply(client.fd(), kReplyRefused, "malformed fd request", -1);
    return;
  }
  uint64_t token = 0;
  std::memcpy(&token, request->data() + sizeof(kRequestMagic), sizeof(token));
  Result<UniqueFd> copy = Status::NotFound("");
  {
    std::lock_guard lock(mu_);
    auto it = fds_.find(token);
    if (it != fds_.end()) copy = it->second.Dup();
  }
  if (!copy.ok()) {
    SendReply(client.fd(), copy.status().code() == Code::kNotFound ? kReplyNotFound : kReplyRefused,
              copy.status().code() == Code::kNotFound ? "no fd under that token (deregistered?)"
                                                      : copy.status().message(),
              -1);
    return;
  }
  SendReply(client.fd(), kReplyOk, "", copy->get());
}

Result<UniqueFd> FetchFd(std::string_view path, uint64_t token, SteadyTime deadline) {
  KV_ASSIGN_OR_RETURN(Socket socket, Socket::Connect("unix:" + std::string(path), deadline));
  std::string request(kRequestMagic, sizeof(kRequestMagic));
  request.append(reinterpret_cast<const char*>(&token), sizeof(token));
  KV_RETURN_IF_ERROR(socket.SendFrame(request, deadline));
  std::string reply;
  uint32_t n = 0;  // the reply frame's length, once its header came
  UniqueFd received;
  while (true) {
    if (!WaitReadable(socket.fd(), deadline)) {
      return Status::Timeout("no answer from the fd server at " + std::string(path));
    }
    char chunk[512];
    iovec iov{chunk, sizeof(chunk)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t got = ::recvmsg(socket.fd(), &msg, MSG_CMSG_CLOEXEC);
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (got < 0) return Status::Unavailable(std::string("fd server read: ") + std::strerror(errno));
    // Every fd that came is owned before anything can return: none leaks.
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        UniqueFd owned(fd);
        if (!received.valid()) received = std::move(owned);
      }
    }
    if (got == 0) return Status::Unavailable("the fd server at " + std::string(path) + " hung up");
    reply.append(chunk, static_cast<size_t>(got));
    if (reply.size() >= 4) {
      n = static_cast<unsigned char>(reply[0]) | static_cast<unsigned char>(reply[1]) << 8 |
          static_cast<unsigned char>(reply[2]) << 16 |
          static_cast<uint32_t>(static_cast<unsigned char>(reply[3])) << 24;
      if (n == 0 || n > kMaxReplyBytes) return Status::Internal("fd server sent a bad reply");
      if (reply.size() >= 4 + n) break;
    }
  }
  const std::string text = reply.substr(5, n - 1);  // the frame's text, not what came after it
  switch (reply[4]) {
    case kReplyOk:
      if (!received.valid()) return Status::Internal("fd server answered without an fd");
      return received;
    case kReplyNotFound:
      return Status::NotFound("fd server: " + text);
    default:
      return Status::Unavailable("fd server refused: " + text);
  }
}

}  // namespace kv
