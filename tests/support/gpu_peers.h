// Two-process harness for the GPU transport tests: forked children that each own a CUDA device,
// a transport and one registered buffer, driven by the test process over a ChildProcess channel.
//
// The test process never initialises CUDA itself (a process that did cannot fork children that
// use it): even the device count is asked of a child. Every wait is bounded; ~ChildProcess kills
// and reaps children on every path.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "layout/kv_region.h"
#include "layout/plan.h"
#include "tools/testing/child_process.h"

namespace kv::transport::gputest {

using harness::Channel;
using harness::ChildProcess;

// CUDA devices visible to a child process; 0 when CUDA is missing or fails.
int DeviceCount();

// What a child sets up: `bytes` of device memory on `device`, filled with PatternByte(i, seed)
// when seed ≥ 0 and with kUntouched otherwise, registered with `backend`.
struct SideSpec {
  std::string backend;
  int device = 0;
  uint64_t bytes = 0;
  int seed = -1;
};

// Transport settings a child adds to the harness's own (64 KiB staging, 20 s timeouts).
using Settings = std::vector<std::pair<std::string, std::string>>;

inline constexpr uint8_t kUntouched = 0xEE;
uint8_t PatternByte(uint64_t i, int seed);

// A running child and what it announced.
struct Peer {
  std::unique_ptr<ChildProcess> process;
  std::string address;
  std::string descriptor;
};

// Starts a child that serves the commands below for its buffer.
Result<Peer> StartPeer(const SideSpec& spec, const Settings& settings = {});

struct TransferOptions {
  std::string note;               // sent to the target after the batch when not empty
  bool wait_for_dead = false;     // first poll until the mover's transport sees the target gone
  std::string forged_descriptor;  // imported instead of the target's when not empty
  // Post through kvd's event gate (daemon/event_gate.h) with an event the mover holds unfired;
  // the mover checks the batch does not complete before it releases the event.
  bool gated = false;
  // Gated only: how many batches of `runs` to post behind the one event, and whether `note`
  // goes while the event is held (else after the batches complete). Every post and the notify
  // must return within kPromptPost while the event is held, whatever the earlier batches wait on.
  int gated_batches = 1;
  bool note_while_gated = false;
  bool expired = false;  // the batch's deadline passed before it is posted
  // Gated only: the mover disconnects the target while the event is held. The batches, held
  // for their event and never launched, must fail with kAborted before it fires.
  bool disconnect_while_gated = false;
  // Instead of the above: one batch of `runs` waits in the event gate for an event held past
  // its deadline (an engine that died mid-layer), and the first half of `runs` (rounded up) is
  // posted beside it; the second must land and the first fail with kTimeout while the event is
  // held. Only the half is written.
  bool never_fires = false;
  // The runs posted as run groups (layout/plan.h GroupRuns) where the mover's backend takes them,
  // and with as_blocks those groups joined into blocks (JoinGroups) where it takes those, as
  // kvd plans for it (transport::PlanEntriesFor).
  bool as_groups = false;
  bool as_blocks = false;
};

inline constexpr auto kPromptPost = std::chrono::milliseconds(500);

// Tells `mover` to connect to `target` (cached per address), import its descriptor and post one
// batch of `runs` (kPut: local → target; kGet: target → local) and wait for it. Returns the
// status the mover saw (the post's, or the completion's).
Status Transfer(Peer& mover, const Peer& target, Op op, const std::vector<Run>& runs,
                const TransferOptions& options = {});

// Waits (bounded) until the child received notification `text`.
Status WaitForNote(Peer& peer, const std::string& text);

// A notification whose text starts with kSnapshotPrefix makes the receiving child copy its
// buffer from its handler, the moment the note is delivered; SnapshotAtNote waits (bounded) for
// the note and returns that copy. So a test sees what had landed when the note arrived.
inline constexpr std::string_view kSnapshotPrefix = "snap:";
Result<std::vector<uint8_t>> SnapshotAtNote(Peer& peer, const std::string& text);

// The child's buffer, copied to the host.
Result<std::vector<uint8_t>> Dump(Peer& peer);

// Asks the child to exit and reaps it.
Status Stop(Peer& peer);

// The buffer a destination holds after `runs` copied from a PatternByte(seed) source into a
// kUntouched one of `bytes`.
std::vector<uint8_t> Expected(uint64_t bytes, int src_seed, const std::vector<Run>& runs);

// The plan of `tokens` tokens from random blocks of `src` to random blocks of `dst` (16-token
// blocks on both sides), with the byte spans of both regions.
struct Planned {
  uint64_t src_bytes = 0;
  uint64_t dst_bytes = 0;
  std::vector<Run> runs;
};
Planned PlanRandomBlocks(const LayoutSpec& src, const LayoutSpec& dst, int64_t tokens);

// What an engine killed mid-layer must leave: the link warmed with the first half of p.runs,
// then all of them posted behind an event that fires only past their deadline, beside that half
// posted plainly (TransferOptions::never_fires): the half lands, the held batch fails with
// kTimeout, and afterwards the receiver holds the half alone. gtest assertions.
void ExpectTheHeldBatchWritesNothing(Peer& sender, Peer& receiver, const Planned& p, int seed);

}  // namespace kv::transport::gputest
