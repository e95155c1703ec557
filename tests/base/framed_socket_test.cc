#include "base/framed_socket.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include <gtest/gtest.h>

namespace kv {
namespace {

SteadyTime Soon() {
  return std::chrono::steady_clock::now() + std::chrono::seconds(5);
}

// Two connected non-blocking sockets.
std::pair<Socket, Socket> Pair() {
  int fds[2];
  EXPECT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, fds));
  return {Socket(fds[0]), Socket(fds[1])};
}

// A peer that sends and exits at once (a forked child reporting a result) delivers its frames
// with the EOF in one read: every frame comes out before the EOF is reported.
TEST(FramedSocket, FramesSentJustBeforeTheCloseAreDeliveredThenTheClose) {
  auto [a, b] = Pair();
  ASSERT_TRUE(a.SendFrame("first", Soon()).ok());
  ASSERT_TRUE(a.SendFrame("", Soon()).ok());
  { Socket closing = std::move(a); }
  FrameReader reader;
  auto first = ReceiveFrame(b.fd(), reader, Soon());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(*first, "first");
  auto empty = ReceiveFrame(b.fd(), reader, Soon());
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_EQ(*empty, "");
  auto end = ReceiveFrame(b.fd(), reader, Soon());
  EXPECT_EQ(end.status().code(), Code::kUnavailable) << end.status().ToString();
}

TEST(FramedSocket, AnOversizedFrameIsRefusedOnBothSides) {
  auto [a, b] = Pair();
  const std::string big(kMaxFrameBytes + 1, 'x');
  EXPECT_EQ(a.SendFrame(big, Soon()).code(), Code::kInvalidArgument);
  const uint32_t n = kMaxFrameBytes + 1;  // a header announcing too much, little-endian
  const char header[4] = {static_cast<char>(n), static_cast<char>(n >> 8),
                          static_cast<char>(n >> 16), static_cast<char>(n >> 24)};
  ASSERT_EQ(4, ::send(a.fd(), header, 4, MSG_NOSIGNAL));
  FrameReader reader;
  auto got = ReceiveFrame(b.fd(), reader, Soon());
  EXPECT_EQ(got.status().code(), Code::kInvalidArgument) << got.status().ToString();
}

TEST(FramedSocket, NothingByTheDeadlineIsATimeout) {
  auto [a, b] = Pair();
  FrameReader reader;
  const auto start = std::chrono::steady_clock::now();
  auto got = ReceiveFrame(b.fd(), reader, start + std::chrono::milliseconds(50));
  EXPECT_EQ(got.status().code(), Code::kTimeout);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

// A unix listener serves its own user: another account cannot reach the path (0600), and one that
// reaches it anyway (the test opens the path up) is closed at accept. Needs root to be another
// user.
TEST(FramedSocket, AUnixListenerRefusesAnotherUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  const std::string path = "/tmp/kv_framed_socket_test." + std::to_string(::getpid());
  auto listener = Listener::Listen("unix:" + path);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  struct stat st {};
  ASSERT_EQ(0, ::stat(path.c_str(), &st));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto as_nobody = [&](bool open_path) {
    if (open_path) ::chmod(path.c_str(), 0666);
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
      auto s = Socket::Connect("unix:" + path, Soon());
      if (!s.ok()) ::_exit(1);  // refused at the path
      FrameReader reader;
      auto got = ReceiveFrame(s->fd(), reader, Soon());
      ::_exit(got.status().code() == Code::kUnavailable ? 2 : 4);  // 2: closed by the listener
    }
    for (auto until = Soon(); std::chrono::steady_clock::now() < until;) {
      auto peer = listener->Accept();
      EXPECT_TRUE(peer.ok());
      EXPECT_FALSE(peer.ok() && peer->valid()) << "another user's connection was accepted";
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid)
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      ::usleep(1000);
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
  };
  EXPECT_EQ(as_nobody(false), 1);
  EXPECT_EQ(as_nobody(true), 2);
  EXPECT_EQ(listener->refused(), 1u);
  // Its own user still gets in.
  auto mine = Socket::Connect("unix:" + path, Soon());
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  Result<Socket> accepted = Socket();
  for (auto until = Soon(); std::chrono::steady_clock::now() < until; ::usleep(1000)) {
    accepted = listener->Accept();
    if (!accepted.ok() || accepted->valid()) break;
  }
  ASSERT_TRUE(accepted.ok() && accepted->valid());
}

}  // namespace
}  // namespace kv
