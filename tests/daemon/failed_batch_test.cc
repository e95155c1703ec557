// A batch that fails must not be followed by its layer's notice: the decode engine would be told
// that bytes are in place which never arrived. The prefill kvd's transport here accepts every
// batch and reports it failed at once, before kvd hands over the notices of its pass (the
// transport thread's report reaching kvd ahead of the io thread's handling of it): kvd must hand
// over none of them, and the decode load ends with the failure. (Batches still moving when their
// notice is handed over are the transport's to hold: transport/note_gate.h.)
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "connector/connector.h"
#include "daemon/daemon.h"
#include "protocol/kvd.pb.h"
#include "tests/support/forwarding_transport.h"

namespace kv {
namespace {

using connector::Connector;
using connector::TransferParams;

constexpr auto kTimeout = std::chrono::milliseconds(5000);

// Forwards to a real backend and counts the layer notices of request "r" kvd hands it.
class NoticeCounting : public testing::ForwardingTransport {
 public:
  NoticeCounting(std::unique_ptr<transport::Transport> inner, std::atomic<int>* notices)
      : ForwardingTransport(std::move(inner)), notices_(notices) {}
  Status notify(transport::PeerId peer, std::string message) override {
    proto::LayerNotice notice;
    if (notice.ParseFromString(message) && notice.request_id() == "r") ++*notices_;
    return inner().notify(peer, std::move(message));
  }

 private:
  std::atomic<int>* notices_;
};

// Never moves a batch: each one fails as soon as it is posted.
class FailingTransport final : public NoticeCounting {
 public:
  using NoticeCounting::NoticeCounting;
  Status post(const transport::Batch&, transport::Completion done) override {
    done(Status::Unavailable("injected: the batch did not land"));
    return Status::Ok();
  }
};

// Refuses every batch when it is posted (a transport whose queue is full or whose peer is gone).
class RefusingTransport final : public NoticeCounting {
 public:
  using NoticeCounting::NoticeCounting;
  Status post(const transport::Batch&, transport::Completion) override {
    return Status::Unavailable("injected: the batch was refused");
  }
};

// `notices`: null for a plain local transport, else where the failing (or, with `refuse`, the
// refusing) one counts notices.
std::shared_ptr<daemon::Daemon> StartDaemon(const std::string& name, std::atomic<int>* notices,
                                            bool refuse = false) {
  daemon::DaemonOptions options;
  options.name = name;
  if (notices != nullptr) {
    auto local = transport::CreateTransport("local");
    EXPECT_TRUE(local.ok()) << local.status().ToString();
    if (!local.ok()) return nullptr;
    if (refuse) {
      options.transport = std::make_unique<RefusingTransport>(std::move(local).value(), notices);
    } else {
      options.transport = std::make_unique<FailingTransport>(std::move(local).value(), notices);
    }
  } else {
    options.transport_name = "local";
  }
  auto d = daemon::Daemon::Start(std::move(options));
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : nullptr;
}

LayoutSpec Spec() {
  LayoutSpec spec;
  spec.layers = 2;  // the test saves layers 0 and 1
  spec.blocks = 4;
  spec.heads = 2;
  spec.block_size = 16;
  spec.content_bytes = 64;
  return spec;
}

// A prefill kvd whose transport fails (or, with `refuse`, refuses) every batch, a plain decode
// kvd, an engine on each with one host cache of Spec() registered.
struct Pair {
  std::atomic<int> notices{0};
  std::shared_ptr<daemon::Daemon> prefill, decode;
  std::unique_ptr<Connector> source, sink;
  LayoutSpec spec = Spec();
  std::vector<connector::KvCache> src, dst;  // keep the registrations' caches

  // Gtest assertions inside; the caller checks ok() after.
  void Open(bool refuse) {
    prefill = StartDaemon("p", &notices, refuse);
    decode = StartDaemon("d", nullptr);
    ASSERT_TRUE(prefill && decode);
    auto s = Connector::OpenEmbedded(prefill, {"prefill", 0, 1, kTimeout});
    auto d = Connector::OpenEmbedded(decode, {"decode", 0, 1, kTimeout});
    ASSERT_TRUE(s.ok() && d.ok());
    source = std::move(*s);
    sink = std::move(*d);
    auto registered_src = source->RegisterKvCaches(connector::HostCaches({&spec, 1}));
    auto registered_dst = sink->RegisterKvCaches(connector::HostCaches({&spec, 1}));
    ASSERT_TRUE(registered_src.ok() && registered_dst.ok());
    src = std::move(*registered_src);
    dst = std::move(*registered_dst);
  }
  bool ok() const { return source && sink && !dst.empty(); }
};

TEST(FailedBatch, ItsLayerIsNeverReportedReady) {
  Pair pair;
  pair.Open(/*refuse=*/false);
  ASSERT_TRUE(pair.ok());

  TransferParams params;
  params.peer_address = pair.prefill->listen_address();
  params.tokens = 16;
  const std::vector<int64_t> block = {1};
  ASSERT_TRUE(pair.sink->StartLoad("r", params, block).ok());
  ASSERT_TRUE(pair.source->SaveLayer("r", 0, block).ok());
  // Layer 0's batch may have failed the request by now: the next save then reports that.
  const Status later = pair.source->SaveLayer("r", 1, block);
  if (!later.ok()) {
    EXPECT_EQ(later.code(), Code::kUnavailable) << later.ToString();
  }
  for (int l = 0; l < pair.spec.layers; ++l) {
    const Status waited = pair.sink->WaitLayer("r", l);
    EXPECT_FALSE(waited.ok()) << "layer " << l << " reported in place";
    EXPECT_NE(waited.code(), Code::kTimeout) << waited.ToString();  // kvd's failure, not a timeout
  }
  // Whether the decode side heard of the failure before a stray notice is a race; that kvd
  // handed over no notice at all is not.
  EXPECT_EQ(pair.notices.load(), 0);
}

// The Want arrives after every layer was saved: kvd posts the first layer while it plans the
// rest (SendQueue::PostIfIdle, inside the Want's handler), and the transport refuses it there.
// The request still ends with that error on both sides, and no notice of it is handed over.
TEST(FailedBatch, APostRefusedWhileTheWantIsPlannedEndsTheRequest) {
  Pair pair;
  pair.Open(/*refuse=*/true);
  ASSERT_TRUE(pair.ok());

  const std::vector<int64_t> block = {1};
  for (int l = 0; l < pair.spec.layers; ++l)
    ASSERT_TRUE(pair.source->SaveLayer("r", l, block).ok());
  // Answered after both saves were handled: the Want below finds every layer saved.
  auto finished = pair.source->RequestFinished("r");
  ASSERT_TRUE(finished.ok()) << finished.status().ToString();
  TransferParams params = *finished;
  params.tokens = 16;
  ASSERT_TRUE(pair.sink->StartLoad("r", params, block).ok());
  for (int l = 0; l < pair.spec.layers; ++l) {
    const Status waited = pair.sink->WaitLayer("r", l);
    EXPECT_FALSE(waited.ok()) << "layer " << l << " reported in place";
    EXPECT_NE(waited.code(), Code::kTimeout) << waited.ToString();
  }
  // The source side ends too: its engine hears the refusal.
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  bool heard = false;
  while (!heard && std::chrono::steady_clock::now() < deadline) {
    for (const auto& id : pair.source->GetFinished().sent) heard = heard || id == "r";
    if (!heard) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(heard) << "the prefill engine never heard that request r ended";
  EXPECT_EQ(pair.notices.load(), 0);
}

}  // namespace
}  // namespace kv
