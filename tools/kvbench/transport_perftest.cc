#include "tools/kvbench/transport_perftest.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string_view>
#include <thread>

namespace kv::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A spawned program; killed and reaped by the destructor unless it was waited for.
class Process {
 public:
  // stdout (and stderr) go to a pipe read by Output() when `capture`, else to /dev/null.
  static Result<Process> Spawn(const std::vector<std::string>& argv,
                               const std::vector<std::pair<std::string, std::string>>& env,
                               bool capture) {
    int out[2] = {-1, -1};
    if (capture && ::pipe2(out, O_CLOEXEC) != 0) return Status::IoError("pipe2 failed");
    // The child's environment: ours, with `env` over it; built before fork (no allocation after).
    std::vector<std::string> entries;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string_view entry(*e);
      const bool overridden = std::any_of(env.begin(), env.end(), [&](const auto& kv) {
        return entry.size() > kv.first.size() && entry.substr(0, kv.first.size()) == kv.first &&
               entry[kv.first.size()] == '=';
      });
      if (!overridden) entries.emplace_back(entry);
    }
    for (const auto& [k, v] : env) entries.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& e : entries) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid < 0) return Status::IoError(std::string("fork: ") + std::strerror(errno));
    if (pid == 0) {
      int sink = capture ? out[1] : ::open("/dev/null", O_WRONLY);
      ::dup2(sink, STDOUT_FILENO);
      ::dup2(sink, STDERR_FILENO);
      ::execvpe(args[0], args.data(), envp.data());
      ::_exit(127);
    }
    if (capture) ::close(out[1]);
    return Process(pid, out[0]);
  }
  Process(Process&& o) noexcept : pid_(std::exchange(o.pid_, -1)), fd_(std::exchange(o.fd_, -1)) {}
  ~Process() {
    if (fd_ >= 0) ::close(fd_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  // Everything the program writes until it exits; kTimeout (and the program killed) past the
  // deadline. Returns the exit code in *code.
  Result<std::string> Output(Clock::time_point deadline, int* code) {
    std::string text;
    char buf[4096];
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return Status::Timeout("ucx_perftest did not finish in time");
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return text;
  }

 private:
  Process(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  pid_t pid_;
  int fd_;
};

// A port nobody listens on right now; the server binds it a moment later.
Result<int> FreePort() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
            ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(s);
  if (!ok) return Status::IoError("no free loopback port");
  return static_cast<int>(ntohs(addr.sin_port));
}

// "Final:  iters  p50  avg  overall  bw_avg  bw_overall  rate_avg  rate_overall" (MB = 2^20).
Result<PerftestFigure> Parse(const std::string& text) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("Final:", 0) != 0) continue;
    std::istringstream f(line.substr(6));
    double iters, p50, avg, overall, bw_avg, bw_overall;
    if (!(f >> iters >> p50 >> avg >> overall >> bw_avg >> bw_overall)) break;
    return PerftestFigure{bw_overall * 1048576.0 / 1e9, overall};
  }
  return Status::Internal("no 'Final:' line in ucx_perftest output:\n" + text);
}

}  // namespace

Result<PerftestFigure> RunUcxPerftest(uint64_t size, uint64_t iters,
                                      const std::vector<std::pair<std::string, std::string>>& env,
                                      int timeout_s) {
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(timeout_s);
  const std::string warmup = std::to_string(std::min<uint64_t>(iters, 1000));
  // The client cannot know when the server listens; a refused client is retried.
  for (int attempt = 0; attempt < 20; ++attempt) {
    KV_ASSIGN_OR_RETURN(int port, FreePort());
    KV_ASSIGN_OR_RETURN(Process server,
                        Process::Spawn({"ucx_perftest", "-p", std::to_string(port)}, env, false));
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + 100 * attempt));
    KV_ASSIGN_OR_RETURN(
        Process client,
        Process::Spawn({"ucx_perftest", "127.0.0.1", "-p", std::to_string(port), "-t", "ucp_put_bw",
                        "-s", std::to_string(size), "-n", std::to_string(iters), "-w", warmup},
                       env, true));
    int code = 0;
    KV_ASSIGN_OR_RETURN(std::string text, client.Output(deadline, &code));
    if (code == 0) return Parse(text);
    if (code == 127)
      return Status::NotFound("ucx_perftest is not installed (Debian package ucx-utils)");
    if (Clock::now() > deadline) break;
  }
  return Status::Unavailable("ucx_perftest client kept failing to reach its server");
}

}  // namespace kv::bench
