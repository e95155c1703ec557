// Two kvd cores in this process, joined by a real TCP peer session on loopback and the `local`
// transport; engines attach embedded or over the unix socket. Every byte is verified.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "daemon/daemon.h"
#include "tools/kvbench/pd/pd_sim.h"

namespace kv {
namespace {

using connector::Connector;
using connector::ConnectorOptions;
using connector::Mode;
using connector::PdConfig;

struct Case {
  std::string name;
  PdConfig config;
};

PdConfig Small() {
  PdConfig c;
  c.requests = 6;
  c.window = 3;
  c.tokens = 40;  // not a multiple of the block size: partial last blocks
  c.layers = 4;
  c.heads = 4;
  c.head_dim = 16;
  c.timeout = std::chrono::milliseconds(10000);
  return c;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"push", Small()});
  PdConfig pull = Small();
  pull.mode = Mode::kPull;
  cases.push_back({"pull", pull});
  PdConfig tp12 = Small();
  tp12.decode_tp = 2;
  cases.push_back({"tp1_to_2", tp12});
  PdConfig tp21 = Small();
  tp21.prefill_tp = 2;
  cases.push_back({"tp2_to_1", tp21});
  PdConfig convert = Small();
  convert.decode_order = "BLHNC";
  cases.push_back({"lbnhc_to_blhnc", convert});
  PdConfig legacy = Small();
  legacy.prefill_order = "SBNHC";
  cases.push_back({"sbnhc_to_lbnhc", legacy});
  PdConfig mla = Small();
  mla.mla = true;
  mla.prefill_tp = 2;
  mla.decode_tp = 2;
  cases.push_back({"mla_tp2", mla});
  PdConfig blocks = Small();
  blocks.decode_block_size = 32;
  cases.push_back({"block16_to_32", blocks});
  PdConfig everything = Small();
  everything.prefill_tp = 2;
  everything.decode_block_size = 32;
  everything.decode_order = "BLHNC";
  everything.mode = Mode::kPull;
  cases.push_back({"tp2_blocks32_blhnc_pull", everything});
  PdConfig random = Small();
  random.block_ids = connector::BlockIds::kRandom;
  cases.push_back({"random_block_ids", random});
  PdConfig random_convert = everything;
  random_convert.block_ids = connector::BlockIds::kRandom;
  random_convert.mode = Mode::kPush;
  cases.push_back({"random_block_ids_tp2_blocks32_blhnc", random_convert});
  return cases;
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

class PdEmbedded : public ::testing::TestWithParam<Case> {};

// `secret`: peers prove it, and transfer tokens are required (SECURITY.md).
std::shared_ptr<daemon::Daemon> StartDaemon(const std::string& name, const std::string& socket,
                                            bool busy_poll = false,
                                            const std::string& secret = "") {
  daemon::DaemonOptions options;
  options.name = name;
  options.busy_poll = busy_poll;
  options.socket_path = socket;
  options.auth_secret = secret;
  options.transport_name = "local";
  options.lease = std::chrono::milliseconds(10000);
  auto d = daemon::Daemon::Start(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : nullptr;
}

// The cache the failure tests register: 2 layers of 8 blocks of 16 tokens, 2 heads.
LayoutSpec TinySpec() {
  LayoutSpec spec;
  spec.layers = 2;
  spec.blocks = 8;
  spec.heads = 2;
  spec.block_size = 16;
  spec.content_bytes = 64;
  return spec;
}

// A prefill engine on `d` with the tiny cache registered.
Result<std::unique_ptr<Connector>> OpenTinyPrefill(const std::shared_ptr<daemon::Daemon>& d) {
  auto engine = Connector::OpenEmbedded(d, {"prefill", 0, 1, std::chrono::milliseconds(5000)});
  if (!engine.ok()) return engine.status();
  const LayoutSpec spec = TinySpec();
  KV_RETURN_IF_ERROR((*engine)->RegisterKvCaches(connector::HostCaches({&spec, 1})).status());
  return engine;
}

void ExpectAllVerified(const Result<connector::PdResult>& r, const PdConfig& c) {
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->requests, c.requests);
  EXPECT_EQ(r->verified, c.requests) << r->first_error;
  EXPECT_EQ(r->failed, 0) << r->first_error;
  EXPECT_EQ(r->guard_bytes_written, 0u);
  EXPECT_GT(r->bytes, 0u);
}

// Two kvd cores joined over loopback, one embedded engine on each with its cache registered.
struct EnginePair {
  std::shared_ptr<daemon::Daemon> prefill, decode;
  std::unique_ptr<Connector> source, sink;

  static EnginePair Start(const LayoutSpec& source_cache, const LayoutSpec& sink_cache) {
    EnginePair pair;
    pair.prefill = StartDaemon("p", "");
    pair.decode = StartDaemon("d", "");
    if (!pair.prefill || !pair.decode) return pair;
    auto source =
        Connector::OpenEmbedded(pair.prefill, {"prefill", 0, 1, std::chrono::milliseconds(5000)});
    auto sink =
        Connector::OpenEmbedded(pair.decode, {"decode", 0, 1, std::chrono::milliseconds(5000)});
    EXPECT_TRUE(source.ok() && sink.ok());
    if (!source.ok() || !sink.ok()) return pair;
    EXPECT_TRUE((*source)->RegisterKvCaches(connector::HostCaches({&source_cache, 1})).ok());
    EXPECT_TRUE((*sink)->RegisterKvCaches(connector::HostCaches({&sink_cache, 1})).ok());
    pair.source = std::move(*source);
    pair.sink = std::move(*sink);
    return pair;
  }
  bool ok() const { return source && sink; }
  // The decode engine loads request "r" (16 tokens) into `blocks` from the prefill kvd.
  Status Load(const std::vector<int64_t>& blocks) {
    connector::TransferParams params;
    params.peer_address = prefill->listen_address();
    params.tokens = 16;
    return sink->StartLoad("r", params, blocks);
  }
};

TEST_P(PdEmbedded, EveryByteArrives) {
  auto prefill = StartDaemon("prefill-node", "");
  auto decode = StartDaemon("decode-node", "");
  ASSERT_TRUE(prefill && decode);
  const PdConfig& c = GetParam().config;
  auto r = connector::RunPd(
      c, [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(prefill, o); },
      [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(decode, o); });
  ExpectAllVerified(r, c);
  auto status = prefill->Snapshot();
  EXPECT_EQ(status.transfers_done(), static_cast<uint64_t>(c.requests));
  EXPECT_EQ(status.transfers_failed(), 0u);
  EXPECT_EQ(decode->Snapshot().bytes_received(), r->bytes);
}

// A prefill kvd serving engines of two TP sizes (vLLM's scheduler-side connector is rank 0 of 1
// beside the TP 2 workers), the TP 1 one connected last: its hello announced "rank 1 of 1" and the
// decode kvd refused the peer (python_vllm_call_sequence, once under load).
TEST(PdEmbeddedTpSizes, APrefillKvdWithEnginesOfTwoTpSizesIsAPeer) {
  auto prefill = StartDaemon("prefill-node", "");
  auto decode = StartDaemon("decode-node", "");
  ASSERT_TRUE(prefill && decode);
  PdConfig c;
  c.requests = 2;
  c.window = 2;
  c.tokens = 40;
  c.layers = 2;
  c.prefill_tp = 2;
  std::unique_ptr<Connector> scheduler;  // opened after the last prefill rank, held to the end
  auto r = connector::RunPd(
      c,
      [&](const ConnectorOptions& o) {
        auto rank = Connector::OpenEmbedded(prefill, o);
        if (rank.ok() && o.tp_rank + 1 == o.tp_size) {
          auto opened = Connector::OpenEmbedded(
              prefill, {"prefill.scheduler", 0, 1, std::chrono::milliseconds(5000)});
          if (!opened.ok()) return opened;
          scheduler = std::move(*opened);
        }
        return rank;
      },
      [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(decode, o); });
  ASSERT_TRUE(scheduler != nullptr);
  ExpectAllVerified(r, c);
}

// Shuffled block ids split each request's layer into runs: more runs per request than
// contiguous ids (one per layer on LBNHC), every byte still verified.
TEST(PdEmbeddedBlockIds, RandomIdsMoveEveryByteInMoreRunsThanContiguous) {
  auto runs_per_request = [](connector::BlockIds ids) -> double {
    auto prefill = StartDaemon("prefill-node", "");
    auto decode = StartDaemon("decode-node", "");
    if (!prefill || !decode) return 0;
    PdConfig c = Small();
    c.tokens = 64;  // 4 blocks per request
    c.block_ids = ids;
    auto r = connector::RunPd(
        c, [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(prefill, o); },
        [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(decode, o); });
    ExpectAllVerified(r, c);
    return static_cast<double>(prefill->Snapshot().runs_sent()) / c.requests;
  };
  const double contiguous = runs_per_request(connector::BlockIds::kContiguous);
  const double random = runs_per_request(connector::BlockIds::kRandom);
  EXPECT_EQ(contiguous, Small().layers);  // one run per layer
  // 4 layers x 4 blocks at most; adjacent ids on both sides may still merge now and then.
  EXPECT_GT(random, 2 * contiguous);
  EXPECT_LE(random, 4.0 * Small().layers);
}

// Warm-up waves move and verify their requests like the others but stay out of the figures.
TEST(PdEmbeddedWarmup, WarmupWavesMoveBytesButAreNotCounted) {
  auto prefill = StartDaemon("prefill-node", "");
  auto decode = StartDaemon("decode-node", "");
  ASSERT_TRUE(prefill && decode);
  PdConfig c = Small();
  c.warmup_waves = 2;
  auto r = connector::RunPd(
      c, [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(prefill, o); },
      [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(decode, o); });
  ExpectAllVerified(r, c);
  EXPECT_EQ(r->latency_ms.size(), static_cast<size_t>(c.requests));
  EXPECT_EQ(r->runs, static_cast<uint64_t>(c.requests * c.layers));  // one run per layer
  // At most one post per request and layer; fewer where a pass of kvd's io loop merged saves.
  EXPECT_GT(r->posts, 0u);
  EXPECT_LE(r->posts, r->runs);
  EXPECT_EQ(prefill->Snapshot().transfers_done(),
            static_cast<uint64_t>(c.requests + c.warmup_waves * c.window));
  // Their own figure, what a peer's first requests see: every byte of both waves, on a clock.
  EXPECT_EQ(r->warmup_bytes, r->bytes / c.requests * c.warmup_waves * c.window);
  EXPECT_GT(r->warmup_seconds, 0);
}

// kvd --busy-poll: io threads that never sleep serve the same transfers, and stop when the
// daemons do (a spin that missed the stop would hang the test at its destructor).
TEST(PdEmbeddedBusyPoll, SpinningIoThreadsMoveEveryByteAndStop) {
  auto prefill = StartDaemon("prefill-node", "", /*busy_poll=*/true);
  auto decode = StartDaemon("decode-node", "", /*busy_poll=*/true);
  ASSERT_TRUE(prefill && decode);
  const PdConfig c = Small();
  auto r = connector::RunPd(
      c, [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(prefill, o); },
      [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(decode, o); });
  ExpectAllVerified(r, c);
  EXPECT_EQ(prefill->Snapshot().transfers_done(), static_cast<uint64_t>(c.requests));
  const auto started = std::chrono::steady_clock::now();
  prefill.reset();
  decode.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10));
}

// With a peer secret kvd requires transfer tokens: the simulator's router mints one per
// request, the prefill ranks fix it before their first save and the decode ranks present it, so
// every request streams and verifies (TP 2 -> 1, push). Without the tokens the same kvds refuse
// every Want.
TEST(PdEmbeddedTokens, WithTokensRequiredEveryRequestStreams) {
  const std::string secret(32, 'z');
  auto prefill = StartDaemon("prefill-node", "", /*busy_poll=*/false, secret);
  auto decode = StartDaemon("decode-node", "", /*busy_poll=*/false, secret);
  ASSERT_TRUE(prefill && decode);
  PdConfig c = Small();
  c.prefill_tp = 2;
  auto r = connector::RunPd(
      c, [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(prefill, o); },
      [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(decode, o); });
  ExpectAllVerified(r, c);
  EXPECT_EQ(prefill->Snapshot().transfers_done(), static_cast<uint64_t>(c.requests));

  PdConfig tokenless = Small();
  tokenless.tag = "tokenless";
  tokenless.transfer_tokens = false;
  tokenless.stop_at_failed_wave = true;
  auto refused = connector::RunPd(
      tokenless, [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(prefill, o); },
      [&](const ConnectorOptions& o) { return Connector::OpenEmbedded(decode, o); });
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->verified, 0);
  EXPECT_GT(refused->failed, 0);
  EXPECT_NE(refused->first_error.find("transfer token"), std::string::npos) << refused->first_error;
}

INSTANTIATE_TEST_SUITE_P(Layouts, PdEmbedded, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

TEST(PdOverSocket, ConnectorsOverTheUnixSocket) {
  auto dir =
      std::filesystem::temp_directory_path() / ("kvd-test-" + std::to_string(getpid()) + "-socket");
  std::filesystem::create_directories(dir);
  auto prefill = StartDaemon("p", (dir / "p.sock").string());
  auto decode = StartDaemon("d", (dir / "d.sock").string());
  ASSERT_TRUE(prefill && decode);
  EXPECT_EQ(std::filesystem::status(dir / "p.sock").permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  PdConfig c = Small();
  c.decode_tp = 2;
  auto r = connector::RunPd(
      c, [&](const ConnectorOptions& o) { return Connector::Open((dir / "p.sock").string(), o); },
      [&](const ConnectorOptions& o) { return Connector::Open((dir / "d.sock").string(), o); });
  ExpectAllVerified(r, c);
  prefill.reset();
  decode.reset();
  std::filesystem::remove_all(dir);
}

TEST(PdEmbeddedFailure, LoadFromAnAddressWithNoKvdFailsInBoundedTime) {
  auto decode = StartDaemon("d", "");
  ASSERT_TRUE(decode);
  auto engine = Connector::OpenEmbedded(decode, {"decode", 0, 1, std::chrono::milliseconds(5000)});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const LayoutSpec spec = TinySpec();
  ASSERT_TRUE((*engine)->RegisterKvCaches(connector::HostCaches({&spec, 1})).ok());
  connector::TransferParams params;
  params.peer_address = "127.0.0.1:1";  // nothing listens on port 1
  params.tokens = 16;
  const std::vector<int64_t> blocks = {3};
  ASSERT_TRUE((*engine)->StartLoad("r", params, blocks).ok());
  Status s = (*engine)->WaitLayer("r", 0);
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_EQ((*engine)->GetFailedBlocks(), blocks);
}

TEST(PdEmbeddedFailure, OutOfRangeBlocksAreRefusedBeforeAnythingMoves) {
  auto d = StartDaemon("d", "");
  ASSERT_TRUE(d);
  auto engine = OpenTinyPrefill(d);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const std::vector<int64_t> bad = {7, 8};
  Status s = (*engine)->SaveLayer("r", 0, bad);
  EXPECT_EQ(s.code(), Code::kOutOfRange) << s.ToString();
  EXPECT_NE(s.message().find("8"), std::string::npos);
  EXPECT_EQ((*engine)->SaveLayer("r", 2, std::vector<int64_t>{1}).code(), Code::kOutOfRange);
}

// SaveLayer is one-way: a save only kvd can refuse (other blocks than the request's first save)
// fails the request, and the engine hears it from RequestFinished and GetFinished.
TEST(PdEmbeddedFailure, ASaveKvdRefusesFailsItsRequestAndRequestFinishedSaysWhy) {
  auto d = StartDaemon("d", "");
  ASSERT_TRUE(d);
  auto engine = OpenTinyPrefill(d);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  ASSERT_TRUE((*engine)->SaveLayer("r", 0, std::vector<int64_t>{1}).ok());
  ASSERT_TRUE((*engine)->SaveLayer("r", 1, std::vector<int64_t>{2}).ok());  // kvd refuses it
  auto params = (*engine)->RequestFinished("r");
  ASSERT_FALSE(params.ok());
  EXPECT_EQ(params.status().code(), Code::kInvalidArgument) << params.status().ToString();
  EXPECT_NE(params.status().message().find("other blocks"), std::string::npos)
      << params.status().ToString();
  // Its blocks are released: the engine may reuse them.
  const auto sent = (*engine)->GetFinished().sent;
  EXPECT_NE(std::find(sent.begin(), sent.end(), "r"), sent.end());
  // The failure is reported once; another request goes on normally.
  EXPECT_TRUE((*engine)->SaveLayer("r2", 0, std::vector<int64_t>{1}).ok());
  EXPECT_TRUE((*engine)->RequestFinished("r2").ok());
}

TEST(PdEmbeddedFailure, PeersOfDifferentModelsAreRefusedNamingWhatDiffers) {
  LayoutSpec other = TinySpec();
  other.heads = 4;  // a model with twice the KV heads: no plan bridges that
  auto pair = EnginePair::Start(TinySpec(), other);
  ASSERT_TRUE(pair.ok());
  const std::vector<int64_t> blocks = {2};
  ASSERT_TRUE(pair.Load(blocks).ok());
  Status s = pair.sink->WaitLayer("r", 0);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("model KV heads differ"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("has 2"), std::string::npos) << s.ToString();
  EXPECT_EQ(pair.sink->GetFailedBlocks(), blocks);
}

TEST(PdEmbeddedFailure, AnEngineThatLeavesFailsItsRequestsAndDropsItsRegions) {
  auto pair = EnginePair::Start(TinySpec(), TinySpec());
  ASSERT_TRUE(pair.ok());
  auto& prefill = pair.prefill;
  auto& decode = pair.decode;
  auto& sink = pair.sink;
  const std::vector<int64_t> blocks = {2};
  ASSERT_TRUE(pair.source->SaveLayer("r", 0, blocks).ok());  // layer 1 never comes
  ASSERT_TRUE(pair.Load(blocks).ok());
  ASSERT_TRUE(sink->WaitLayer("r", 0).ok());
  EXPECT_EQ(prefill->Snapshot().regions(), 1u);

  pair.source.reset();  // the prefill engine goes away mid-request
  Status s = sink->WaitLayer("r", 1);
  EXPECT_EQ(s.code(), Code::kAborted) << s.ToString();
  EXPECT_NE(s.message().find("disconnected"), std::string::npos) << s.ToString();
  EXPECT_EQ(sink->GetFailedBlocks(), blocks);
  EXPECT_EQ(prefill->Snapshot().regions(), 0u);
  EXPECT_EQ(prefill->Snapshot().transfers_in_flight(), 0u);
  EXPECT_EQ(decode->Snapshot().transfers_failed(), 1u);
}

}  // namespace
}  // namespace kv
