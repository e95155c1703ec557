// P/D between two kvd processes (build/bin/kvd --transport host_ipc): each maps the other's
// engines' memfds and moves runs with one memcpy each. Push and pull, TP and layout conversion,
// every byte verified; a prefill kvd SIGKILLed mid-run fails its requests and the decode kvd
// serves a fresh one.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>

#include "protocol/kvd.pb.h"
#include "tools/kvbench/pd/pd_sim.h"
#include "tools/testing/kvd_process.h"

namespace kv {
namespace {

using connector::Connector;
using connector::ConnectorOptions;
using connector::PdConfig;

PdConfig Small() {
  PdConfig c;
  c.requests = 6;
  c.window = 3;
  c.tokens = 72;
  c.layers = 4;
  c.heads = 4;
  c.head_dim = 32;
  c.timeout = std::chrono::milliseconds(10000);
  return c;
}

class PdHostIpc : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvd-hipc-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    prefill_.reset();
    decode_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<kv::harness::KvdProcess> Spawn(const std::string& name) {
    kv::harness::KvdProcess::Options o;
    o.binary = kv::harness::KvdBesideSelf();
    o.name = name;
    o.socket_path = (dir_ / (name + ".sock")).string();
    o.transport = "host_ipc";
    o.extra_args = {"--log-level", "warn", "--lease-ms", "10000", "--heartbeat-ms", "200"};
    o.forward_output = true;
    auto p = kv::harness::KvdProcess::Start(o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }

  Result<connector::PdResult> Run(const PdConfig& c,
                                  const std::function<void(int, int)>& progress = nullptr) {
    const std::string p = prefill_->socket_path(), d = decode_->socket_path();
    return connector::RunPd(
        c, [p](const ConnectorOptions& o) { return Connector::Open(p, o); },
        [d](const ConnectorOptions& o) { return Connector::Open(d, o); }, progress);
  }

  void KillPrefillMidRunThenRunAgain(connector::Mode mode);

  std::filesystem::path dir_;
  std::unique_ptr<kv::harness::KvdProcess> prefill_, decode_;
};

TEST_F(PdHostIpc, PushTp2To1ConvertingLayoutAndBlockSize) {
  prefill_ = Spawn("prefill");
  decode_ = Spawn("decode");
  ASSERT_TRUE(prefill_ && decode_);
  PdConfig c = Small();
  c.prefill_tp = 2;
  c.decode_order = "BLHNC";
  c.decode_block_size = 32;
  auto r = Run(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->verified, c.requests) << r->first_error;
  EXPECT_EQ(r->guard_bytes_written, 0u);
  auto status =
      connector::QueryDaemonStatus(prefill_->socket_path(), std::chrono::milliseconds(2000));
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(status->transport(), "host_ipc");
  EXPECT_EQ(status->transfers_failed(), 0u);
  auto code = prefill_->Stop(std::chrono::milliseconds(5000));
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0);  // SIGTERM drains and exits cleanly
}

TEST_F(PdHostIpc, PullTp1To2Mla) {
  prefill_ = Spawn("prefill");
  decode_ = Spawn("decode");
  ASSERT_TRUE(prefill_ && decode_);
  PdConfig c = Small();
  c.mode = connector::Mode::kPull;
  c.decode_tp = 2;
  c.mla = true;
  auto r = Run(c);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->verified, c.requests) << r->first_error;
  EXPECT_EQ(r->guard_bytes_written, 0u);
}

// A prefill kvd SIGKILLed in the middle of a run: its requests fail, nothing outside their blocks
// is written, and the decode kvd serves a fresh prefill kvd's next run. Pulling, the decode kvd
// holds mappings of the dead kvd's engines' memfds: they stay valid (no SIGBUS) until let go.
void PdHostIpc::KillPrefillMidRunThenRunAgain(connector::Mode mode) {
  prefill_ = Spawn("prefill");
  decode_ = Spawn("decode");
  ASSERT_TRUE(prefill_ && decode_);
  PdConfig c = Small();
  c.mode = mode;
  c.requests = 40;
  c.window = 2;
  c.layers = 16;
  c.tokens = 512;
  c.timeout = std::chrono::milliseconds(8000);
  std::atomic<bool> killed{false};
  const pid_t victim = prefill_->pid();
  auto r = Run(c, [&](int done, int) {
    if (done >= 2 && !killed.exchange(true)) {
      std::thread([victim] {
        std::this_thread::sleep_for(std::chrono::milliseconds(3));
        kill(victim, SIGKILL);
      }).detach();
    }
  });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(killed);
  EXPECT_GT(r->failed, 0);
  EXPECT_FALSE(r->first_error.empty());
  EXPECT_EQ(r->guard_bytes_written, 0u);
  prefill_->Kill();  // reap

  ASSERT_TRUE(decode_->running());
  prefill_ = Spawn("prefill2");
  ASSERT_TRUE(prefill_);
  PdConfig next = Small();
  next.mode = mode;
  auto again = Run(next);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->verified, next.requests) << again->first_error;
}

TEST_F(PdHostIpc, PrefillKvdKilledMidPushFailsRequestsAndDecodeServesTheNextRun) {
  KillPrefillMidRunThenRunAgain(connector::Mode::kPush);
}

TEST_F(PdHostIpc, PrefillKvdKilledMidPullFailsRequestsAndDecodeServesTheNextRun) {
  KillPrefillMidRunThenRunAgain(connector::Mode::kPull);
}

}  // namespace
}  // namespace kv
