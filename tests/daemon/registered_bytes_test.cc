// Issue 19's cap on the bytes one engine instance registers (DaemonOptions::max_registered_bytes,
// `kvd --max-registered-bytes`): across an instance's ranks, a registration past the cap is
// refused with kResourceExhausted naming the flag, counted in the status, and another instance
// keeps its own allowance.
#include <gtest/gtest.h>

#include <thread>

#include "connector/connector.h"
#include "daemon/daemon.h"

namespace kv {
namespace {

using connector::Connector;

// 2 layers × 8 blocks × 16 tokens × 2 heads × 64 bytes = 32 KiB, dense LBNHC.
LayoutSpec Cache(int tp_rank, int tp_size) {
  LayoutSpec spec;
  spec.layers = 2;
  spec.blocks = 8;
  spec.heads = 2;
  spec.block_size = 16;
  spec.content_bytes = 64;
  spec.tp_rank = tp_rank;
  spec.tp_size = tp_size;
  return spec;
}
constexpr uint64_t kCacheBytes = 2 * 8 * 16 * 2 * 64;

std::shared_ptr<daemon::Daemon> StartDaemon(uint64_t max_registered_bytes) {
  daemon::DaemonOptions options;
  options.name = "d";
  options.listen = "";
  options.transport_name = "local";
  options.max_registered_bytes = max_registered_bytes;
  auto d = daemon::Daemon::Start(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : nullptr;
}

Status Register(Connector& engine, const LayoutSpec& spec) {
  return engine.RegisterKvCaches(connector::HostCaches({&spec, 1})).status();
}

TEST(RegisteredBytes, AnInstancePastItsCapIsRefusedAndAnotherKeepsItsOwn) {
  // Room for one and a half caches per instance.
  auto d = StartDaemon(kCacheBytes * 3 / 2);
  ASSERT_TRUE(d);
  const auto timeout = std::chrono::milliseconds(5000);
  auto rank0 = Connector::OpenEmbedded(d, {"llama", 0, 2, timeout});
  auto rank1 = Connector::OpenEmbedded(d, {"llama", 1, 2, timeout});
  auto other = Connector::OpenEmbedded(d, {"mistral", 0, 1, timeout});
  ASSERT_TRUE(rank0.ok() && rank1.ok() && other.ok());

  ASSERT_TRUE(Register(**rank0, Cache(0, 2)).ok());
  Status refused = Register(**rank1, Cache(1, 2));  // the instance's second cache: over the cap
  EXPECT_EQ(refused.code(), Code::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("--max-registered-bytes"), std::string::npos)
      << refused.ToString();
  EXPECT_NE(refused.message().find("llama"), std::string::npos) << refused.ToString();
  EXPECT_TRUE(Register(**other, Cache(0, 1)).ok());  // per instance: mistral has its own

  proto::DaemonStatus s = d->Snapshot();
  EXPECT_EQ(s.max_registered_bytes(), kCacheBytes * 3 / 2);
  EXPECT_EQ(s.registrations_refused(), 1u);
  ASSERT_EQ(s.instances_size(), 2);
  EXPECT_EQ(s.instances(0).instance(), "llama");
  EXPECT_EQ(s.instances(0).engines(), 2u);
  EXPECT_EQ(s.instances(0).registered_bytes(), kCacheBytes);
  EXPECT_EQ(s.instances(1).instance(), "mistral");
  EXPECT_EQ(s.instances(1).registered_bytes(), kCacheBytes);

  // The refused rank's connection still works: once rank 0 leaves, its bytes are free again.
  rank0->reset();
  for (int i = 0; i < 500 && d->Snapshot().instances(0).engines() != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(Register(**rank1, Cache(1, 2)).ok());
}

TEST(RegisteredBytes, KvdTakesTheFlagWithASuffixAndRefusesNonsense) {
  daemon::DaemonOptions zero;
  zero.listen = "";
  zero.transport_name = "local";
  zero.max_registered_bytes = 0;
  EXPECT_EQ(daemon::Daemon::Start(std::move(zero)).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kv
