// One side of a conformance pair: a transport with one registered memory, living in a thread of
// the test process or in a forked child (Backend::hosting), driven by the test over a Channel.
// The test process itself touches neither the transport nor the memory (it must not initialise
// UCX or CUDA before it forks): it sends commands and reads what the side reports.
//
// A side registers `bytes` of memory holding Pattern(bytes, seed) (kUntouched bytes when the seed
// is negative), announces its address and descriptor, and answers the commands below. Its
// notification handler copies the memory the moment each notification is delivered, so a test
// sees what had landed by then (SnapshotAt).
//
// Every call is bounded: a side that does not answer in time makes the call fail (kTimeout), and
// ~Side kills a child (or closes a thread's channel and joins it) on every path. Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/conformance_backends.h"
#include "tools/testing/child_process.h"
#include "transport/transport.h"

namespace kv::transport::conformance {

using harness::Channel;
using harness::ChildProcess;

inline constexpr uint8_t kUntouched = 0xEE;

// PatternByte(i, seed) for i in [0, bytes); all kUntouched for a negative seed.
std::vector<uint8_t> Pattern(uint64_t bytes, int seed);

// `base` with the runs copied in from Pattern(·, src_seed): what a destination holding `base`
// must hold once `runs` landed, and nothing else.
std::vector<uint8_t> Landed(std::vector<uint8_t> base, int src_seed,
                            const std::vector<kv::Run>& runs);

// Batches one side posts to its connected peer, all of one op. `note` (when not empty) is
// notified right after the last post() returned, before any completion is awaited: ordering it
// behind the data is the transport's job.
struct Script {
  Op op = Op::kPut;
  std::vector<std::vector<kv::Run>> batches;
  std::chrono::milliseconds deadline{10000};  // from just before the first post()
  std::string note;
};

struct Outcome {
  std::vector<Status> posted;         // post()'s status, per batch
  Status noted;                       // notify()'s (OK when there was no note)
  std::vector<Status> completed;      // per batch: its completion; kInternal "none" for a batch
                                      // refused by post() or whose completion never came
  int stray_completions = 0;          // completions of batches post() refused (must stay 0)
  std::chrono::milliseconds took{0};  // from the first post() to the last completion
};

class Side {
 public:
  // Starts the initiator or the target side of `backend` and waits (bounded) for its hello.
  static Result<std::unique_ptr<Side>> Start(const Backend& backend, bool initiator, uint64_t bytes,
                                             int seed);
  ~Side();
  Side(const Side&) = delete;
  Side& operator=(const Side&) = delete;

  // Connects to `target` and imports its region: the peer and remote every script names.
  Status Connect(const Side& target);

  // Posts `script` (see Script) and returns the post() and notify() statuses once they all
  // returned, without waiting for completions; Wait() then returns the whole outcome. The side
  // serves nothing else in between.
  Result<Outcome> Post(const Script& script);
  Result<Outcome> Wait();
  Result<Outcome> Run(const Script& script);

  // The memory as it was when notification `note` was delivered (waits for it, bounded).
  Result<std::vector<uint8_t>> SnapshotAt(const std::string& note);
  // The notifications delivered so far, in delivery order.
  Result<std::vector<std::string>> Notes();
  // The steps the side's transport reported so far (TransportOptions::trace), "event id" each,
  // in the order reported; empty for a backend that reports none.
  Result<std::vector<std::string>> Trace();
  // The memory now.
  Result<std::vector<uint8_t>> Dump();

  // The peer dies: a child is SIGKILLed; a thread destroys its registration and transport (its
  // memory stays until the side goes, so nothing a late copy does is undefined).
  Status Kill();

  // Ends the side as ~Side does (its transport is destroyed) and says how that went: OK where the
  // side returned 0, else its exit code or the signal it died of (a completion run twice or on
  // a finished batch, a crash in the transport's teardown). Call nothing else afterwards.
  Status Exit();

 private:
  Side() = default;
  Result<std::string> Call(const std::string& command);
  Result<std::vector<std::string>> List(uint32_t verb);  // Notes(), Trace()
  Result<std::string> Receive();

  std::unique_ptr<ChildProcess> process_;  // kProcesses
  std::unique_ptr<Channel> channel_;       // kThreads: our end
  std::thread thread_;                     // kThreads: runs the side
  int thread_code_ = 0;                    // kThreads: what the side returned, once joined
  std::string address_;
  std::string descriptor_;
};

}  // namespace kv::transport::conformance
