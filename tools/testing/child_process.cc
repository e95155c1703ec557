#include "tools/testing/child_process.h"

#include <fcntl.h>
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

Channel::Channel(int fd) : socket_(fd) {
  // The framed socket polls on EAGAIN: its reads and writes must not block past a deadline.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
}

Status Channel::Send(std::string_view message) {
  return socket_.SendFrame(message, Clock::now() + std::chrono::minutes(1));
}

Result<std::string> Channel::Receive(Clock::time_point deadline) {
  return ReceiveFrame(socket_.fd(), reader_, deadline);
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
