// SetupWorker: runs kvd's blocking setup steps off the io thread, so that one slow peer or one
// large slab does not stall every engine and every other peer: the transport end of a peer
// handshake (connect_endpoint: a UCX worker-address exchange), imports of a peer's regions
// (import_remote: rkey unpack, CUDA IPC opens) and an engine's registration (mapping its memory,
// opening its CUDA IPC / VMM allocation and layer events, register_memory).
//
// A job's work runs on one of the worker's threads; its result is handed to `done` on the io
// thread (asio::post). Callers re-find what the job was for by id in `done`: an engine or a peer
// may have left meanwhile. The worker owns a finished job's result until the io thread takes it,
// so that results never handed over (the io loop stopped) are destroyed by Shutdown, before
// the transport that made them.
//
// Deadlines: a job not started by its deadline is not run; `done` gets kTimeout. A job already
// running is not interrupted (the transport and CUDA calls it makes end on their own).
//
// Threading: Submit on the io thread; Shutdown on any thread once the io loop no longer runs.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/status.h"

namespace kv::daemon {

class SetupWorker {
 public:
  using Clock = std::chrono::steady_clock;

  // `threads` >= 1 run jobs; at most `max_jobs` are queued, running or waiting for the io
  // thread at once.
  SetupWorker(boost::asio::io_context& io, int threads, size_t max_jobs);
  ~SetupWorker();  // Shutdown()
  SetupWorker(const SetupWorker&) = delete;
  SetupWorker& operator=(const SetupWorker&) = delete;

  // Runs `work` on a worker thread (kTimeout instead, if it would start past `deadline`), then
  // `done` with its result on the io thread. kResourceExhausted when max_jobs are in the worker,
  // kUnavailable once shut down: then neither runs.
  template <typename T>
  Status Submit(Clock::time_point deadline, std::function<Result<T>()> work,
                std::function<void(Result<T>)> done) {
    return Enqueue(std::make_unique<TypedJob<T>>(deadline, std::move(work), std::move(done)));
  }

  // Stops taking jobs, drops those not started, waits for those running and destroys every
  // result the io thread did not take. Idempotent.
  void Shutdown();

 private:
  struct Job {
    explicit Job(Clock::time_point d) : deadline(d) {}
    virtual ~Job() = default;
    virtual void Run(bool expired) = 0;  // worker thread
    virtual void Finish() = 0;           // io thread
    Clock::time_point deadline;
  };
  template <typename T>
  struct TypedJob final : Job {
    TypedJob(Clock::time_point d, std::function<Result<T>()> w, std::function<void(Result<T>)> f)
        : Job(d), work(std::move(w)), done(std::move(f)) {}
    void Run(bool expired) override {
      if (expired) {
        result.emplace(Status::Timeout("setup step waited past its deadline in kvd's queue"));
      } else {
        result.emplace(work());
      }
      work = nullptr;  // what it captured goes with the worker's turn, not the io thread's
    }
    void Finish() override { done(std::move(*result)); }
    std::function<Result<T>()> work;
    std::function<void(Result<T>)> done;
    std::optional<Result<T>> result;
  };

  Status Enqueue(std::unique_ptr<Job> job);
  void Loop();
  void Deliver(uint64_t id);  // io thread

  boost::asio::io_context& io_;
  const size_t max_jobs_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  uint64_t next_id_ = 1;
  size_t jobs_ = 0;  // queued + running + finished
  std::deque<std::pair<uint64_t, std::unique_ptr<Job>>> queue_;
  std::map<uint64_t, std::unique_ptr<Job>> finished_;  // until the io thread takes them
  std::vector<std::thread> threads_;
};

// An engine's or a peer's messages that arrived while a setup step of theirs ran on the setup
// worker (setup_worker.h): handled in arrival order once it finished, so that what was sent
// after a registration, a hello or a Want sees its effect. Bounded by kMaxHeldBytes (then the
// connection closes). Engines send one fd-carrying RegisterRegion at a time (the connector
// waits for each reply); one that pipelines more than EngineLimits' one queued fd is closed.
struct HeldMessages {
  bool busy = false;  // a setup step is in flight
  std::deque<std::string> messages;
  size_t bytes = 0;
};
inline constexpr size_t kMaxHeldBytes = size_t{64} << 20;
// Setup steps in flight at once: one per engine and peer at most, so this bounds those too.
inline constexpr size_t kMaxSetupJobs = 1024;

}  // namespace kv::daemon
