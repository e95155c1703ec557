#include "base/framed_socket.h"

#include <fcntl.h>
#include <sys/socket.h>

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

}  // namespace
}  // namespace kv
