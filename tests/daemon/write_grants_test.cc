// The destination side's write grants (daemon/write_grants.h, issue 19): the byte ranges of a
// request's blocks in every physical order (each block's every byte inside, no other block's
// byte), and P/D over ucx's checked put path (put messages, tcp) where the decode kvd guards its
// regions: every byte of every layout still lands (the grants cover all the source writes), and
// every grant made for a Want is revoked when its request ends.
#include "daemon/write_grants.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "daemon/daemon.h"
#include "tests/support/forwarding_transport.h"
#include "tools/kvbench/pd/pd_sim.h"

namespace kv::daemon {
namespace {

using transport::Transport;

LayoutSpec Spec(const std::string& order) {
  LayoutSpec spec;
  spec.order = order;
  spec.layers = 3;
  spec.blocks = 7;
  spec.heads = 2;
  spec.block_size = 4;
  spec.content_bytes = 8;
  return spec;
}

bool Inside(const std::vector<Transport::WriteRange>& ranges, uint64_t byte) {
  for (const auto& r : ranges) {
    if (byte >= r.offset && byte < r.offset + r.length) return true;
  }
  return false;
}

// Every content byte of a chosen block is granted; none of another block's is.
TEST(BlockWriteRanges, CoverTheBlocksAndNothingElseInEveryOrder) {
  for (const std::string order :
       {"LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC", "SBNHC", "BSNHC"}) {
    auto region = KvRegion::Create(Spec(order));
    ASSERT_TRUE(region.ok()) << order << ": " << region.status().ToString();
    const std::vector<int64_t> chosen = {5, 1, 2};
    const auto ranges = BlockWriteRanges(*region, chosen);
    for (size_t i = 1; i < ranges.size(); ++i) {
      EXPECT_GT(ranges[i].offset, ranges[i - 1].offset + ranges[i - 1].length)
          << order << ": not sorted and merged";
    }
    const int64_t kv_values = region->has_kv_axis() ? 2 : 1;
    for (int64_t l = 0; l < 3; ++l) {
      for (int64_t b = 0; b < 7; ++b) {
        const bool want = std::find(chosen.begin(), chosen.end(), b) != chosen.end();
        for (int64_t h = 0; h < 2; ++h) {
          for (int64_t n = 0; n < 4; ++n) {
            for (int64_t s = 0; s < kv_values; ++s) {
              const uint64_t at = region->offset(l, b, h, n, s);
              for (uint64_t c = 0; c < static_cast<uint64_t>(region->size(Axis::kC)); ++c) {
                ASSERT_EQ(Inside(ranges, at + c), want)
                    << order << " l" << l << " b" << b << " h" << h << " n" << n << " s" << s;
              }
            }
          }
        }
      }
    }
  }
}

TEST(BlockWriteRanges, ContiguousBlocksOfALayerMergeIntoOneRange) {
  auto region = KvRegion::Create(Spec("LBNHC"));
  ASSERT_TRUE(region.ok());
  const std::vector<int64_t> blocks = {2, 3, 4};
  const auto ranges = BlockWriteRanges(*region, blocks);
  ASSERT_EQ(ranges.size(), 3u);  // one per layer
  EXPECT_EQ(ranges[0].offset, region->page_offset(0, 2));
  EXPECT_EQ(ranges[0].length, 3 * region->page_bytes());
}

// Records the grants the decode kvd makes and revokes, forwarding to ucx.
class GrantSpy : public testing::ForwardingTransport {
 public:
  using ForwardingTransport::ForwardingTransport;
  Status grant_writes(uint64_t grant, transport::PeerId peer,
                      const transport::MemoryRegistration& memory,
                      std::span<const WriteRange> ranges) override {
    {
      std::lock_guard lock(mu);
      granted.insert(grant);
    }
    if (grant_nothing) return ForwardingTransport::grant_writes(grant, peer, memory, {});
    return ForwardingTransport::grant_writes(grant, peer, memory, ranges);
  }
  void revoke_writes(uint64_t grant) override {
    {
      std::lock_guard lock(mu);
      revoked.insert(grant);
    }
    ForwardingTransport::revoke_writes(grant);
  }
  std::mutex mu;
  std::set<uint64_t> granted, revoked;
  bool grant_nothing = false;  // a decode kvd that grants no range: every put must be refused
};

constexpr std::chrono::milliseconds kLease{10000};
const transport::TransportOptions kAmPuts{{{"UCX_TLS", "tcp"}, {"put_path", "am"}}};

std::shared_ptr<Daemon> Start(const std::string& name, std::unique_ptr<Transport> transport) {
  DaemonOptions options;
  options.name = name;
  options.socket_path = "";
  options.lease = kLease;
  options.transport = std::move(transport);
  auto d = Daemon::Start(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : nullptr;
}

// The decode kvd's status once it holds no load and has ended (failed or done) at least one per
// grant the spy saw made, or once the lease (plus slack) is over: a load always ends by then.
proto::DaemonStatus WaitForLoadsToEnd(Daemon& decode, GrantSpy& spy) {
  const auto deadline = std::chrono::steady_clock::now() + kLease + std::chrono::seconds(5);
  for (;;) {
    proto::DaemonStatus status = decode.Snapshot();
    size_t grants = 0;
    {
      std::lock_guard lock(spy.mu);
      grants = spy.granted.size();
    }
    // A stale snapshot (Daemon::Snapshot on a slow io thread) counts no ended load.
    const bool ended = status.transfers_in_flight() == 0 &&
                       status.transfers_done() + status.transfers_failed() >= grants;
    if (ended || std::chrono::steady_clock::now() > deadline) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

class GrantedPd : public ::testing::TestWithParam<std::string> {};

TEST_P(GrantedPd, EveryByteLandsThroughTheGrantsAndEveryGrantIsRevoked) {
  auto source_transport = transport::CreateTransport("ucx", kAmPuts);
  auto sink_transport = transport::CreateTransport("ucx", kAmPuts);
  if (!source_transport.ok() && source_transport.status().code() == Code::kUnsupported) {
    GTEST_SKIP() << "this build has no ucx transport";
  }
  ASSERT_TRUE(source_transport.ok() && sink_transport.ok());
  auto spy_owned = std::make_unique<GrantSpy>(std::move(*sink_transport));
  GrantSpy* spy = spy_owned.get();
  auto prefill = Start("prefill-node", std::move(*source_transport));
  auto decode = Start("decode-node", std::move(spy_owned));
  ASSERT_TRUE(prefill && decode);

  connector::PdConfig c;
  c.requests = 4;
  c.window = 2;
  c.tokens = 40;
  c.layers = 3;
  c.heads = 4;
  c.head_dim = 16;
  c.timeout = std::chrono::milliseconds(10000);
  const std::string& variant = GetParam();
  if (variant == "blhnc_blocks32_tp2") {
    c.decode_order = "BLHNC";
    c.decode_block_size = 32;
    c.prefill_tp = 2;
  } else if (variant == "random_ids_tp1_to_2") {
    c.block_ids = connector::BlockIds::kRandom;
    c.decode_tp = 2;
  } else if (variant == "sbnhc") {
    c.decode_order = "SBNHC";
  } else if (variant == "pull") {
    c.mode = connector::Mode::kPull;  // the source puts the whole request once it finished
  }
  auto r = connector::RunPd(
      c,
      [&](const connector::ConnectorOptions& o) {
        return connector::Connector::OpenEmbedded(prefill, o);
      },
      [&](const connector::ConnectorOptions& o) {
        return connector::Connector::OpenEmbedded(decode, o);
      });
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->verified, c.requests) << r->first_error;
  EXPECT_EQ(r->failed, 0) << r->first_error;
  EXPECT_EQ(decode->Snapshot().transfers_failed(), 0u);
  std::lock_guard lock(spy->mu);
  EXPECT_EQ(spy->granted.size(), static_cast<size_t>(c.requests));
  EXPECT_EQ(spy->revoked, spy->granted);
}

// The negative of the above: where the decode kvd grants the source nothing, its puts are
// refused (the requests fail, no byte lands) instead of landing in the guarded regions.
TEST(GrantedPdRefusal, PutsOutsideTheGrantsAreRefusedAndTheRequestsFail) {
  auto source_transport = transport::CreateTransport("ucx", kAmPuts);
  auto sink_transport = transport::CreateTransport("ucx", kAmPuts);
  if (!source_transport.ok() && source_transport.status().code() == Code::kUnsupported) {
    GTEST_SKIP() << "this build has no ucx transport";
  }
  ASSERT_TRUE(source_transport.ok() && sink_transport.ok());
  auto spy_owned = std::make_unique<GrantSpy>(std::move(*sink_transport));
  spy_owned->grant_nothing = true;
  GrantSpy* spy = spy_owned.get();
  auto prefill = Start("prefill-node", std::move(*source_transport));
  auto decode = Start("decode-node", std::move(spy_owned));
  ASSERT_TRUE(prefill && decode);
  connector::PdConfig c;
  c.requests = 2;
  c.window = 1;
  c.tokens = 40;
  c.layers = 2;
  c.heads = 2;
  c.head_dim = 16;
  c.timeout = std::chrono::milliseconds(20000);
  auto r = connector::RunPd(
      c,
      [&](const connector::ConnectorOptions& o) {
        return connector::Connector::OpenEmbedded(prefill, o);
      },
      [&](const connector::ConnectorOptions& o) {
        return connector::Connector::OpenEmbedded(decode, o);
      });
  // RunPd stops at the first failed wave, or reports the failures.
  if (r.ok()) {
    EXPECT_EQ(r->verified, 0) << "a put landed outside every grant";
    EXPECT_GT(r->failed, 0);
  }
  // RunPd may return before the decode kvd ended its loads: a decode rank skips the wait for a
  // request its prefill rank already saw fail, and the decode kvd ends that load (revoking its
  // grant) only when the source's Fail, or the close of its engine, reaches its io thread. So
  // wait, within the lease, until every granted load ended; only then are all grants due back.
  const proto::DaemonStatus ended = WaitForLoadsToEnd(*decode, *spy);
  EXPECT_EQ(ended.transfers_in_flight(), 0u) << "a load outlived its lease";
  EXPECT_EQ(ended.transfers_done(), 0u) << "a load completed though nothing was granted";
  std::lock_guard lock(spy->mu);
  EXPECT_EQ(spy->granted.size(), static_cast<size_t>(c.requests)) << "a Want was not granted";
  EXPECT_EQ(ended.transfers_failed(), spy->granted.size());
  EXPECT_EQ(spy->revoked, spy->granted);
}

INSTANTIATE_TEST_SUITE_P(Layouts, GrantedPd,
                         ::testing::Values("lbnhc", "blhnc_blocks32_tp2", "random_ids_tp1_to_2",
                                           "sbnhc", "pull"));

}  // namespace
}  // namespace kv::daemon
