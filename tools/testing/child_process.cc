#include "tools/testing/child_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace kv::harness {

Channel::~Channel() {
  ::close(fd_);
}

Status Channel::Send(std::string_view message) {
  if (message.size() > kMaxMessage)
    return Status::InvalidArgument("message of " + std::to_string(message.size()) + " bytes");
  uint32_t n = static_cast<uint32_t>(message.size());
  std::string frame(reinterpret_cast<const char*>(&n), sizeof n);
  frame.append(message);
  size_t sent = 0;
  while (sent < frame.size()) {
    ssize_t w = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Status::Unavailable(std::string("channel send: ") + std::strerror(errno));
    sent += static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status Channel::ReadExactly(char* out, size_t n, Clock::time_point deadline) {
  size_t got = 0;
  while (got < n) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return Status::Timeout("no message from the other process in time");
    pollfd p{fd_, POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1000)));
    if (rc < 0 && errno != EINTR) return Status::IoError(std::strerror(errno));
    if (rc <= 0) continue;
    ssize_t r = ::recv(fd_, out + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Status::Unavailable("the other process closed the channel");
    got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

Result<std::string> Channel::Receive(Clock::time_point deadline) {
  uint32_t n = 0;
  KV_RETURN_IF_ERROR(ReadExactly(reinterpret_cast<char*>(&n), sizeof n, deadline));
  if (n > kMaxMessage)
    return Status::InvalidArgument("channel frame of " + std::to_string(n) + " bytes");
  std::string message(n, '\0');
  KV_RETURN_IF_ERROR(ReadExactly(message.data(), n, deadline));
  return message;
}

Result<std::unique_ptr<ChildProcess>> ChildProcess::Start(
    const std::function<int(Channel&)>& body) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    return Status::IoError(std::string("socketpair: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return Status::IoError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(125);  // the parent died before prctl took effect
    int code;
    {
      Channel channel(fds[1]);
      code = body(channel);
    }
    // _exit: the parent's atexit handlers and static destructors (gtest, UCX) are not ours to run.
    ::_exit(code);
  }
  ::close(fds[1]);
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, fds[0]));
}

ChildProcess::~ChildProcess() {
  Kill();
}

void ChildProcess::Kill() {
  if (reaped_) return;
  ::kill(pid_, SIGKILL);
  while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
}

Result<int> ChildProcess::Wait(Clock::time_point deadline) {
  while (!reaped_) {
    pid_t r = ::waitpid(pid_, &status_, WNOHANG);
    if (r == pid_) {
      reaped_ = true;
      break;
    }
    if (r < 0 && errno != EINTR)
      return Status::IoError(std::string("waitpid: ") + std::strerror(errno));
    if (Clock::now() > deadline)
      return Status::Timeout("process " + std::to_string(pid_) + " did not exit in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (WIFSIGNALED(status_))
    return Status::Aborted("process " + std::to_string(pid_) + " died of signal " +
                           std::to_string(WTERMSIG(status_)));
  return WEXITSTATUS(status_);
}

}  // namespace kv::harness
