// KvdProcess: a `kvd` executable run as a child process, for `kvbench pd` and multi-process
// tests. Start() waits (bounded) for kvd's ready line to learn its TCP address; the destructor
// kills and reaps a child still running, and the child gets SIGKILL if this process dies, so no
// path leaves an orphan daemon behind. kvd's output after the ready line is drained by a thread
// of this object (see Options::forward_output).
//
// Not thread-safe. Safe to start from a process with threads: the child only execs.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"

namespace kv::harness {

class KvdProcess {
 public:
  struct Options {
    std::string binary;  // path of the kvd executable
    std::string name;
    std::string socket_path;
    std::string transport = "auto";
    std::vector<std::string> extra_args;  // e.g. {"--lease-ms", "5000"}
    std::chrono::milliseconds ready_timeout{15000};
    // kvd logs to its stdout. After the ready line a thread keeps reading it, so that kvd never
    // blocks on a full pipe (a long failure run logs more than a pipe holds), and copies it to
    // this process's stderr when set; otherwise it is dropped.
    bool forward_output = false;
  };

  static Result<std::unique_ptr<KvdProcess>> Start(const Options& options);
  ~KvdProcess();
  KvdProcess(const KvdProcess&) = delete;
  KvdProcess& operator=(const KvdProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& listen_address() const { return listen_address_; }
  const std::string& socket_path() const { return socket_path_; }

  // SIGTERM, then SIGKILL if it has not exited within `grace`. The exit code, or kAborted naming
  // the signal it died of.
  Result<int> Stop(std::chrono::milliseconds grace);
  // SIGKILL now and reap.
  void Kill();
  bool running() const { return !reaped_; }

 private:
  KvdProcess(pid_t pid, int out_fd) : pid_(pid), out_fd_(out_fd) {}
  Result<int> Reap(std::chrono::milliseconds timeout);

  pid_t pid_;
  int out_fd_;
  std::thread drain_;  // reads out_fd_ until kvd exits (the pipe's only writer)
  bool reaped_ = false;
  std::string listen_address_;
  std::string socket_path_;
};

// The kvd executable beside the running program (build/bin/kvd next to build/bin/kvbench).
std::string KvdBesideSelf();

}  // namespace kv::harness
