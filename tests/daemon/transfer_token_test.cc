// Issue 19, capabilities instead of ids: a WantRequest must present the transfer token that the
// prefill engine's RequestFinished returned (a hijacker that knows only the request id gets
// nothing), and a layer notice another peer forges is ignored.
#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <thread>

#include "connector/connector.h"
#include "daemon/daemon.h"
#include "daemon/peer_auth.h"
#include "protocol/kvd.pb.h"
#include "tests/support/spy_transport.h"
#include "transport/transport.h"

namespace kv {
namespace {

using connector::Connector;
using connector::TransferParams;
using testing::SpyTransport;
using Clock = std::chrono::steady_clock;

const std::string kSecret(40, 's');

// Every kvd here holds the cluster secret: tokens are required unless `require_token` says.
std::shared_ptr<daemon::Daemon> StartDaemon(const std::string& name,
                                            std::optional<bool> require_token = std::nullopt,
                                            SpyTransport** spy = nullptr) {
  daemon::DaemonOptions options;
  options.name = name;
  options.auth_secret = kSecret;
  options.require_transfer_token = require_token;
  options.lease = std::chrono::milliseconds(10000);
  auto local = transport::CreateTransport("local");
  EXPECT_TRUE(local.ok()) << local.status().ToString();
  if (!local.ok()) return nullptr;
  auto wrapped = std::make_unique<SpyTransport>(std::move(local).value(),
                                                std::make_shared<SpyTransport::Counters>());
  if (spy != nullptr) *spy = wrapped.get();
  options.transport = std::move(wrapped);
  auto d = daemon::Daemon::Start(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : nullptr;
}

LayoutSpec TinySpec() {
  LayoutSpec spec;
  spec.layers = 2;
  spec.blocks = 4;
  spec.heads = 2;
  spec.block_size = 16;
  spec.content_bytes = 64;
  return spec;
}

std::unique_ptr<Connector> Engine(const std::shared_ptr<daemon::Daemon>& d,
                                  const std::string& instance) {
  auto engine = Connector::OpenEmbedded(d, {instance, 0, 1, std::chrono::milliseconds(5000)});
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return nullptr;
  const LayoutSpec spec = TinySpec();
  EXPECT_TRUE((*engine)->RegisterKvCaches(connector::HostCaches({&spec, 1})).ok());
  return std::move(engine).value();
}

// Loads request "r" on `sink` with `params` and waits for every layer: the first error.
Status Load(Connector& sink, const TransferParams& params) {
  const std::vector<int64_t> blocks = {1};
  KV_RETURN_IF_ERROR(sink.StartLoad("r", params, blocks));
  for (int l = 0; l < 2; ++l) KV_RETURN_IF_ERROR(sink.WaitLayer("r", l));
  return Status::Ok();
}

bool Released(Connector& source, const std::string& id) {
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < until) {
    for (const auto& sent : source.GetFinished().sent) {
      if (sent == id) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST(TransferToken, AWantWithoutTheTokenOrWithAWrongOneIsRefused) {
  auto prefill = StartDaemon("prefill-node");
  auto honest = StartDaemon("decode-node");
  auto thief = StartDaemon("thief-node");
  ASSERT_TRUE(prefill && honest && thief);
  auto source = Engine(prefill, "prefill");
  auto victim_sink = Engine(honest, "decode");
  auto thief_sink = Engine(thief, "thief");
  ASSERT_TRUE(source && victim_sink && thief_sink);
  const std::vector<int64_t> blocks = {0};
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(source->SaveLayer("r", l, blocks).ok());
  auto params = source->RequestFinished("r");
  ASSERT_TRUE(params.ok()) << params.status().ToString();
  ASSERT_EQ(params->transfer_token.size(), daemon::auth::kTransferTokenBytes);
  params->tokens = 16;

  // The thief knows the id and the address (they are not secret), not the token.
  TransferParams guessed = *params;
  guessed.transfer_token.clear();
  Status s = Load(*thief_sink, guessed);
  ASSERT_FALSE(s.ok()) << "a Want without the token was served";
  EXPECT_NE(s.message().find("transfer token"), std::string::npos) << s.ToString();
  guessed.transfer_token = params->transfer_token;
  guessed.transfer_token[0] ^= 1;
  auto second_sink = Engine(thief, "thief-2");  // the first still holds its failed "r"
  ASSERT_TRUE(second_sink);
  s = Load(*second_sink, guessed);
  ASSERT_FALSE(s.ok()) << "a Want with a wrong token was served";
  EXPECT_NE(s.message().find("transfer token"), std::string::npos) << s.ToString();

  // The request is untouched: its real destination loads it, the prefill engine hears "sent".
  ASSERT_TRUE(Load(*victim_sink, *params).ok());
  EXPECT_TRUE(Released(*source, "r"));
  EXPECT_EQ(thief->Snapshot().bytes_received(), 0u);
}

TEST(TransferToken, WithASecretTokensAreRequiredAlsoBeforeTheRequestFinished) {
  auto prefill = StartDaemon("prefill-node");
  auto decode = StartDaemon("decode-node");
  ASSERT_TRUE(prefill && decode);
  auto sink = Engine(decode, "decode");
  ASSERT_TRUE(sink);
  TransferParams params;
  params.peer_address = prefill->listen_address();
  params.tokens = 16;
  Status s = Load(*sink, params);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("transfer token"), std::string::npos) << s.ToString();
}

TEST(TransferToken, ALayerNoticeForgedByAnotherPeerIsIgnored) {
  SpyTransport* forger = nullptr;
  // Layer streaming: the decode asks before the prefill finished, without a token.
  auto prefill = StartDaemon("prefill-node", /*require_token=*/false);
  auto decode = StartDaemon("decode-node");
  auto attacker = StartDaemon("attacker-node", std::nullopt, &forger);
  ASSERT_TRUE(prefill && decode && attacker && forger);
  auto source = Engine(prefill, "prefill");
  auto sink = Engine(decode, "decode");
  auto attacker_engine = Engine(attacker, "attacker");
  ASSERT_TRUE(source && sink && attacker_engine);

  // The decode engine asks for "r" before the prefill saved anything (layer streaming).
  TransferParams params;
  params.peer_address = prefill->listen_address();
  params.tokens = 16;
  const std::vector<int64_t> blocks = {1};
  ASSERT_TRUE(sink->StartLoad("r", params, blocks).ok());

  // The attacker (authenticated: it holds the cluster secret) gets a transport connection to
  // the decode kvd by loading something from it, then forges "layer 0 of r is in place".
  TransferParams bait;
  bait.peer_address = decode->listen_address();
  bait.tokens = 16;
  ASSERT_TRUE(attacker_engine->StartLoad("bait", bait, blocks).ok());
  int to_decode = 0;
  for (auto until = Clock::now() + std::chrono::seconds(5); Clock::now() < until;) {
    // The spy's counters are not reachable through the daemon; poll the attacker's status.
    if (attacker->Snapshot().peers_size() > 0 && attacker->Snapshot().peers(0).state() == "ready") {
      to_decode = 1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(to_decode, 0) << "the attacker never connected to the decode kvd";
  proto::LayerNotice forged;
  forged.set_source("prefill-node");
  forged.set_request_id("r");
  forged.set_layer(0);
  forged.set_bytes(12345);
  forged.set_runs(1);
  ASSERT_TRUE(forger->NotifyEveryPeer(forged.SerializeAsString()));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(decode->Snapshot().bytes_received(), 0u) << "the forged notice was taken";

  // The real layers then arrive as usual.
  const std::vector<int64_t> source_blocks = {0};
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(source->SaveLayer("r", l, source_blocks).ok());
  ASSERT_TRUE(source->RequestFinished("r").ok());
  for (int l = 0; l < 2; ++l) EXPECT_TRUE(sink->WaitLayer("r", l).ok());
  EXPECT_TRUE(Released(*source, "r"));
  EXPECT_NE(decode->Snapshot().bytes_received(), 0u);
  EXPECT_LT(decode->Snapshot().bytes_received(), 12345u);
}

}  // namespace
}  // namespace kv
