// Issue 19: when kvd runs out of file descriptors, its peer acceptor backs off instead of
// re-arming at once (before, async_accept failed with EMFILE in a loop that kept the io thread
// busy), and it accepts again once descriptors are free. This binary lowers its own fd limit;
// the connections come from a child process, which has its own descriptor table.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "daemon/daemon.h"

namespace kv {
namespace {

int OpenFds() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)entry;
    ++n;
  }
  return n;
}

double CpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

// Opens `n` connections to 127.0.0.1:`port` and holds them until its stdin closes.
pid_t Connector(uint16_t port, int n, int* release_fd) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(pipe_fds[1]);
    std::vector<int> held;
    for (int i = 0; i < n; ++i) {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(port);
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) held.push_back(fd);
    }
    char c;
    (void)!read(pipe_fds[0], &c, 1);  // until the parent closes its end (or dies)
    _exit(0);
  }
  close(pipe_fds[0]);
  *release_fd = pipe_fds[1];
  return pid;
}

TEST(AcceptBackoff, OutOfDescriptorsTheAcceptorPausesAndRecovers) {
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old), 0);
  daemon::DaemonOptions options;
  options.name = "starved";
  options.transport_name = "local";
  options.handshake_timeout = std::chrono::milliseconds(60000);  // connections stay
  auto d = daemon::Daemon::Start(std::move(options));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const std::string address = (*d)->listen_address();
  const auto port = static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));

  // Room for 20 more descriptors in this process; the child opens 100 connections.
  rlimit tight = old;
  tight.rlim_cur = static_cast<rlim_t>(OpenFds() + 20);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  int release = -1;
  const pid_t child = Connector(port, 100, &release);
  ASSERT_GT(child, 0);
  // Wait until kvd holds what it can (its refusals are counted; a pause logs one each).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*d)->Snapshot().peers_refused() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT((*d)->Snapshot().peers_refused(), 0u) << "kvd never ran out of descriptors";
  // Starved for a second: backing off, the io thread stays nearly idle (it spun before).
  const double cpu_before = CpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const double cpu = CpuSeconds() - cpu_before;
  EXPECT_LT(cpu, 0.5) << "the acceptor spins on EMFILE";

  // Descriptors back: kvd serves again.
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old), 0);
  close(release);
  int status = 0;
  waitpid(child, &status, 0);
  const auto later = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  uint32_t connections = 0;
  int probe = -1;
  while (std::chrono::steady_clock::now() < later) {
    if (probe < 0) {
      probe = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(port);
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        close(probe);
        probe = -1;
      }
    }
    connections = (*d)->Snapshot().peer_connections();
    if (probe >= 0 && connections >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(connections, 1u) << "kvd did not accept again";
  if (probe >= 0) close(probe);
}

}  // namespace
}  // namespace kv
