// Test helpers for framed-socket channels: a connected pair of non-blocking unix sockets, and a
// raw read of what is on one (what a relay or a man in the middle sees on the wire).
#pragma once

#include <sys/socket.h>

#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "base/framed_socket.h"

namespace kv::testing_support {

inline std::pair<Socket, Socket> SocketPair() {
  int fds[2];
  EXPECT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, fds));
  return {Socket(fds[0]), Socket(fds[1])};
}

// Everything readable on `fd` now, raw.
inline std::string Drain(int fd) {
  std::string bytes;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT)) > 0) bytes.append(buf, n);
  return bytes;
}

}  // namespace kv::testing_support
