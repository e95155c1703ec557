// Issue 19, capabilities instead of ids: a WantRequest must present the transfer token that the
// prefill engine's RequestFinished returned (a hijacker that knows only the request id gets
// nothing), and a layer notice another peer forges is ignored. Also how many notices a request
// costs: one per layer pushed, one for a whole pulled request.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include "connector/connector.h"
#include "daemon/daemon.h"
#include "daemon/peer_auth.h"
#include "layout/plan.h"
#include "protocol/kvd.pb.h"
#include "tests/support/spy_transport.h"
#include "transport/transport.h"

namespace kv {
namespace {

using connector::Connector;
using connector::KvCache;
using connector::TransferParams;
using testing::SpyTransport;
using Clock = std::chrono::steady_clock;

const std::string kSecret(40, 's');

// Every kvd here holds the cluster secret: tokens are required unless `require_token` says.
std::shared_ptr<daemon::Daemon> StartDaemon(
    const std::string& name, std::optional<bool> require_token = std::nullopt,
    SpyTransport** spy = nullptr, const std::function<void(daemon::DaemonOptions&)>& tweak = {},
    std::string_view backend = "local", transport::TransportOptions backend_options = {}) {
  daemon::DaemonOptions options;
  options.name = name;
  options.auth_secret = kSecret;
  options.require_transfer_token = require_token;
  options.lease = std::chrono::milliseconds(10000);
  if (tweak) tweak(options);
  auto local = transport::CreateTransport(backend, std::move(backend_options));
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
                                  const std::string& instance, int tp_rank = 0, int tp_size = 1) {
  auto engine =
      Connector::OpenEmbedded(d, {instance, tp_rank, tp_size, std::chrono::milliseconds(5000)});
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return nullptr;
  LayoutSpec spec = TinySpec();
  spec.tp_rank = tp_rank;
  spec.tp_size = tp_size;
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

// Until `d` holds `n` Wants waiting for their transfer token (DaemonStatus.wants_held), within
// 5 s.
bool WantsHeld(const std::shared_ptr<daemon::Daemon>& d, uint32_t n) {
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < until) {
    if (d->Snapshot().wants_held() == n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// An engine-chosen token (the vLLM connector's scheduler mints one per request).
std::string Token(char fill) {
  return std::string(connector::kMinTransferTokenBytes, fill);
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

// vLLM's flow: the scheduler mints the token and hands it to the decode side at once; the
// prefill ranks pass it to kvd a scheduler step later, so the decode's Want may come first. It
// waits for the token instead of failing, and nothing moves before the token matched.
TEST(TransferToken, AWantThatComesBeforeTheEnginesTokenWaitsForIt) {
  auto prefill = StartDaemon("prefill-node");
  auto decode = StartDaemon("decode-node");
  ASSERT_TRUE(prefill && decode);
  auto source = Engine(prefill, "prefill");
  auto sink = Engine(decode, "decode");
  ASSERT_TRUE(source && sink);
  const std::vector<int64_t> source_blocks = {0}, blocks = {1};
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(source->SaveLayer("r", l, source_blocks).ok());
  TransferParams params;
  params.peer_address = prefill->listen_address();
  params.tokens = 16;
  params.transfer_token = Token('k');
  ASSERT_TRUE(sink->StartLoad("r", params, blocks).ok());
  ASSERT_TRUE(WantsHeld(prefill, 1)) << "the early Want was not held";
  EXPECT_EQ(decode->Snapshot().bytes_received(), 0u);

  auto finished = source->RequestFinished("r", Token('k'));
  ASSERT_TRUE(finished.ok()) << finished.status().ToString();
  EXPECT_EQ(finished->transfer_token, Token('k'));
  for (int l = 0; l < 2; ++l) EXPECT_TRUE(sink->WaitLayer("r", l).ok());
  EXPECT_TRUE(Released(*source, "r"));
  EXPECT_EQ(prefill->Snapshot().wants_held(), 0u);
  EXPECT_NE(decode->Snapshot().bytes_received(), 0u);
}

// The same before the prefill saved anything: the Want names a request kvd does not know yet.
TEST(TransferToken, AWantBeforeAnySaveWaitsForTheToken) {
  auto prefill = StartDaemon("prefill-node");
  auto decode = StartDaemon("decode-node");
  ASSERT_TRUE(prefill && decode);
  auto source = Engine(prefill, "prefill");
  auto sink = Engine(decode, "decode");
  ASSERT_TRUE(source && sink);
  TransferParams params;
  params.peer_address = prefill->listen_address();
  params.tokens = 16;
  params.transfer_token = Token('k');
  ASSERT_TRUE(sink->StartLoad("r", params, {std::vector<int64_t>{1}}).ok());
  ASSERT_TRUE(WantsHeld(prefill, 1));
  const std::vector<int64_t> source_blocks = {0};
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(source->SaveLayer("r", l, source_blocks).ok());
  ASSERT_TRUE(source->RequestFinished("r", Token('k')).ok());
  for (int l = 0; l < 2; ++l) EXPECT_TRUE(sink->WaitLayer("r", l).ok());
  EXPECT_TRUE(Released(*source, "r"));
}

TEST(TransferToken, AnEarlyWantWithAWrongTokenIsRefusedOnceTheTokenIsKnown) {
  auto prefill = StartDaemon("prefill-node");
  auto honest = StartDaemon("decode-node");
  auto thief = StartDaemon("thief-node");
  ASSERT_TRUE(prefill && honest && thief);
  auto source = Engine(prefill, "prefill");
  auto victim_sink = Engine(honest, "decode");
  auto thief_sink = Engine(thief, "thief");
  ASSERT_TRUE(source && victim_sink && thief_sink);
  const std::vector<int64_t> source_blocks = {0}, blocks = {1};
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(source->SaveLayer("r", l, source_blocks).ok());
  TransferParams params;
  params.peer_address = prefill->listen_address();
  params.tokens = 16;
  params.transfer_token = Token('x');  // a guess, asked first
  ASSERT_TRUE(thief_sink->StartLoad("r", params, blocks).ok());
  ASSERT_TRUE(WantsHeld(prefill, 1));
  params.transfer_token = Token('k');
  ASSERT_TRUE(victim_sink->StartLoad("r", params, blocks).ok());
  ASSERT_TRUE(WantsHeld(prefill, 2));

  ASSERT_TRUE(source->RequestFinished("r", Token('k')).ok());
  Status s = thief_sink->WaitLayer("r", 0);
  ASSERT_FALSE(s.ok()) << "a Want with a wrong token was served";
  EXPECT_NE(s.message().find("transfer token does not match"), std::string::npos) << s.ToString();
  for (int l = 0; l < 2; ++l) EXPECT_TRUE(victim_sink->WaitLayer("r", l).ok());
  EXPECT_TRUE(Released(*source, "r"));
  EXPECT_EQ(thief->Snapshot().bytes_received(), 0u);
}

TEST(TransferToken, RanksThatFinishWithDifferentTokensFailTheRequest) {
  auto prefill = StartDaemon("prefill-node");
  ASSERT_TRUE(prefill);
  auto rank0 = Engine(prefill, "prefill", 0, 2);
  auto rank1 = Engine(prefill, "prefill", 1, 2);
  ASSERT_TRUE(rank0 && rank1);
  const std::vector<int64_t> blocks = {0};
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(rank0->SaveLayer("r", l, blocks).ok());
    ASSERT_TRUE(rank1->SaveLayer("r", l, blocks).ok());
  }
  ASSERT_TRUE(rank0->RequestFinished("r", Token('a')).ok());
  auto second = rank1->RequestFinished("r", Token('b'));
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("different transfer tokens"), std::string::npos)
      << second.status().ToString();
  EXPECT_TRUE(Released(*rank0, "r"));  // the request ended: its blocks are free
  EXPECT_EQ(prefill->Snapshot().transfers_failed(), 1u);
  // A rank that lets kvd choose gets the token the first rank fixed.
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(rank0->SaveLayer("r2", l, blocks).ok());
    ASSERT_TRUE(rank1->SaveLayer("r2", l, blocks).ok());
  }
  ASSERT_TRUE(rank0->RequestFinished("r2", Token('a')).ok());
  auto kvds = rank1->RequestFinished("r2");
  ASSERT_TRUE(kvds.ok()) << kvds.status().ToString();
  EXPECT_EQ(kvds->transfer_token, Token('a'));
}

TEST(TransferToken, AnEnginesTokenMustHave16To32Bytes) {
  auto prefill = StartDaemon("prefill-node");
  ASSERT_TRUE(prefill);
  auto source = Engine(prefill, "prefill");
  ASSERT_TRUE(source);
  const std::vector<int64_t> blocks = {0};
  ASSERT_TRUE(source->SaveLayer("r", 0, blocks).ok());
  for (size_t n : {size_t{0}, size_t{15}, size_t{33}}) {
    auto finished = source->RequestFinished("r", std::string(n, 't'));
    ASSERT_FALSE(finished.ok()) << n;
    EXPECT_EQ(finished.status().code(), Code::kInvalidArgument) << n;
  }
  EXPECT_TRUE(source->RequestFinished("r", std::string(32, 't')).ok());
}

TEST(TransferToken, AHeldWantIsRefusedWhenItsLeaseEnds) {
  auto prefill = StartDaemon("prefill-node", std::nullopt, nullptr, [](daemon::DaemonOptions& o) {
    o.lease = std::chrono::milliseconds(200);
    o.heartbeat_interval = std::chrono::milliseconds(100);  // the sweep runs every 50 ms
  });
  auto decode = StartDaemon("decode-node");  // its own lease: 10 s
  ASSERT_TRUE(prefill && decode);
  auto sink = Engine(decode, "decode");
  ASSERT_TRUE(sink);
  TransferParams params;
  params.peer_address = prefill->listen_address();
  params.tokens = 16;
  params.transfer_token = Token('k');
  ASSERT_TRUE(sink->StartLoad("r", params, {std::vector<int64_t>{1}}).ok());
  Status s = sink->WaitLayer("r", 0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("with a transfer token within"), std::string::npos) << s.ToString();
  EXPECT_TRUE(WantsHeld(prefill, 0));
}

TEST(TransferToken, HeldWantsCountAgainstThePeersRequestLimit) {
  auto prefill = StartDaemon("prefill-node", std::nullopt, nullptr,
                             [](daemon::DaemonOptions& o) { o.max_requests_per_peer = 1; });
  auto decode = StartDaemon("decode-node");
  ASSERT_TRUE(prefill && decode);
  auto sink = Engine(decode, "decode");
  ASSERT_TRUE(sink);
  TransferParams params;
  params.peer_address = prefill->listen_address();
  params.tokens = 16;
  params.transfer_token = Token('k');
  ASSERT_TRUE(sink->StartLoad("r1", params, {std::vector<int64_t>{1}}).ok());
  ASSERT_TRUE(WantsHeld(prefill, 1));
  ASSERT_TRUE(sink->StartLoad("r2", params, {std::vector<int64_t>{2}}).ok());
  Status s = sink->WaitLayer("r2", 0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kResourceExhausted) << s.ToString();
  EXPECT_EQ(prefill->Snapshot().wants_held(), 1u);
}

// ---- tokens fixed before the request finishes (SetTransferToken) -------------------------------

// A router mints the token when the prefill starts: the prefill fixes it before its first save
// and the decode presents it, so with tokens required layer 0 streams while the prefill still
// runs (layer 1 not saved, the request not finished), one Want before the token and one after.
TEST(EarlyTransferToken, AWantPresentingItStreamsLayersBeforeTheRequestFinished) {
  auto prefill = StartDaemon("prefill-node");
  auto decode = StartDaemon("decode-node");
  ASSERT_TRUE(prefill && decode);
  auto source = Engine(prefill, "prefill");
  auto sink = Engine(decode, "decode");
  ASSERT_TRUE(source && sink);
  const std::vector<int64_t> source_blocks = {0};
  TransferParams params;
  params.peer_address = prefill->listen_address();
  params.tokens = 16;
  params.transfer_token = Token('k');
  // "a": the Want comes first and is held until the token is fixed.
  ASSERT_TRUE(sink->StartLoad("a", params, {std::vector<int64_t>{1}}).ok());
  ASSERT_TRUE(WantsHeld(prefill, 1));
  ASSERT_TRUE(source->SetTransferToken("a", Token('k')).ok());
  ASSERT_TRUE(WantsHeld(prefill, 0)) << "the token did not release the held Want";
  // "r": the token first, then the Want.
  ASSERT_TRUE(source->SetTransferToken("r", Token('k')).ok());
  ASSERT_TRUE(sink->StartLoad("r", params, {std::vector<int64_t>{2}}).ok());
  for (const char* id : {"a", "r"}) ASSERT_TRUE(source->SaveLayer(id, 0, source_blocks).ok());

  for (const char* id : {"a", "r"}) {
    Status s = sink->WaitLayer(id, 0);
    ASSERT_TRUE(s.ok()) << id << ": " << s.ToString();
  }
  EXPECT_TRUE(source->GetFinished().sent.empty()) << "a request ended before it was finished";
  EXPECT_EQ(prefill->Snapshot().transfers_done(), 0u);
  EXPECT_NE(decode->Snapshot().bytes_received(), 0u);

  for (const char* id : {"a", "r"}) {
    ASSERT_TRUE(source->SaveLayer(id, 1, source_blocks).ok());
    auto finished = source->RequestFinished(id);  // no token: the fixed one comes back
    ASSERT_TRUE(finished.ok()) << finished.status().ToString();
    EXPECT_EQ(finished->transfer_token, Token('k'));
    EXPECT_TRUE(sink->WaitLayer(id, 1).ok());
    EXPECT_TRUE(Released(*source, id));
  }
}

// A token presented early that is not the fixed one is refused, whether the Want came before the
// token was fixed (held, then refused) or after; nothing reaches the thief, and the honest
// destination still loads the request.
TEST(EarlyTransferToken, AWrongTokenPresentedEarlyIsRefused) {
  auto prefill = StartDaemon("prefill-node");
  auto honest = StartDaemon("decode-node");
  auto thief = StartDaemon("thief-node");
  ASSERT_TRUE(prefill && honest && thief);
  auto source = Engine(prefill, "prefill");
  auto sink = Engine(honest, "decode");
  auto early_thief = Engine(thief, "thief");
  auto late_thief = Engine(thief, "thief-2");
  ASSERT_TRUE(source && sink && early_thief && late_thief);
  TransferParams params;
  params.peer_address = prefill->listen_address();
  params.tokens = 16;
  params.transfer_token = Token('x');  // a guess
  const std::vector<int64_t> blocks = {1};
  ASSERT_TRUE(early_thief->StartLoad("r", params, blocks).ok());
  ASSERT_TRUE(WantsHeld(prefill, 1));
  ASSERT_TRUE(source->SetTransferToken("r", Token('k')).ok());
  const std::vector<int64_t> source_blocks = {0};
  ASSERT_TRUE(source->SaveLayer("r", 0, source_blocks).ok());
  Status s = early_thief->WaitLayer("r", 0);
  ASSERT_FALSE(s.ok()) << "a held Want with a wrong token was served";
  EXPECT_NE(s.message().find("transfer token does not match"), std::string::npos) << s.ToString();
  ASSERT_TRUE(late_thief->StartLoad("r", params, blocks).ok());
  s = late_thief->WaitLayer("r", 0);
  ASSERT_FALSE(s.ok()) << "a Want with a wrong token was served";
  EXPECT_NE(s.message().find("transfer token does not match"), std::string::npos) << s.ToString();

  params.transfer_token = Token('k');
  ASSERT_TRUE(sink->StartLoad("r", params, blocks).ok());
  ASSERT_TRUE(sink->WaitLayer("r", 0).ok());
  ASSERT_TRUE(source->SaveLayer("r", 1, source_blocks).ok());
  ASSERT_TRUE(source->RequestFinished("r", Token('k')).ok());
  EXPECT_TRUE(sink->WaitLayer("r", 1).ok());
  EXPECT_TRUE(Released(*source, "r"));
  EXPECT_EQ(thief->Snapshot().bytes_received(), 0u);
}

// A token fixed early, then another one at RequestFinished: the request fails on every side, as
// when two ranks finish it with different tokens, also after a layer already streamed (the
// destination's next layer never comes).
TEST(EarlyTransferToken, AnotherTokenAtRequestFinishedFailsTheRequest) {
  auto prefill = StartDaemon("prefill-node");
  auto decode = StartDaemon("decode-node");
  ASSERT_TRUE(prefill && decode);
  auto source = Engine(prefill, "prefill");
  auto sink = Engine(decode, "decode");
  ASSERT_TRUE(source && sink);
  ASSERT_TRUE(source->SetTransferToken("r", Token('k')).ok());
  TransferParams params;
  params.peer_address = prefill->listen_address();
  params.tokens = 16;
  params.transfer_token = Token('k');
  ASSERT_TRUE(sink->StartLoad("r", params, {std::vector<int64_t>{1}}).ok());
  const std::vector<int64_t> source_blocks = {0};
  ASSERT_TRUE(source->SaveLayer("r", 0, source_blocks).ok());
  ASSERT_TRUE(sink->WaitLayer("r", 0).ok());
  auto finished = source->RequestFinished("r", Token('b'));
  ASSERT_FALSE(finished.ok()) << "a second token was taken";
  EXPECT_NE(finished.status().message().find("different transfer tokens"), std::string::npos)
      << finished.status().ToString();
  Status s = sink->WaitLayer("r", 1);
  EXPECT_FALSE(s.ok()) << "the destination did not hear of the failure";
  EXPECT_TRUE(Released(*source, "r"));
  EXPECT_EQ(prefill->Snapshot().transfers_failed(), 1u);
}

// Every rank of a TP prefill may fix the token; the first fixes it. A rank that gives another
// one (before it saved anything) fails the request: both ranks hear it, and RequestFinished says
// why. Sizes are checked in the connector.
TEST(EarlyTransferToken, EveryRankMaySetItAndTheFirstFixesIt) {
  auto prefill = StartDaemon("prefill-node");
  ASSERT_TRUE(prefill);
  auto rank0 = Engine(prefill, "prefill", 0, 2);
  auto rank1 = Engine(prefill, "prefill", 1, 2);
  ASSERT_TRUE(rank0 && rank1);
  const std::vector<int64_t> blocks = {0};
  ASSERT_TRUE(rank0->SetTransferToken("r", Token('a')).ok());
  ASSERT_TRUE(rank1->SetTransferToken("r", Token('a')).ok());
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(rank0->SaveLayer("r", l, blocks).ok());
    ASSERT_TRUE(rank1->SaveLayer("r", l, blocks).ok());
  }
  for (auto* rank : {rank0.get(), rank1.get()}) {
    auto finished = rank->RequestFinished("r");
    ASSERT_TRUE(finished.ok()) << finished.status().ToString();
    EXPECT_EQ(finished->transfer_token, Token('a'));
  }

  ASSERT_TRUE(rank0->SetTransferToken("r2", Token('a')).ok());
  ASSERT_TRUE(rank0->SaveLayer("r2", 0, blocks).ok());
  // One-way messages of two connections: a round trip on rank 0's makes kvd take its token and
  // save before rank 1's token.
  ASSERT_TRUE(rank0->DaemonStatusJson().ok());
  ASSERT_TRUE(rank1->SetTransferToken("r2", Token('b')).ok());  // one-way: kvd refuses it
  EXPECT_TRUE(Released(*rank0, "r2"));
  EXPECT_TRUE(Released(*rank1, "r2"));
  auto second = rank1->RequestFinished("r2");
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("different transfer tokens"), std::string::npos)
      << second.status().ToString();
  EXPECT_EQ(prefill->Snapshot().transfers_failed(), 1u);

  for (size_t n : {size_t{0}, size_t{15}, size_t{33}}) {
    Status s = rank0->SetTransferToken("r3", std::string(n, 't'));
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << n << ": " << s.ToString();
  }
  // Only "r" is still held (no destination wanted it): the refused tokens made no request.
  EXPECT_EQ(prefill->Snapshot().transfers_in_flight(), 1u);
}

// A rank that fixed the token but saved nothing yet is one of the request's engines all the
// same: when it leaves, the request fails (the other rank hears it) instead of waiting for a
// save that never comes until its lease ends.
TEST(EarlyTransferToken, ARankThatFixedTheTokenAndLeftFailsTheRequest) {
  auto prefill = StartDaemon("prefill-node");
  ASSERT_TRUE(prefill);
  auto rank0 = Engine(prefill, "prefill", 0, 2);
  auto rank1 = Engine(prefill, "prefill", 1, 2);
  ASSERT_TRUE(rank0 && rank1);
  ASSERT_TRUE(rank1->SetTransferToken("r", Token('a')).ok());
  ASSERT_TRUE(rank1->DaemonStatusJson().ok());  // a round trip: kvd took the token
  ASSERT_TRUE(rank0->SaveLayer("r", 0, std::vector<int64_t>{0}).ok());
  ASSERT_TRUE(rank0->DaemonStatusJson().ok());
  rank1.reset();
  EXPECT_TRUE(Released(*rank0, "r"));
  auto finished = rank0->RequestFinished("r");
  ASSERT_FALSE(finished.ok());
  EXPECT_EQ(finished.status().code(), Code::kAborted) << finished.status().ToString();
  EXPECT_NE(finished.status().message().find("disconnected"), std::string::npos)
      << finished.status().ToString();
}

// A prefill kvd whose transport `spy` watches and a decode kvd, an engine on each.
struct SpiedPair {
  SpyTransport* spy = nullptr;
  std::shared_ptr<daemon::Daemon> prefill = StartDaemon("prefill-node", std::nullopt, &spy);
  std::shared_ptr<daemon::Daemon> decode = StartDaemon("decode-node");
  std::unique_ptr<Connector> source = prefill ? Engine(prefill, "prefill") : nullptr;
  std::unique_ptr<Connector> sink = decode ? Engine(decode, "decode") : nullptr;

  bool ok() const { return spy != nullptr && source && sink; }
  // Request `id` saved (both layers, block 0) and finished: its params, to load in `mode`.
  Result<TransferParams> Saved(const std::string& id, connector::Mode mode) {
    const std::vector<int64_t> source_blocks = {0};
    for (int l = 0; l < 2; ++l) KV_RETURN_IF_ERROR(source->SaveLayer(id, l, source_blocks));
    KV_ASSIGN_OR_RETURN(TransferParams params, source->RequestFinished(id));
    params.tokens = 16;
    params.mode = mode;
    return params;
  }
};

// A pull moves the whole request as one plan, and one notice then says that every layer of it is
// in place (each notice is a transport send, a receive and an engine message, all behind the
// request's last batch); a push sends one per layer. Either way every layer is in place, with
// the source's bytes, once the engine hears of it.
TEST(LayerNotices, APullNamesItsWholeRequestInOneNotice) {
  SpiedPair pair;
  ASSERT_TRUE(pair.ok());
  auto& [spy, prefill, decode, source, sink] = pair;
  auto pulled = pair.Saved("pulled", connector::Mode::kPull);
  auto pushed = pair.Saved("pushed", connector::Mode::kPush);
  ASSERT_TRUE(pulled.ok() && pushed.ok());
  const std::vector<int64_t> blocks = {1};

  ASSERT_TRUE(sink->StartLoad("pulled", *pulled, blocks).ok());
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(sink->WaitLayer("pulled", l).ok()) << "layer " << l;
  EXPECT_TRUE(Released(*source, "pulled"));
  EXPECT_EQ(spy->notifies(), 1);
  const uint64_t request_bytes = prefill->Snapshot().bytes_sent();
  EXPECT_GT(request_bytes, 0u);
  EXPECT_EQ(decode->Snapshot().bytes_received(), request_bytes);

  ASSERT_TRUE(sink->StartLoad("pushed", *pushed, blocks).ok());
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(sink->WaitLayer("pushed", l).ok()) << "layer " << l;
  EXPECT_TRUE(Released(*source, "pushed"));
  EXPECT_EQ(spy->notifies(), 1 + 2);
  EXPECT_EQ(decode->Snapshot().bytes_received(), 2 * request_bytes);
}

// A pull whose layers are cut into rows (LBNHC -> BLHNC: a row per head and token of a page) is
// planned layer by layer, as groups of rows, where the backend takes groups: planned whole it was
// one run per row (1,048,576 for a Llama-3-8B request of 4096 tokens; on two H200s such pulls ran
// at 0.05 of the link, benchmarks/pd_gpu.md). Every byte lands either way.
TEST(LayerNotices, APullThatCutsPagesIntoRowsGoesAsGroups) {
  // The side-channel sockets' directory, removed last (declared first) whatever fails.
  struct Dir {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("kvd-rows-" + std::to_string(getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() { std::filesystem::remove_all(path); }
  } const dir_guard;
  const std::filesystem::path& dir = dir_guard.path;
  transport::TransportOptions host_ipc;
  host_ipc.settings = {{"socket_dir", dir.string()}};
  SpyTransport* spy = nullptr;
  auto prefill = StartDaemon("prefill-node", std::nullopt, &spy, {}, "host_ipc", host_ipc);
  auto decode = StartDaemon("decode-node", std::nullopt, nullptr, {}, "host_ipc", host_ipc);
  ASSERT_TRUE(prefill && decode && spy);
  LayoutSpec from = TinySpec();
  from.heads = 4;
  LayoutSpec to = from;
  to.order = "BLHNC";
  auto open = [&](const std::shared_ptr<daemon::Daemon>& d, const std::string& instance,
                  const LayoutSpec& spec) -> std::pair<std::unique_ptr<Connector>, KvCache> {
    auto engine = Connector::OpenEmbedded(d, {instance, 0, 1, std::chrono::milliseconds(5000)});
    if (!engine.ok()) return {};
    auto caches = (*engine)->RegisterKvCaches(connector::HostCaches({&spec, 1}));
    if (!caches.ok()) return {};
    return {std::move(*engine), caches->front()};
  };
  auto [source, source_cache] = open(prefill, "prefill", from);
  auto [sink, sink_cache] = open(decode, "decode", to);
  ASSERT_TRUE(source && sink);
  const KvRegion src = connector::RegionOf(source_cache), dst = connector::RegionOf(sink_cache);
  for (uint64_t i = 0; i < src.spec().blocks * src.page_bytes() * src.spec().layers; ++i) {
    static_cast<unsigned char*>(source_cache.base)[i] = static_cast<unsigned char>(i * 7 + 1);
  }
  const std::vector<int64_t> source_blocks = {2, 0}, sink_blocks = {1, 3};
  for (int l = 0; l < from.layers; ++l) ASSERT_TRUE(source->SaveLayer("r", l, source_blocks).ok());
  auto params = source->RequestFinished("r");
  ASSERT_TRUE(params.ok()) << params.status().ToString();
  params->tokens = 2 * from.block_size;
  params->mode = connector::Mode::kPull;
  ASSERT_TRUE(sink->StartLoad("r", *params, sink_blocks).ok());
  for (int l = 0; l < from.layers; ++l) ASSERT_TRUE(sink->WaitLayer("r", l).ok()) << l;
  EXPECT_TRUE(Released(*source, "r"));
  // Whatever the entries, the bytes: the plan's runs, copied here by hand, give the same pages.
  TransferSpec spec;
  spec.src_blocks = source_blocks;
  spec.dst_blocks = sink_blocks;
  spec.tokens = params->tokens;
  auto plan = PlanTransfer(src, dst, spec);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // A row per (block, layer, head, token).
  EXPECT_EQ(plan->runs.size(), static_cast<size_t>(2 * from.layers * from.heads * from.block_size));
  for (const kv::Run& run : plan->runs) {
    ASSERT_EQ(std::memcmp(static_cast<const char*>(sink_cache.base) + run.dst_offset,
                          static_cast<const char*>(source_cache.base) + run.src_offset, run.length),
              0);
  }
  const auto& posted = spy->counters();
  EXPECT_EQ(posted.runs_posted.load(), 0u);
  EXPECT_GT(posted.groups_posted.load() + posted.blocks_posted.load(), 0u);
  EXPECT_LT(posted.groups_posted.load(), plan->runs.size());
}

// A source's notices are checked before they count: a range that is empty, reversed, starts
// below 0 or runs past the request's layers is ignored (no layer marked, no byte counted), and so
// is one that names a layer in place already.
TEST(LayerNotices, ARangeOutOfBoundsEmptyOrOverlappingIsIgnored) {
  SpiedPair pair;
  ASSERT_TRUE(pair.ok());
  auto& [spy, prefill, decode, source, sink] = pair;
  // Each real notice names layers [0, 2) (a pull). Ahead of it go the bad ranges, with its
  // token; for "overlapped" also layer 1 alone, which the real one then overlaps.
  spy->SendAheadOfNotes([](const std::string& message) {
    proto::LayerNotice real;
    std::vector<std::string> ahead;
    if (!real.ParseFromString(message)) return ahead;
    auto range = [&](int begin, int end, uint64_t bytes) {
      proto::LayerNotice notice = real;
      notice.set_layer(begin);
      notice.set_layer_end(end);
      notice.set_bytes(bytes);
      ahead.push_back(notice.SerializeAsString());
    };
    for (auto [begin, end] : std::vector<std::pair<int, int>>{{0, 3}, {1, 1}, {-1, 1}, {1, -2}}) {
      range(begin, end, 1000003);
    }
    if (real.request_id() == "overlapped") range(1, 0, 7);  // layer 1 alone
    return ahead;
  });
  auto clean = pair.Saved("clean", connector::Mode::kPull);
  auto overlapped = pair.Saved("overlapped", connector::Mode::kPull);
  ASSERT_TRUE(clean.ok() && overlapped.ok());
  const std::vector<int64_t> blocks = {1};

  ASSERT_TRUE(sink->StartLoad("clean", *clean, blocks).ok());
  for (int l = 0; l < 2; ++l) ASSERT_TRUE(sink->WaitLayer("clean", l).ok()) << "layer " << l;
  EXPECT_TRUE(Released(*source, "clean"));
  const uint64_t request_bytes = prefill->Snapshot().bytes_sent();
  EXPECT_GT(request_bytes, 0u);
  EXPECT_EQ(decode->Snapshot().bytes_received(), request_bytes) << "a bad range counted";

  ASSERT_TRUE(sink->StartLoad("overlapped", *overlapped, blocks).ok());
  ASSERT_TRUE(sink->WaitLayer("overlapped", 1).ok());
  // Layer 0 came only in the real notice, which overlapped layer 1 in place: the connector's
  // wait runs out (5 s).
  EXPECT_FALSE(sink->WaitLayer("overlapped", 0).ok()) << "an overlapping notice was taken";
  EXPECT_EQ(decode->Snapshot().bytes_received(), request_bytes + 7);
}

}  // namespace
}  // namespace kv
