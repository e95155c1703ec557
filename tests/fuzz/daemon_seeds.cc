// Writes the seed corpus of fuzz_daemon and fuzz_daemon_auth (daemon_fuzz.cc's input format) into
// DIR/daemon and DIR/daemon_auth: the flows an engine and a peer go through (save, finish and a
// peer's Want and Confirm; a Want before the save; loads, offload, a second registration) and
// the messages a peer without the secret may send. `fuzz_daemon_seeds DIR`.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "layout/kv_region.h"
#include "protocol/kvd.pb.h"
#include "protocol/wire_layout.h"

namespace {

enum Tag : uint8_t { kEngine = 0, kPeer = 1, kEngineRaw = 2, kPeerRaw = 3, kStatus = 4 };

class Seed {
 public:
  explicit Seed(uint8_t setup) { bytes_.push_back(static_cast<char>(setup)); }
  Seed& Add(Tag tag, const std::string& body) {
    bytes_.push_back(static_cast<char>(tag));
    bytes_.push_back(static_cast<char>(body.size() & 0xff));
    bytes_.push_back(static_cast<char>(body.size() >> 8));
    bytes_ += body;
    return *this;
  }
  Seed& Engine(const kv::proto::EngineMessage& m) { return Add(kEngine, m.SerializeAsString()); }
  Seed& Peer(const kv::proto::PeerMessage& m) { return Add(kPeer, m.SerializeAsString()); }
  Seed& Status() { return Add(kStatus, ""); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

kv::proto::Layout Layout0() {  // daemon_fuzz.cc's Layout(0)
  kv::LayoutSpec s;
  s.layers = 2;
  s.blocks = 8;
  s.heads = 2;
  s.block_size = 4;
  s.content_bytes = 16;
  kv::proto::Layout out;
  kv::proto::ToWire(kv::KvRegion::Create(s)->spec(), &out);
  return out;
}

kv::proto::EngineMessage Save(const std::string& id, int layer, std::initializer_list<int64_t> b) {
  kv::proto::EngineMessage m;
  auto* save = m.mutable_save_layer();
  save->set_request_id(id);
  save->set_layer(layer);
  for (int64_t x : b) save->add_block_ids(x);
  return m;
}

kv::proto::EngineMessage Finished(const std::string& id, uint64_t seq) {
  kv::proto::EngineMessage m;
  m.set_seq(seq);
  m.mutable_request_finished()->set_request_id(id);
  return m;
}

kv::proto::EngineMessage Load(const std::string& id, const std::string& peer, uint64_t seq) {
  kv::proto::EngineMessage m;
  m.set_seq(seq);
  auto* load = m.mutable_start_load();
  load->set_request_id(id);
  load->set_peer_address(peer);
  load->set_tokens(8);
  load->add_block_ids(4);
  load->add_block_ids(5);
  return m;
}

kv::proto::PeerMessage Want(const std::string& id, kv::proto::TransferMode mode) {
  kv::proto::PeerMessage m;
  auto* want = m.mutable_want();
  want->set_request_id(id);
  want->set_mode(mode);
  want->set_tokens(8);
  want->set_lease_ms(1000);
  want->set_notice_token(std::string(16, 'n'));
  auto* rank = want->add_ranks();
  rank->set_tp_rank(0);
  *rank->add_regions() = Layout0();
  rank->add_descriptors("");  // the harness puts its real descriptor here
  rank->add_block_ids(2);
  rank->add_block_ids(3);
  return m;
}

kv::proto::EngineMessage Offload(int kind, const std::string& id, uint64_t seq) {
  kv::proto::EngineMessage m;
  m.set_seq(seq);
  const std::string key(16, 'k');
  if (kind == 0) {
    auto* o = m.mutable_offload_store();
    o->set_request_id(id);
    o->add_keys(key);
    o->add_block_ids(1);
  } else if (kind == 1) {
    auto* o = m.mutable_offload_lookup();
    o->add_keys(key);
    o->set_per_key(true);
  } else {
    auto* o = m.mutable_offload_load();
    o->set_request_id(id);
    o->add_keys(key);
    o->add_block_ids(6);
    o->set_per_layer(true);
  }
  return m;
}

void Write(const std::filesystem::path& dir, const std::string& name, const Seed& seed) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << seed.bytes();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_daemon_seeds DIR\n");
    return 2;
  }
  const std::filesystem::path daemon = std::filesystem::path(argv[1]) / "daemon";
  const std::filesystem::path auth = std::filesystem::path(argv[1]) / "daemon_auth";
  using kv::proto::MODE_PULL;
  using kv::proto::MODE_PUSH;

  Write(daemon, "prelude", Seed(0).Status());
  Write(daemon, "save_finish_want_confirm",
        Seed(0)
            .Engine(Save("r0", 0, {0, 1}))
            .Engine(Save("r0", 1, {}))  // the first save's blocks, as the connector sends it
            .Engine(Finished("r0", 3))
            .Peer(Want("r0", MODE_PULL))
            .Status()
            .Peer([] {
              kv::proto::PeerMessage m;
              m.mutable_confirm()->set_request_id("r0");
              return m;
            }()));
  Write(daemon, "want_before_save",
        Seed(0)
            .Peer(Want("r1", MODE_PUSH))
            .Engine(Save("r1", 0, {2, 3}))
            .Engine(Save("r1", 1, {}))
            .Engine(Finished("r1", 4))
            .Status());
  Write(daemon, "token_then_want_streams",
        Seed(0)
            .Engine([] {
              kv::proto::EngineMessage m;
              m.mutable_set_transfer_token()->set_request_id("r1");
              m.mutable_set_transfer_token()->set_transfer_token(std::string(16, 't'));
              return m;
            }())
            .Peer([] {
              kv::proto::PeerMessage m = Want("r1", MODE_PUSH);
              m.mutable_want()->set_transfer_token(std::string(16, 't'));
              return m;
            }())
            .Engine(Save("r1", 0, {2, 3}))
            .Status()
            .Engine(Save("r1", 1, {2, 3}))
            .Engine(Finished("r1", 4))
            .Status());
  Write(daemon, "start_load_self", Seed(0).Engine(Load("r2", "self", 5)).Status());
  Write(daemon, "start_loads",
        Seed(0)
            .Engine([] {
              kv::proto::EngineMessage m;
              m.set_seq(6);
              *m.mutable_start_loads()->add_loads() = Load("r3", "127.0.0.1:1", 0).start_load();
              *m.mutable_start_loads()->add_loads() = Load("r2", "self", 0).start_load();
              return m;
            }())
            .Status());
  Write(daemon, "offload",
        Seed(0)
            .Engine(Offload(0, "offload:0", 7))
            .Status()
            .Engine(Offload(1, "", 8))
            .Engine(Offload(2, "offload:1", 9))
            .Status());
  Write(daemon, "peer_fail_heartbeat",
        Seed(0)
            .Peer([] {
              kv::proto::PeerMessage m;
              m.mutable_fail()->set_request_id("r0");
              m.mutable_fail()->mutable_error()->set_code(3);
              return m;
            }())
            .Peer([] {
              kv::proto::PeerMessage m;
              m.mutable_heartbeat();
              return m;
            }()));
  Write(daemon, "second_registration", Seed(0).Engine([] {
    kv::proto::EngineMessage m;
    m.set_seq(10);
    auto* r = m.mutable_register_region();
    *r->mutable_layout() = Layout0();
    r->set_bytes(4096);
    r->set_object_bytes(65536);
    r->set_memfd(true);
    return m;
  }()));
  Write(daemon, "no_hello_raw",
        Seed(1 | 2 | 16)
            .Add(kEngineRaw, std::string("\x03\0\0\0"
                                         "abc",
                                         7))
            .Add(kPeerRaw, "xyz"));

  Seed challenge(0);
  challenge.Peer([] {
    kv::proto::PeerMessage m;
    m.mutable_challenge()->set_protocol_version(kv::proto::PEER_PROTOCOL);
    m.mutable_challenge()->set_node_name("fuzz-peer");
    m.mutable_challenge()->set_nonce(std::string(32, 'c'));
    return m;
  }());
  Write(auth, "challenge", challenge);
  Seed proof = challenge;
  proof.Peer([] {
    kv::proto::PeerMessage m;
    m.mutable_proof()->set_mac(std::string(32, 'm'));
    return m;
  }());
  Write(auth, "challenge_proof", proof);
  Write(auth, "hello_first", Seed(0).Peer(Want("r0", MODE_PULL)).Peer([] {
    kv::proto::PeerMessage m;
    m.mutable_hello()->set_protocol_version(kv::proto::PEER_PROTOCOL);
    m.mutable_hello()->set_node_name("fuzz-peer");
    return m;
  }()));
  Write(auth, "refused", Seed(0).Peer([] {
    kv::proto::PeerMessage m;
    m.mutable_refused()->set_reason("no");
    return m;
  }()));
  return 0;
}
