// FdServer / FetchFd (base/fd_share.h): how a cuda_ipc peer fetches a VMM region's
// allocation fd. Plain memfds stand in for the CUDA handles, so no GPU is needed.
#include "base/fd_share.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

namespace kv {
namespace {

using namespace std::chrono_literals;

std::string SocketPath(const std::string& tag) {
  return (std::filesystem::temp_directory_path() /
          ("kvd-fdshare-" + std::to_string(getpid()) + "-" + tag + ".sock"))
      .string();
}

UniqueFd MemFd(const std::string& content) {
  UniqueFd fd(memfd_create("fd-share-test", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(static_cast<ssize_t>(content.size()), write(fd.get(), content.data(), content.size()));
  return fd;
}

ino_t Inode(int fd) {
  struct stat st {};
  EXPECT_EQ(0, fstat(fd, &st));
  return st.st_ino;
}

SteadyTime Soon() {
  return std::chrono::steady_clock::now() + 2s;
}

TEST(FdShare, FetchReturnsTheSameOpenFileUntilRemoved) {
  auto server = FdServer::Start(SocketPath("a"));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  UniqueFd original = MemFd("kv cache bytes");
  const ino_t inode = Inode(original.get());
  const uint64_t token = (*server)->Add(std::move(original));
  const uint64_t other = (*server)->Add(MemFd("another region"));
  EXPECT_NE(token, other);

  auto fetched = FetchFd((*server)->path(), token, Soon());
  ASSERT_TRUE(fetched.ok()) << fetched.status().ToString();
  EXPECT_EQ(inode, Inode(fetched->get()));
  char buf[32] = {};
  ASSERT_EQ(14, pread(fetched->get(), buf, sizeof(buf), 0));
  EXPECT_EQ(std::string("kv cache bytes"), std::string(buf, 14));
  // Fetched again: another descriptor of the same file, the server keeps serving it.
  auto again = FetchFd((*server)->path(), token, Soon());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_NE(fetched->get(), again->get());
  EXPECT_EQ(inode, Inode(again->get()));

  (*server)->Remove(token);
  auto gone = FetchFd((*server)->path(), token, Soon());
  EXPECT_EQ(Code::kNotFound, gone.status().code()) << gone.status().ToString();
  EXPECT_TRUE(FetchFd((*server)->path(), other, Soon()).ok());
}

TEST(FdShare, UnknownTokenMalformedRequestAndNoServerAreErrors) {
  auto server = FdServer::Start(SocketPath("b"));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  (*server)->Add(MemFd("x"));
  auto unknown = FetchFd((*server)->path(), 12345, Soon());
  EXPECT_EQ(Code::kNotFound, unknown.status().code()) << unknown.status().ToString();

  // A request that is not one: refused, and the server answers the next client.
  auto raw = Socket::Connect("unix:" + (*server)->path(), Soon());
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  ASSERT_TRUE(raw->SendFrame("not a request", Soon()).ok());
  // The server closes right after its reply: the frame may come with the EOF in one read.
  FrameReader reader;
  std::optional<std::string> reply;
  for (const SteadyTime until = Soon(); !reply && WaitReadable(raw->fd(), until);) {
    const Status read = reader.ReadAvailable(raw->fd());
    reply = reader.Next();
    if (!read.ok()) break;
  }
  ASSERT_TRUE(reply.has_value());
  EXPECT_NE(std::string::npos, reply->find("malformed")) << *reply;
  const uint64_t token = (*server)->Add(MemFd("y"));
  EXPECT_TRUE(FetchFd((*server)->path(), token, Soon()).ok());

  const std::string path = (*server)->path();
  server->reset();  // stops serving and removes the socket
  const auto start = std::chrono::steady_clock::now();
  auto nobody = FetchFd(path, token, std::chrono::steady_clock::now() + 200ms);
  EXPECT_EQ(Code::kUnavailable, nobody.status().code()) << nobody.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
}

TEST(FdShare, UniqueFdDuplicatesAndCloses) {
  UniqueFd fd = MemFd("z");
  auto copy = fd.Dup();
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  EXPECT_EQ(Inode(fd.get()), Inode(copy->get()));
  const int raw = copy->get();
  UniqueFd moved = std::move(copy).value();
  EXPECT_EQ(raw, moved.get());
  moved.reset();
  EXPECT_FALSE(moved.valid());
  EXPECT_EQ(-1, fcntl(raw, F_GETFD));  // closed
  EXPECT_EQ(Code::kIoError, moved.Dup().status().code());
}

}  // namespace
}  // namespace kv
