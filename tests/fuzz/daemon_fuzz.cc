// libFuzzer targets: kvd's engine and peer message handlers, in one in-process kvd
// (daemon_harness.h). fuzz_daemon runs kvd without a secret (loopback peers): an input reaches
// every engine handler after a valid hello and registration, and every peer handler after a
// valid PeerHello. fuzz_daemon_auth (KV_FUZZ_AUTH) runs kvd with a secret: the peer messages are
// what a peer without it can send, before authentication.
//
// An input is a setup byte, then records: a tag byte, a little-endian u16 length, that many
// bytes (short at the end).
//   setup: bit 0 no engine hello, bit 1 no registration, bits 2-3 the registered layout,
//          bit 4 no peer hello, bit 5 no peer connection, bit 6 the engine says TP size 2.
//   tag % 5: 0 an EngineMessage, 1 a PeerMessage, 2 raw bytes on the engine socket, 3 raw bytes
//          on the peer socket, 4 an engine status round trip.
// A record that parses as its message is normalised before it is framed and sent: request ids
// onto a small set ("r0".."r3", two offload ids) so that one input's messages meet in kvd's
// state machines; a StartLoad's peer onto kvd itself, a closed port or a daemon name (never an
// address outside this process); a one-byte or empty transport address or descriptor onto the
// fuzz peer's real ones; a RegisterRegion that says memfd gets a sealed memfd. One that does not
// parse is sent as the frame's body as it is.
// After the records: the peer side half-closes and kvd must close it within 10 s (it read every
// byte), then kvd must answer a status query (on the input's engine, else a fresh one) within
// 10 s. Otherwise the harness aborts: a hung or dead kvd is a crash to libFuzzer.
#include <fcntl.h>
#include <unistd.h>

#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "layout/kv_region.h"
#include "protocol/wire_layout.h"
#include "tests/fuzz/daemon_harness.h"

namespace {

using kv::fuzz::Channel;
using kv::fuzz::Harness;
using Clock = std::chrono::steady_clock;

kv::fuzz::HarnessOptions Options() {
  kv::fuzz::HarnessOptions options;
#ifdef KV_FUZZ_AUTH
  options.auth_secret = std::string(32, 's');
#endif
  return options;
}

// The layouts an input's engine registers (setup bits 2-3): small, so that kvd maps little.
kv::LayoutSpec Layout(int which) {
  kv::LayoutSpec s;
  s.layers = 2;
  s.blocks = 8;
  s.heads = 2;
  s.block_size = 4;
  s.content_bytes = 16;
  switch (which & 3) {
    case 1:
      s.order = "BLHNC";
      break;
    case 2:
      s.order = "SBNHC";
      s.heads = 1;
      s.block_size = 8;
      s.content_bytes = 8;
      break;
    case 3:  // MLA
      s.heads = 1;
      s.block_size = 16;
      s.content_bytes = 32;
      s.replicated = true;
      break;
    default:
      break;
  }
  return s;
}

std::string MapId(const std::string& id) {
  static const char* const kIds[] = {"r0", "r1", "r2", "r3", "offload:0", "offload:1"};
  if (id.empty()) return id;
  for (const char* known : kIds) {
    if (id == known) return id;
  }
  return kIds[static_cast<unsigned char>(id[0]) % 6];
}

std::string MapAddress(const std::string& address, const Harness& h) {
  if (address.empty()) return address;
  if (address == "self") return h.listen_address();
  switch (static_cast<unsigned char>(address[0]) % 3) {
    case 0:
      return h.listen_address();
    case 1:
      return "127.0.0.1:1";  // nobody listens there
    default:
      return "kvd-by-name";  // a daemon name: this kvd has no etcd
  }
}

void Normalise(kv::proto::EngineMessage& m, const Harness& h) {
  switch (m.body_case()) {
    case kv::proto::EngineMessage::kSaveLayer:
      m.mutable_save_layer()->set_request_id(MapId(m.save_layer().request_id()));
      break;
    case kv::proto::EngineMessage::kRequestFinished:
      m.mutable_request_finished()->set_request_id(MapId(m.request_finished().request_id()));
      break;
    case kv::proto::EngineMessage::kSetTransferToken:
      m.mutable_set_transfer_token()->set_request_id(MapId(m.set_transfer_token().request_id()));
      break;
    case kv::proto::EngineMessage::kStartLoad: {
      auto* load = m.mutable_start_load();
      load->set_request_id(MapId(load->request_id()));
      load->set_peer_address(MapAddress(load->peer_address(), h));
      break;
    }
    case kv::proto::EngineMessage::kStartLoads:
      for (auto& load : *m.mutable_start_loads()->mutable_loads()) {
        load.set_request_id(MapId(load.request_id()));
        load.set_peer_address(MapAddress(load.peer_address(), h));
      }
      break;
    case kv::proto::EngineMessage::kOffloadStore:
      m.mutable_offload_store()->set_request_id(MapId(m.offload_store().request_id()));
      break;
    case kv::proto::EngineMessage::kOffloadLoad:
      m.mutable_offload_load()->set_request_id(MapId(m.offload_load().request_id()));
      break;
    default:
      break;
  }
}

void Normalise(kv::proto::PeerMessage& m, const Harness& h) {
  switch (m.body_case()) {
    case kv::proto::PeerMessage::kHello: {
      auto* hello = m.mutable_hello();
      if (hello->transport_address().size() <= 1) {
        hello->set_transport_address(h.peer_transport_address());
      }
      if (hello->transport().empty()) hello->set_transport("local");
      break;
    }
    case kv::proto::PeerMessage::kWant: {
      auto* want = m.mutable_want();
      want->set_request_id(MapId(want->request_id()));
      for (auto& rank : *want->mutable_ranks()) {
        for (auto& d : *rank.mutable_descriptors()) {
          if (d.size() <= 1) d = h.peer_descriptor();
        }
      }
      break;
    }
    case kv::proto::PeerMessage::kConfirm:
      m.mutable_confirm()->set_request_id(MapId(m.confirm().request_id()));
      break;
    case kv::proto::PeerMessage::kFail:
      m.mutable_fail()->set_request_id(MapId(m.fail().request_id()));
      break;
    default:
      break;
  }
}

void SendEngineMessage(Channel& engine, const std::string& body, const Harness& h) {
  kv::proto::EngineMessage m;
  if (!m.ParseFromString(body)) {
    std::string frame;
    if (kv::AppendFrame(body, &frame, 1u << 20).ok()) engine.SendRaw(frame);
    return;
  }
  Normalise(m, h);
  int fd = -1;
  if (m.has_register_region() && m.register_region().has_memfd()) {
    const uint64_t claimed = m.register_region().object_bytes();
    fd = Harness::MakeSealedMemfd(claimed == 0 ? 64u << 10 : std::min<uint64_t>(claimed, 1u << 20));
  }
  engine.SendFrame(m, fd);
  if (fd >= 0) {
    close(fd);  // kvd holds its own copy
    // As the connector does: the next message (and fd) only once this registration is answered.
    (void)Harness::StatusRoundTrip(engine, Clock::now() + std::chrono::seconds(10));
  }
}

void SendPeerMessage(Channel& peer, const std::string& body, const Harness& h) {
  kv::proto::PeerMessage m;
  if (!m.ParseFromString(body)) {
    std::string frame;
    if (kv::AppendFrame(body, &frame, 1u << 20).ok()) peer.SendRaw(frame);
    return;
  }
  Normalise(m, h);
  peer.SendFrame(m);
}

void EnginePrelude(Channel& engine, uint8_t setup) {
  if (!(setup & 1)) {
    kv::proto::EngineMessage hello;
    hello.set_seq(1);
    auto* e = hello.mutable_hello();
    e->set_protocol_version(kv::proto::PROTOCOL_VERSION);
    e->set_instance("fuzz");
    e->set_tp_size(setup & 64 ? 2 : 1);
    engine.SendFrame(hello);
  }
  if (!(setup & 2)) {
    const auto region = kv::KvRegion::Create(Layout(setup >> 2));
    if (!region.ok()) std::abort();  // the table above is wrong
    kv::proto::EngineMessage reg;
    reg.set_seq(2);
    auto* r = reg.mutable_register_region();
    kv::proto::ToWire(region->spec(), r->mutable_layout());
    r->set_bytes(region->span_bytes());
    r->set_object_bytes(64u << 10);
    r->set_memfd(true);
    const int fd = Harness::MakeSealedMemfd(64u << 10);
    engine.SendFrame(reg, fd);
    close(fd);
    (void)Harness::StatusRoundTrip(engine, Clock::now() + std::chrono::seconds(10));
  }
}

void PeerPrelude(Channel& peer, uint8_t setup, Harness& h) {
#ifdef KV_FUZZ_AUTH
  return;  // a peer without the secret gets no further than the challenge
#endif
  if (setup & 16) return;
  const auto region = kv::KvRegion::Create(Layout(setup >> 2));
  kv::proto::PeerMessage m;
  auto* hello = m.mutable_hello();
  hello->set_protocol_version(kv::proto::PEER_PROTOCOL);
  hello->set_node_name("fuzz-peer");
  hello->set_transport("local");
  hello->set_transport_address(h.peer_transport_address());
  hello->set_tp_size(1);
  auto* rank = hello->add_ranks();
  rank->set_tp_rank(0);
  kv::proto::ToWire(region->spec(), rank->add_regions());
  // The records start once kvd has connected to the fuzz peer's transport: messages it holds
  // meanwhile would be dropped unread when the input's end closes the connection.
  if (peer.SendFrame(m)) (void)h.WaitPeerReady("fuzz-peer", Clock::now() + std::chrono::seconds(5));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // it logs every invalid UTF-8 string it refuses
  spdlog::set_level(std::getenv("KV_FUZZ_LOG") ? spdlog::level::debug : spdlog::level::off);
  std::signal(SIGPIPE, SIG_IGN);
  (void)Harness::Get(Options());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Harness& h = Harness::Get(Options());
  const uint8_t setup = data[0];
  auto engine = h.AttachEngine();
  if (!engine) {
    std::fprintf(stderr, "kvd fuzz harness: kvd refused an engine\n");
    std::abort();
  }
  EnginePrelude(*engine, setup);
  std::unique_ptr<Channel> peer;
  if (!(setup & 32)) {
    peer = h.ConnectPeer();
    if (peer) PeerPrelude(*peer, setup, h);
  }
  size_t at = 1;
  while (at < size) {
    const uint8_t tag = data[at++];
    size_t length = 0;
    if (at < size) length = data[at++];
    if (at < size) length |= static_cast<size_t>(data[at++]) << 8;
    length = std::min(length, size - at);
    const std::string body(reinterpret_cast<const char*>(data + at), length);
    at += length;
    switch (tag % 5) {
      case 0:
        if (engine->open()) SendEngineMessage(*engine, body, h);
        break;
      case 1:
        if (peer && peer->open()) SendPeerMessage(*peer, body, h);
        break;
      case 2:
        if (engine->open()) engine->SendRaw(body);
        break;
      case 3:
        if (peer && peer->open()) peer->SendRaw(body);
        break;
      default:
        if (engine->open()) {
          (void)Harness::StatusRoundTrip(*engine, Clock::now() + std::chrono::seconds(10));
        }
        break;
    }
  }
  if (peer && !peer->FinishAndDrain(Clock::now() + std::chrono::seconds(10))) {
    std::fprintf(stderr, "kvd fuzz harness: kvd kept a half-closed peer connection for 10 s: %s\n",
                 h.daemon().Snapshot().ShortDebugString().c_str());
    std::abort();
  }
  if (!engine->open() ||
      !Harness::StatusRoundTrip(*engine, Clock::now() + std::chrono::seconds(10))) {
    h.ExpectAlive(std::chrono::seconds(10));
  }
  return 0;
}
