// Connector::StartLoads: a scheduler step's loads in one round trip to kvd, one result per load.
// Two kvd cores in this process joined over loopback (the `local` transport), engines embedded;
// every loaded byte is checked.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "connector/client.h"
#include "connector/connector.h"
#include "daemon/daemon.h"
#include "protocol/kvd.pb.h"

namespace kv {
namespace {

using connector::Connector;
using connector::KvCache;
using connector::LoadSpec;
using connector::TransferParams;

constexpr auto kTimeout = std::chrono::milliseconds(5000);
constexpr int kLayers = 2;
constexpr int64_t kBlocks = 8;

// One request is 16 tokens: one block of every layer.
LayoutSpec Spec() {
  LayoutSpec spec;
  spec.layers = kLayers;
  spec.blocks = kBlocks;
  spec.heads = 2;
  spec.block_size = 16;
  spec.content_bytes = 64;
  return spec;
}

std::shared_ptr<daemon::Daemon> StartDaemon(const std::string& name) {
  daemon::DaemonOptions options;
  options.name = name;
  options.transport_name = "local";
  options.lease = std::chrono::milliseconds(10000);
  auto d = daemon::Daemon::Start(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : nullptr;
}

class StartLoadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefill_ = StartDaemon("p");
    decode_ = StartDaemon("d");
    ASSERT_TRUE(prefill_ && decode_);
    auto source = Connector::OpenEmbedded(prefill_, {"prefill", 0, 1, kTimeout});
    auto sink = Connector::OpenEmbedded(decode_, {"decode", 0, 1, kTimeout});
    ASSERT_TRUE(source.ok()) << source.status().ToString();
    ASSERT_TRUE(sink.ok()) << sink.status().ToString();
    const LayoutSpec spec = Spec();
    auto src = (*source)->RegisterKvCaches(connector::HostCaches({&spec, 1}));
    auto dst = (*sink)->RegisterKvCaches(connector::HostCaches({&spec, 1}));
    ASSERT_TRUE(src.ok() && dst.ok());
    source_cache_ = src->front();
    sink_cache_ = dst->front();
    source_ = std::move(*source);
    sink_ = std::move(*sink);
  }

  TransferParams Params() const {
    TransferParams params;
    params.peer_address = prefill_->listen_address();
    params.tokens = 16;
    return params;
  }

  // The prefill engine writes `request` into `block` (byte fill + layer) and finishes it.
  void Save(const std::string& request, int64_t block, char fill) {
    const KvRegion layout = connector::RegionOf(source_cache_);
    for (int l = 0; l < kLayers; ++l) {
      std::memset(static_cast<char*>(source_cache_.base) + layout.page_offset(l, block), fill + l,
                  layout.page_bytes());
      ASSERT_TRUE(source_->SaveLayer(request, l, std::vector<int64_t>{block}).ok());
    }
    auto finished = source_->RequestFinished(request);
    ASSERT_TRUE(finished.ok()) << finished.status().ToString();
  }

  // Every layer of `request` is in place in the decode engine's `block`.
  void ExpectLoaded(const std::string& request, int64_t block, char fill) {
    const KvRegion layout = connector::RegionOf(sink_cache_);
    for (int l = 0; l < kLayers; ++l) {
      Status s = sink_->WaitLayer(request, l);
      ASSERT_TRUE(s.ok()) << request << ": " << s.ToString();
      const char* page = static_cast<const char*>(sink_cache_.base) + layout.page_offset(l, block);
      for (uint64_t i = 0; i < layout.page_bytes(); ++i) {
        ASSERT_EQ(page[i], fill + l) << request << " layer " << l << " byte " << i;
      }
    }
  }

  std::shared_ptr<daemon::Daemon> prefill_, decode_;
  std::unique_ptr<Connector> source_, sink_;
  KvCache source_cache_, sink_cache_;
};

TEST_F(StartLoadsTest, EveryLoadOfABatchArrives) {
  const std::vector<std::string> ids = {"r0", "r1", "r2", "r3"};
  std::vector<std::vector<int64_t>> blocks;
  std::vector<LoadSpec> loads;
  for (size_t j = 0; j < ids.size(); ++j) blocks.push_back({kBlocks - 1 - static_cast<int64_t>(j)});
  for (size_t j = 0; j < ids.size(); ++j) loads.push_back({ids[j], Params(), blocks[j]});
  auto started = sink_->StartLoads(loads);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  ASSERT_EQ(started->size(), ids.size());
  for (const Status& s : *started) EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(decode_->Snapshot().transfers_in_flight(), ids.size());
  for (size_t j = 0; j < ids.size(); ++j) {
    ASSERT_NO_FATAL_FAILURE(Save(ids[j], static_cast<int64_t>(j), static_cast<char>(0x10 * j)));
  }
  for (size_t j = 0; j < ids.size(); ++j) {
    ASSERT_NO_FATAL_FAILURE(ExpectLoaded(ids[j], blocks[j][0], static_cast<char>(0x10 * j)));
  }
}

TEST_F(StartLoadsTest, ARefusedLoadDoesNotStopTheOthers) {
  const std::vector<int64_t> one = {1}, two = {2}, out_of_range = {kBlocks};
  TransferParams no_address = Params();
  no_address.peer_address.clear();
  const std::vector<LoadSpec> loads = {
      {"good-1", Params(), one},          {"bad-block", Params(), out_of_range},
      {"no-address", no_address, two},    {"good-2", Params(), two},
      {"good-1", Params(), out_of_range}, {"offload:1", Params(), one},
  };
  auto started = sink_->StartLoads(loads);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  ASSERT_EQ(started->size(), loads.size());
  const std::vector<Status>& r = *started;
  EXPECT_TRUE(r[0].ok()) << r[0].ToString();
  EXPECT_EQ(r[1].code(), Code::kOutOfRange) << r[1].ToString();
  EXPECT_NE(r[1].message().find("block id 8"), std::string::npos) << r[1].ToString();
  EXPECT_EQ(r[2].code(), Code::kInvalidArgument) << r[2].ToString();
  EXPECT_NE(r[2].message().find("address"), std::string::npos) << r[2].ToString();
  EXPECT_TRUE(r[3].ok()) << r[3].ToString();
  EXPECT_EQ(r[4].code(), Code::kInvalidArgument) << r[4].ToString();
  EXPECT_NE(r[4].message().find("more than once"), std::string::npos) << r[4].ToString();
  EXPECT_EQ(r[5].code(), Code::kInvalidArgument) << r[5].ToString();
  EXPECT_NE(r[5].message().find("reserved"), std::string::npos) << r[5].ToString();

  ASSERT_NO_FATAL_FAILURE(Save("good-1", 5, 0x20));
  ASSERT_NO_FATAL_FAILURE(Save("good-2", 6, 0x30));
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded("good-1", 1, 0x20));
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded("good-2", 2, 0x30));
  // A refused load leaves nothing behind: no state to wait on, no blocks reported failed (the
  // engine never handed them over).
  EXPECT_EQ(sink_->WaitLayer("bad-block", 0).code(), Code::kNotFound);
  EXPECT_EQ(sink_->WaitLayer("no-address", 0).code(), Code::kNotFound);
  EXPECT_TRUE(sink_->GetFailedBlocks().empty());
  EXPECT_EQ(decode_->Snapshot().transfers_failed(), 0u);
}

// kvd answers start_loads once the loads are checked and sends their Wants after: a load that
// fails only then (its source named by a daemon name this kvd cannot resolve without etcd) is
// accepted in the answer and fails afterwards, saying why, while the batch's other load arrives.
TEST_F(StartLoadsTest, ALoadFailingAsItsWantLeavesFailsAfterTheAnswer) {
  const std::vector<int64_t> one = {1}, two = {2};
  TransferParams by_name = Params();
  by_name.peer_address = "prefill-node";  // a daemon name: no ':'
  const std::vector<LoadSpec> loads = {{"by-name", by_name, one}, {"good", Params(), two}};
  auto started = sink_->StartLoads(loads);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  ASSERT_EQ(started->size(), 2u);
  EXPECT_TRUE((*started)[0].ok()) << (*started)[0].ToString();
  EXPECT_TRUE((*started)[1].ok()) << (*started)[1].ToString();

  const Status failed = sink_->WaitLayer("by-name", 0);
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("--etcd"), std::string::npos) << failed.ToString();
  ASSERT_NO_FATAL_FAILURE(Save("good", 6, 0x40));
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded("good", 2, 0x40));
}

TEST_F(StartLoadsTest, AnEmptyOrOversizedBatchIsRefusedWhole) {
  auto empty = sink_->StartLoads({});
  EXPECT_EQ(empty.status().code(), Code::kInvalidArgument) << empty.status().ToString();

  const std::vector<int64_t> block = {0};
  std::vector<LoadSpec> loads;
  for (size_t i = 0; i <= connector::kMaxLoadsPerCall; ++i) {
    loads.push_back({"r" + std::to_string(i), Params(), block});
  }
  auto over = sink_->StartLoads(loads);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), Code::kInvalidArgument) << over.status().ToString();
  EXPECT_NE(over.status().message().find(std::to_string(connector::kMaxLoadsPerCall)),
            std::string::npos)
      << over.status().ToString();
  EXPECT_EQ(decode_->Snapshot().transfers_in_flight(), 0u);
  EXPECT_EQ(sink_->WaitLayer("r0", 0).code(), Code::kNotFound);

  // At the bound every load starts.
  loads.pop_back();
  auto at_bound = sink_->StartLoads(loads);
  ASSERT_TRUE(at_bound.ok()) << at_bound.status().ToString();
  for (const Status& s : *at_bound) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(decode_->Snapshot().transfers_in_flight(), connector::kMaxLoadsPerCall);
  ASSERT_NO_FATAL_FAILURE(Save("r0", 3, 0x40));
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded("r0", 0, 0x40));
}

// A second load of a request this connector is still loading is refused here, before kvd
// refuses it, and leaves the first one's tracking alone: the first still arrives.
TEST_F(StartLoadsTest, ASecondLoadOfOneRequestLeavesTheFirstIntact) {
  const std::vector<int64_t> block = {2}, other = {5};
  ASSERT_TRUE(sink_->StartLoad("r", Params(), block).ok());
  EXPECT_EQ(sink_->StartLoad("r", Params(), other).code(), Code::kAlreadyExists);
  const std::vector<LoadSpec> again = {{"r", Params(), other}, {"s", Params(), other}};
  auto batch = sink_->StartLoads(again);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ((*batch)[0].code(), Code::kAlreadyExists) << (*batch)[0].ToString();
  EXPECT_TRUE((*batch)[1].ok()) << (*batch)[1].ToString();
  ASSERT_NO_FATAL_FAILURE(Save("r", 1, 0x20));
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded("r", 2, 0x20));
  ASSERT_NO_FATAL_FAILURE(Save("s", 3, 0x30));
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded("s", 5, 0x30));
}

// What kvd does with the wire form itself, whoever sends it: engines of the protocols kvd speaks
// (OLDEST_ENGINE_PROTOCOL to PROTOCOL_VERSION) are served, others refused, and kvd checks a batch
// without the connector's help.
TEST(StartLoadsWire, KvdServesOlderEnginesAndChecksBatchesItself) {
  auto d = StartDaemon("d");
  ASSERT_TRUE(d);
  int engines = 0;
  auto raw_engine = [&](uint32_t version) -> std::unique_ptr<connector::ConnectorCore::Client> {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return nullptr;
    if (!d->AttachEngine(fds[1]).ok()) {
      close(fds[0]);
      return nullptr;
    }
    auto client = connector::ConnectorCore::Client::Create(fds[0], kTimeout);
    if (!client.ok()) return nullptr;
    proto::EngineMessage hello;
    hello.mutable_hello()->set_protocol_version(version);
    hello.mutable_hello()->set_instance("raw-" + std::to_string(version) + "-" +
                                        std::to_string(++engines));
    hello.mutable_hello()->set_tp_size(1);
    Status said = (*client)->Call(hello).status();
    EXPECT_EQ(said.ok(),
              version >= proto::OLDEST_ENGINE_PROTOCOL && version <= proto::PROTOCOL_VERSION)
        << version << ": " << said.ToString();
    if (!said.ok()) {
      EXPECT_EQ(said.code(), Code::kIncompatible) << said.ToString();
    }
    return std::move(*client);
  };
  ASSERT_TRUE(raw_engine(proto::OLDEST_ENGINE_PROTOCOL - 1));
  ASSERT_TRUE(raw_engine(proto::PROTOCOL_VERSION + 1));
  auto old_engine = raw_engine(proto::OLDEST_ENGINE_PROTOCOL);
  ASSERT_TRUE(old_engine);
  // The single form, as the oldest engine kvd serves sends it, is answered as before.
  proto::EngineMessage single;
  single.mutable_start_load()->set_request_id("r");
  auto one = old_engine->Call(single);
  EXPECT_NE(one.status().message().find("register_kv_caches first"), std::string::npos)
      << one.status().ToString();

  auto engine = raw_engine(proto::PROTOCOL_VERSION);
  ASSERT_TRUE(engine);
  proto::EngineMessage empty;
  empty.mutable_start_loads();
  auto refused = engine->Call(empty);
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("no loads"), std::string::npos);
  proto::EngineMessage batch;
  batch.mutable_start_loads()->add_loads()->set_request_id("a");
  batch.mutable_start_loads()->add_loads()->set_request_id("");
  auto answered = engine->Call(batch);
  ASSERT_TRUE(answered.ok()) << answered.status().ToString();
  ASSERT_EQ(answered->loads().errors_size(), 2);
  EXPECT_NE(answered->loads().errors(0).message().find("register_kv_caches first"),
            std::string::npos);
  EXPECT_EQ(answered->loads().errors(1).code(), static_cast<int>(Code::kInvalidArgument));
}

// Connector::RequestsFinished, the prefill side's counterpart: a wave's finishes in one round
// trip, one result each, each what RequestFinished would have returned; the params it returns
// load the requests.
TEST_F(StartLoadsTest, RequestsFinishedInOneRoundTripEachWithItsOwnResult) {
  const KvRegion layout = connector::RegionOf(source_cache_);
  for (int64_t block : {1, 2}) {
    const std::string request = block == 1 ? "a" : "b";
    for (int l = 0; l < kLayers; ++l) {
      std::memset(static_cast<char*>(source_cache_.base) + layout.page_offset(l, block),
                  0x20 * static_cast<int>(block) + l, layout.page_bytes());
      ASSERT_TRUE(source_->SaveLayer(request, l, std::vector<int64_t>{block}).ok());
    }
  }
  const std::string token(connector::kMinTransferTokenBytes, '\x5a');
  const std::vector<connector::FinishSpec> finishes = {
      {"a", ""}, {"never-saved", ""}, {"short-token", "abc"}, {"", ""}, {"b", token}};
  auto finished = source_->RequestsFinished(finishes);
  ASSERT_TRUE(finished.ok()) << finished.status().ToString();
  ASSERT_EQ(finished->size(), finishes.size());
  const auto& r = *finished;
  ASSERT_TRUE(r[0].ok()) << r[0].status().ToString();
  EXPECT_EQ(r[0]->request_id, "a");
  EXPECT_EQ(r[0]->peer_name, "p");
  EXPECT_GE(r[0]->transfer_token.size(), connector::kMinTransferTokenBytes);
  EXPECT_EQ(r[0]->remote_block_ids, std::vector<int64_t>{1});
  EXPECT_EQ(r[1].status().code(), Code::kNotFound) << r[1].status().ToString();
  EXPECT_EQ(r[2].status().code(), Code::kInvalidArgument) << r[2].status().ToString();
  EXPECT_EQ(r[3].status().code(), Code::kInvalidArgument) << r[3].status().ToString();
  ASSERT_TRUE(r[4].ok()) << r[4].status().ToString();
  EXPECT_EQ(r[4]->transfer_token, token);
  // As a lone RequestFinished: finishing again (another rank's call) returns the same params.
  auto again = source_->RequestFinished("a");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->transfer_token, r[0]->transfer_token);

  std::vector<LoadSpec> loads;
  const std::vector<int64_t> a_blocks = {5}, b_blocks = {6};
  for (int k : {0, 4}) {
    TransferParams params = *r[k];
    params.tokens = 16;
    loads.push_back({params.request_id, params, k == 0 ? a_blocks : b_blocks});
  }
  auto started = sink_->StartLoads(loads);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  for (const Status& s : *started) ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded("a", 5, 0x20));
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded("b", 6, 0x40));

  // The batch's own errors: nothing sent.
  EXPECT_EQ(source_->RequestsFinished({}).status().code(), Code::kInvalidArgument);
  const std::vector<connector::FinishSpec> too_many(connector::kMaxFinishesPerCall + 1, {"a", ""});
  EXPECT_EQ(source_->RequestsFinished(too_many).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace kv
