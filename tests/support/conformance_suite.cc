// The cases of the transport conformance suite (see conformance_suite.h); every binary that
// instantiates TransportConformance compiles this file.
#include "tests/support/conformance_suite.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kv::transport::conformance {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMiB = 1 << 20;
constexpr int kSeed = 7;
// The regions: a source of 4 MiB, a destination of 8 MiB (a channel answer holds 16 MiB at most).
constexpr uint64_t kSource = 4 * kMiB;
constexpr uint64_t kDestination = 8 * kMiB;
// How long past a batch's deadline its failure may come, and how long post() and notify() may
// take (they only queue work).
constexpr auto kSlack = 5s;

// Runs from a kSource region into a kDestination one, none adjacent to another on either side
// (so nothing merges and every gap is checked): 1000 runs of 700 bytes at odd offsets, one byte,
// and two runs of 1 MiB + 3 bytes.
std::vector<kv::Run> MixedRuns() {
  std::vector<kv::Run> runs;
  for (uint64_t i = 0; i < 1000; ++i) runs.push_back({i * 701 + 1, i * 1000 + 3, 700});
  runs.push_back({kMiB - 1, 1'100'000, 1});
  runs.push_back({kMiB + 5, 4 * kMiB + 5, kMiB + 3});
  runs.push_back({2 * kMiB + 16, 6 * kMiB, kMiB + 3});
  return runs;
}

Script Batches(Op op, std::vector<std::vector<kv::Run>> batches, std::string note = {},
               std::chrono::milliseconds deadline = 10s) {
  Script s;
  s.op = op;
  s.batches = std::move(batches);
  s.note = std::move(note);
  s.deadline = deadline;
  return s;
}

// Empty when equal, else where they first differ and how many bytes do.
std::string Difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size())
    return "size " + std::to_string(got.size()) + ", expected " + std::to_string(want.size());
  uint64_t first = got.size(), count = 0;
  for (uint64_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      first = std::min(first, i);
      ++count;
    }
  }
  if (count == 0) return {};
  return std::to_string(count) + " bytes differ, the first at " + std::to_string(first) + " (got " +
         std::to_string(got[first]) + ", expected " + std::to_string(want[first]) + ")";
}

void ExpectHolds(Side& side, const std::vector<uint8_t>& want, const std::string& what) {
  auto bytes = side.Dump();
  ASSERT_TRUE(bytes.ok()) << what << ": " << bytes.status().ToString();
  EXPECT_EQ(Difference(*bytes, want), "") << what;
}

// Every batch posted, the note sent, every batch completed OK, each completion called once.
void ExpectAllLanded(const Result<Outcome>& outcome) {
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  for (size_t i = 0; i < outcome->posted.size(); ++i)
    EXPECT_TRUE(outcome->posted[i].ok()) << "batch " << i << ": " << outcome->posted[i].ToString();
  EXPECT_TRUE(outcome->noted.ok()) << outcome->noted.ToString();
  for (size_t i = 0; i < outcome->completed.size(); ++i) {
    EXPECT_TRUE(outcome->completed[i].ok())
        << "batch " << i << ": " << outcome->completed[i].ToString();
  }
  EXPECT_EQ(outcome->stray_completions, 0) << "a completion ran more than once";
}

bool IsPeerFailure(const Status& s) {
  return s.code() == Code::kUnavailable || s.code() == Code::kTimeout;
}

}  // namespace

void TransportConformance::SetUp() {
  backend_ = GetParam();
  if (backend_.unavailable != nullptr) {
    const std::string why = backend_.unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  auto info = DescribeTransport(backend_.transport);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  if (!info->takes("socket_dir")) return;
  // Short (unix socket paths are limited) and unique per test process.
  socket_dir_ = std::filesystem::temp_directory_path() / ("kvd-conf-" + std::to_string(::getpid()));
  std::filesystem::create_directories(socket_dir_);
  backend_.settings.emplace_back("socket_dir", socket_dir_.string());
}

void TransportConformance::TearDown() {
  initiator.reset();  // both sides gone (a child process reaped) before their sockets' directory
  target.reset();
  if (!socket_dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(socket_dir_, ignored);
  }
}

void TransportConformance::StartPair(uint64_t initiator_bytes, int initiator_seed,
                                     uint64_t target_bytes, int target_seed) {
  auto t = Side::Start(backend_, /*initiator=*/false, target_bytes, target_seed);
  ASSERT_TRUE(t.ok()) << "target: " << t.status().ToString();
  target = std::move(*t);
  auto i = Side::Start(backend_, /*initiator=*/true, initiator_bytes, initiator_seed);
  ASSERT_TRUE(i.ok()) << "initiator: " << i.status().ToString();
  initiator = std::move(*i);
  Status connected = initiator->Connect(*target);
  ASSERT_TRUE(connected.ok()) << connected.ToString();
}

TEST_P(TransportConformance, PutLandsExactlyTheRunsAndNothingElse) {
  ASSERT_NO_FATAL_FAILURE(StartPair(kSource, kSeed, kDestination, -1));
  const auto runs = MixedRuns();
  ASSERT_NO_FATAL_FAILURE(ExpectAllLanded(initiator->Run(Batches(Op::kPut, {runs}))));
  ExpectHolds(*target, Landed(Pattern(kDestination, -1), kSeed, runs), "target");
  ExpectHolds(*initiator, Pattern(kSource, kSeed), "initiator (the put's source)");
}

TEST_P(TransportConformance, GetLandsExactlyTheRunsAndNothingElse) {
  ASSERT_NO_FATAL_FAILURE(StartPair(kDestination, -1, kSource, kSeed));
  const auto runs = MixedRuns();  // src_offset in the target's region, dst_offset here
  ASSERT_NO_FATAL_FAILURE(ExpectAllLanded(initiator->Run(Batches(Op::kGet, {runs}))));
  ExpectHolds(*initiator, Landed(Pattern(kDestination, -1), kSeed, runs), "initiator");
  ExpectHolds(*target, Pattern(kSource, kSeed), "target (the get's source)");
}

// Each note is sent right after its batches were posted, before any completed; the target
// copies its memory the moment the note is delivered.
TEST_P(TransportConformance, NotificationIsDeliveredOnlyAfterTheDataPostedBeforeIt) {
  ASSERT_NO_FATAL_FAILURE(StartPair(kSource, kSeed, kDestination, -1));
  const auto runs = MixedRuns();
  const std::vector<kv::Run> first_half(runs.begin(), runs.begin() + 500);
  const std::vector<kv::Run> second_half(runs.begin() + 500, runs.end() - 2);
  const std::vector<kv::Run> first_large = {runs[runs.size() - 2]};
  const std::vector<kv::Run> second_large = {runs.back()};
  ASSERT_NO_FATAL_FAILURE(
      ExpectAllLanded(initiator->Run(Batches(Op::kPut, {first_half, second_half}, "first"))));
  ASSERT_NO_FATAL_FAILURE(
      ExpectAllLanded(initiator->Run(Batches(Op::kPut, {first_large, second_large}, "second"))));

  // At "first" the small runs had landed (the large ones may have begun to: they were posted
  // once the first batches completed, maybe before "first" was delivered).
  auto at_first = target->SnapshotAt("first");
  ASSERT_TRUE(at_first.ok()) << at_first.status().ToString();
  std::vector<kv::Run> small = first_half;
  small.insert(small.end(), second_half.begin(), second_half.end());
  const auto want_small = Landed(Pattern(kDestination, -1), kSeed, small);
  for (size_t i = 0; i < small.size(); ++i) {
    const kv::Run& r = small[i];
    ASSERT_TRUE(std::equal(want_small.begin() + r.dst_offset,
                           want_small.begin() + r.dst_offset + r.length,
                           at_first->begin() + r.dst_offset))
        << "run " << i << " had not landed when the note behind it was delivered";
  }
  auto at_second = target->SnapshotAt("second");
  ASSERT_TRUE(at_second.ok()) << at_second.status().ToString();
  EXPECT_EQ(Difference(*at_second, Landed(Pattern(kDestination, -1), kSeed, runs)), "")
      << "the memory when \"second\" was delivered";
  auto notes = target->Notes();
  ASSERT_TRUE(notes.ok()) << notes.status().ToString();
  EXPECT_EQ(*notes, (std::vector<std::string>{"first", "second"}));
}

// A backend that reports its steps (TransportOptions::trace; kvd logs them at debug level)
// reports each batch's in the order they happen on the batch's own thread, and every batch it
// took ends in a completion step. The others report none.
TEST_P(TransportConformance, TracedStepsOfEachBatchComeInOrder) {
  ASSERT_NO_FATAL_FAILURE(StartPair(kSource, kSeed, kDestination, -1));
  const auto runs = MixedRuns();
  const std::vector<kv::Run> first(runs.begin(), runs.begin() + 500);
  const std::vector<kv::Run> second(runs.begin() + 500, runs.end());
  ASSERT_NO_FATAL_FAILURE(ExpectAllLanded(initiator->Run(Batches(Op::kPut, {first, second}))));
  auto trace = initiator->Trace();
  ASSERT_TRUE(trace.ok()) << trace.status().ToString();
  if (!GetParam().traces_steps) {
    EXPECT_TRUE(trace->empty()) << "steps reported by a backend not known to report them";
    return;
  }
  ASSERT_FALSE(trace->empty()) << "no steps reported";
  // Per batch: the position of each step in the report.
  std::map<std::string, std::map<std::string, size_t>> steps;
  for (size_t i = 0; i < trace->size(); ++i) {
    const std::string& line = (*trace)[i];
    const size_t space = line.find(' ');
    ASSERT_NE(space, std::string::npos) << line;
    steps[line.substr(space + 1)].emplace(line.substr(0, space), i);
  }
  // Each sequence: steps one thread reports one after the other; the last one is the completion.
  const std::vector<std::vector<std::string>> orders = {{"n_take", "n_announced", "n_enqueued"},
                                                        {"n_take", "n_acked"},
                                                        {"i_take", "i_launched", "i_done"},
                                                        {"i_launched", "i_done"}};
  size_t completed = 0;
  for (const auto& [batch, at] : steps) {
    for (const auto& [step, where] : at) {
      EXPECT_TRUE(step == "n_take" || step == "n_announced" || step == "n_enqueued" ||
                  step == "n_acked" || step == "i_take" || step == "i_launched" || step == "i_done")
          << "batch " << batch << ": unknown step " << step;
    }
    for (const auto& order : orders) {
      for (size_t k = 1; k < order.size(); ++k) {
        if (!at.count(order[k - 1]) || !at.count(order[k])) continue;
        EXPECT_LT(at.at(order[k - 1]), at.at(order[k]))
            << "batch " << batch << ": " << order[k - 1] << " after " << order[k];
      }
    }
    const bool taken = at.count("n_take") || at.count("i_launched");
    const bool done = at.count("n_acked") || at.count("i_done");
    EXPECT_EQ(taken, done) << "batch " << batch << " was taken and never completed, or the reverse";
    completed += done;
  }
  EXPECT_GE(completed, 1u) << "steps were reported, but no batch's completion";
}

// Each refused batch also holds a run inside both regions, at a place of its own: had any part
// of it been posted, that run would show.
TEST_P(TransportConformance, OutOfRangeRunIsRefusedWithNothingPosted) {
  ASSERT_NO_FATAL_FAILURE(StartPair(kSource, kSeed, kDestination, -1));
  const std::vector<std::vector<kv::Run>> puts = {
      {{0, 0, 4096}, {0, kDestination - 100, 101}},     // past the remote end by one byte
      {{0, 8192, 4096}, {kSource - 100, 16384, 101}},   // past the local end by one byte
      {{0, 24576, 4096}, {0, UINT64_MAX - 10, 20}},     // wraps around on the remote
      {{0, 32768, 4096}, {UINT64_MAX - 10, 40960, 20}}  // wraps around here
  };
  // Then one in range: batches go in order on most backends, so once it completed a refused
  // batch that had been posted after all would mostly have landed too.
  const std::vector<kv::Run> good = {{0, 2 * kMiB, 4096}};
  auto batches = puts;
  batches.push_back(good);
  auto put = initiator->Run(Batches(Op::kPut, batches));
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  for (size_t i = 0; i < puts.size(); ++i) {
    EXPECT_EQ(put->posted[i].code(), Code::kOutOfRange)
        << "put " << i << ": " << put->posted[i].ToString();
  }
  ASSERT_TRUE(put->posted.back().ok()) << put->posted.back().ToString();
  EXPECT_TRUE(put->completed.back().ok()) << put->completed.back().ToString();
  EXPECT_EQ(put->stray_completions, 0) << "a refused batch's completion ran";

  const std::vector<std::vector<kv::Run>> gets = {
      {{0, 0, 4096}, {kDestination - 100, 8192, 101}},  // past the remote end
      {{0, 16384, 4096}, {0, kSource - 100, 101}},      // past the local end
  };
  const std::vector<kv::Run> good_get = {{8 * 4096, kSource - 4096, 4096}};
  batches = gets;
  batches.push_back(good_get);
  auto get = initiator->Run(Batches(Op::kGet, batches));
  ASSERT_TRUE(get.ok()) << get.status().ToString();
  for (size_t i = 0; i < gets.size(); ++i) {
    EXPECT_EQ(get->posted[i].code(), Code::kOutOfRange)
        << "get " << i << ": " << get->posted[i].ToString();
  }
  ASSERT_TRUE(get->posted.back().ok()) << get->posted.back().ToString();
  EXPECT_TRUE(get->completed.back().ok()) << get->completed.back().ToString();
  EXPECT_EQ(get->stray_completions, 0) << "a refused batch's completion ran";

  // Only the good batches wrote: the put into the target, the get (kUntouched bytes) here.
  std::vector<uint8_t> target_want = Pattern(kDestination, -1);
  target_want = Landed(std::move(target_want), kSeed, good);
  ExpectHolds(*target, target_want, "target");
  std::vector<uint8_t> initiator_want = Pattern(kSource, kSeed);
  std::fill(initiator_want.end() - 4096, initiator_want.end(), kUntouched);
  ExpectHolds(*initiator, initiator_want, "initiator");
}

TEST_P(TransportConformance, DeadPeerFailsPendingAndLaterBatchesInBoundedTime) {
  ASSERT_NO_FATAL_FAILURE(StartPair(kSource, kSeed, kDestination, -1));
  ASSERT_NO_FATAL_FAILURE(
      ExpectAllLanded(initiator->Run(Batches(Op::kPut, {{{0, 0, 4096}}}))));  // the path works

  // A gigabyte of puts queued, then the target dies while they are in flight.
  const auto deadline = 5s;
  const std::vector<std::vector<kv::Run>> pending(256, std::vector<kv::Run>{{0, 0, kSource}});
  auto posted = initiator->Post(Batches(Op::kPut, pending, {}, deadline));
  ASSERT_TRUE(posted.ok()) << posted.status().ToString();
  for (const Status& s : posted->posted) ASSERT_TRUE(s.ok()) << s.ToString();
  Status killed = target->Kill();
  ASSERT_TRUE(killed.ok()) << killed.ToString();
  auto outcome = initiator->Wait();
  ASSERT_TRUE(outcome.ok()) << outcome.status().ToString();
  int failed = 0;
  for (const Status& s : outcome->completed) {
    ASSERT_NE(s.code(), Code::kInternal) << "a batch never completed: " << s.ToString();
    if (!s.ok()) {
      ++failed;
      EXPECT_TRUE(IsPeerFailure(s)) << s.ToString();
    }
  }
  EXPECT_EQ(outcome->stray_completions, 0);
  EXPECT_LE(outcome->took, deadline + kSlack) << "the pending batches failed late";
  if (GetParam().kill_outpaces_data) {
    EXPECT_GT(failed, 0) << "every batch of a gigabyte landed before the kill";
  }
  RecordProperty("pending_failed", failed);

  // Later batches and notifications: post() and notify() return at once; the batch fails (at
  // post() or by its completion) within its deadline and the slack.
  const auto later_deadline = 2s;
  const auto start = std::chrono::steady_clock::now();
  auto later = initiator->Post(Batches(Op::kPut, {{{0, 0, 4096}}}, "after", later_deadline));
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_LE(std::chrono::steady_clock::now() - start, kSlack) << "post() or notify() blocked";
  auto later_done = initiator->Wait();
  ASSERT_TRUE(later_done.ok()) << later_done.status().ToString();
  const Status& post = later->posted.front();
  const Status& done = later_done->completed.front();
  if (post.ok()) {
    EXPECT_TRUE(IsPeerFailure(done)) << "a batch to a dead peer completed with " << done.ToString();
    EXPECT_LE(later_done->took, later_deadline + kSlack);
  } else {
    EXPECT_TRUE(IsPeerFailure(post)) << "post() to a dead peer: " << post.ToString();
  }
  // Its transport's teardown neither hangs nor runs a completion of a batch already finished
  // (ucx_shm did, where a loaded machine let some puts move before the kill: UCX called back at
  // ucp_worker_destroy flushes that its force close had not).
  Status exited = initiator->Exit();
  EXPECT_TRUE(exited.ok()) << "the initiator: " << exited.ToString();
}

}  // namespace kv::transport::conformance
