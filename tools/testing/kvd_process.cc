#include "tools/testing/kvd_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

namespace kv::harness {

using Clock = std::chrono::steady_clock;

std::string KvdBesideSelf() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "kvd";
  return (self.parent_path() / "kvd").string();
}

Result<std::unique_ptr<KvdProcess>> KvdProcess::Start(const Options& options) {
  std::vector<std::string> args = {options.binary,      "--name",      options.name,
                                   "--listen",          "127.0.0.1:0", "--socket",
                                   options.socket_path, "--transport", options.transport};
  args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return Status::IoError(std::string("pipe: ") + strerror(errno));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    return Status::IoError(std::string("fork: ") + strerror(errno));
  }
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(out[1], STDOUT_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  std::unique_ptr<KvdProcess> child(new KvdProcess(pid, out[0]));
  child->socket_path_ = options.socket_path;

  // Read up to the ready line, "kvd NAME ready listen=HOST:PORT socket=... transport=...": log
  // lines may come before it.
  std::string text;
  size_t ready_at = std::string::npos;
  const auto deadline = Clock::now() + options.ready_timeout;
  while (ready_at == std::string::npos || text.find('\n', ready_at) == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return Status::Timeout("kvd " + options.name + " not ready within " +
                             std::to_string(options.ready_timeout.count()) + " ms");
    }
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[512];
    ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) {
      auto code = child->Reap(std::chrono::milliseconds(1000));
      return Status::Unavailable("kvd " + options.name + " exited before it was ready" +
                                 (code.ok() ? " (exit code " + std::to_string(*code) + ")"
                                            : ": " + code.status().message()) +
                                 "; its stderr says why");
    }
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > (1 << 20)) return Status::Internal("kvd printed no ready line");
    const size_t found = text.find("kvd " + options.name + " ready listen=");
    if (found != std::string::npos && (found == 0 || text[found - 1] == '\n')) ready_at = found;
  }
  const size_t line_end = text.find('\n', ready_at);
  const std::string line = text.substr(ready_at, line_end - ready_at);
  const size_t at = line.find("listen=");
  const size_t end = line.find(' ', at);
  child->listen_address_ = line.substr(at + 7, end == std::string::npos ? end : end - at - 7);
  const bool forward = options.forward_output;
  if (forward) {
    const std::string rest = text.substr(0, ready_at) + text.substr(line_end + 1);
    [[maybe_unused]] ssize_t n = write(STDERR_FILENO, rest.data(), rest.size());
  }
  child->drain_ = std::thread([fd = child->out_fd_, forward] {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // kvd exited: the pipe has no writer left
      if (forward) {
        [[maybe_unused]] ssize_t w = write(STDERR_FILENO, buf, static_cast<size_t>(n));
      }
    }
  });
  return child;
}

Result<int> KvdProcess::Reap(std::chrono::milliseconds timeout) {
  if (reaped_) return Status::NotFound("already reaped");
  const auto deadline = Clock::now() + timeout;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (r < 0 && errno != EINTR) return Status::IoError(std::string("waitpid: ") + strerror(errno));
    if (Clock::now() >= deadline) return Status::Timeout("kvd did not exit in time");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  reaped_ = true;
  if (WIFSIGNALED(status)) {
    return Status::Aborted(std::string("kvd died of ") + strsignal(WTERMSIG(status)));
  }
  return WEXITSTATUS(status);
}

Result<int> KvdProcess::Stop(std::chrono::milliseconds grace) {
  if (reaped_) return Status::NotFound("kvd already stopped");
  kill(pid_, SIGTERM);
  auto code = Reap(grace);
  if (code.ok() || code.status().code() != Code::kTimeout) return code;
  Kill();
  return Status::Timeout("kvd did not stop within " + std::to_string(grace.count()) +
                         " ms of SIGTERM; killed");
}

void KvdProcess::Kill() {
  if (reaped_) return;
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
}

KvdProcess::~KvdProcess() {
  Kill();
  if (drain_.joinable()) drain_.join();  // the child is reaped: its end of the pipe is closed
  close(out_fd_);
}

}  // namespace kv::harness
