// A forked helper process joined to its parent by a socketpair: the bootstrap that two-process
// tests and `kvbench transport` use to exchange transport addresses and memory descriptors.
//
// Fork before the parent starts any thread or initialises UCX/CUDA: the child runs arbitrary
// code. The child gets SIGKILL when the parent dies, and ~ChildProcess kills and reaps a child
// still running, so no path leaves a zombie or an orphan. Not thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "base/framed_socket.h"
#include "transport/transport.h"

namespace kv::harness {

using Clock = std::chrono::steady_clock;

// Framed messages (base/framed_socket.h) over the socketpair. Every call is bounded by a deadline.
class Channel {
 public:
  explicit Channel(int fd);  // takes ownership of a connected stream socket
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // kUnavailable when the other end is gone, kTimeout when it stopped reading for a minute.
  Status Send(std::string_view message);
  // kTimeout past the deadline, kUnavailable when the other end closed, kInvalidArgument for a
  // frame above kMaxFrameBytes.
  Result<std::string> Receive(Clock::time_point deadline);

 private:
  Socket socket_;
  FrameReader reader_;
};

class ChildProcess {
 public:
  // Forks. The child calls body(channel) and exits with its return value (never returns here).
  static Result<std::unique_ptr<ChildProcess>> Start(const std::function<int(Channel&)>& body);
  ~ChildProcess();  // SIGKILL and reap when still running

  pid_t pid() const { return pid_; }
  Channel& channel() { return *channel_; }

  // SIGKILL now and reap.
  void Kill();
  // The child's exit code; kTimeout if it has not exited by the deadline (it is left running),
  // kAborted naming the signal when it died of one.
  Result<int> Wait(Clock::time_point deadline);

 private:
  ChildProcess(pid_t pid, int fd) : pid_(pid), channel_(std::make_unique<Channel>(fd)) {}
  pid_t pid_;
  bool reaped_ = false;
  int status_ = 0;
  std::unique_ptr<Channel> channel_;
};

}  // namespace kv::harness
