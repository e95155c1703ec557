// Issue 19, a local engine must not hurt kvd or the other engines through the memory it
// registers, over the real unix socket: a memfd that is not sealed against resizing is refused
// (shrinking it after registering killed kvd with SIGBUS), and kvd maps only the layout's span of
// an object (it populated 1 GiB of sparse memfd behind a 1 KiB layout).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "base/fd_passing.h"
#include "base/framing.h"
#include "base/shared_memory.h"
#include "daemon/daemon.h"
#include "protocol/kvd.pb.h"
#include "protocol/wire_layout.h"

namespace kv {
namespace {

TEST(SharedMemorySeals, CreatedObjectsAreSealedAgainstResizing) {
  auto memory = kv::SharedMemory::Create(8192, "sealed");
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  EXPECT_NE(ftruncate(memory->fd(), 4096), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(memory->fd(), 1 << 20), 0);
  auto adopted = kv::SharedMemory::Adopt(dup(memory->fd()), 8192);
  EXPECT_TRUE(adopted.ok()) << adopted.status().ToString();
}

TEST(SharedMemorySeals, AnUnsealedObjectIsRefused) {
  const int fd = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  auto adopted = kv::SharedMemory::Adopt(fd, 8192);  // takes fd
  ASSERT_FALSE(adopted.ok());
  EXPECT_EQ(adopted.status().code(), Code::kInvalidArgument);
  EXPECT_NE(adopted.status().message().find("sealed"), std::string::npos);
}

class EngineMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvd-engine-memory-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    daemon::DaemonOptions options;
    options.name = "victim";
    options.socket_path = (dir_ / "kvd.sock").string();
    options.transport_name = "local";
    if (max_source_requests_ > 0) options.max_source_requests = max_source_requests_;
    auto d = daemon::Daemon::Start(std::move(options));
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = *d;
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = (dir_ / "kvd.sock").string();
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    ASSERT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    proto::EngineMessage hello;
    hello.set_seq(1);
    hello.mutable_hello()->set_protocol_version(proto::PROTOCOL_VERSION);
    hello.mutable_hello()->set_instance("tenant");
    hello.mutable_hello()->set_tp_size(1);
    ASSERT_TRUE(Call(hello, -1).ok());
  }
  void TearDown() override {
    if (fd_ >= 0) close(fd_);
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  // Sends `m` (with `memory_fd` beside it when >= 0) and returns the reply's status.
  Status Call(const proto::EngineMessage& m, int memory_fd) {
    std::string frame;
    KV_RETURN_IF_ERROR(kv::AppendFrame(m.SerializeAsString(), &frame));
    const ssize_t n = memory_fd >= 0 ? kv::SendWithFd(fd_, frame.data(), frame.size(), memory_fd)
                                     : send(fd_, frame.data(), frame.size(), MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(frame.size())) return Status::IoError("short send");
    kv::FrameDecoder decoder;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
      auto next = decoder.Next();
      if (!next.ok()) return next.status();
      if (next->has_value()) {
        proto::DaemonMessage reply;
        if (!reply.ParseFromString(**next)) return Status::InvalidArgument("bad reply");
        if (reply.seq() != m.seq()) continue;
        return kv::proto::FromWire(reply.reply().error());
      }
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t got = recv(fd_, buf, sizeof buf, 0);
      if (got <= 0) return Status::Unavailable("kvd closed the connection");
      decoder.Append(buf, static_cast<size_t>(got));
    }
    return Status::Timeout("no reply");
  }

  // A memfd of `bytes`, sealed against resizing when `seal`; -1 when it could not be made.
  static int Memfd(uint64_t bytes, bool seal) {
    const int memfd = memfd_create("engine", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (memfd < 0) return -1;
    if (ftruncate(memfd, static_cast<off_t>(bytes)) != 0 ||
        (seal && fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0)) {
      close(memfd);
      return -1;
    }
    return memfd;
  }

  // A host region of a 1 KiB layout at byte 0 of a memfd of `object_bytes`, as the connector
  // registers one.
  proto::EngineMessage HostRegion(uint64_t object_bytes, int64_t layers = 1) {
    LayoutSpec spec;
    spec.layers = layers;
    spec.blocks = 1;
    spec.heads = 1;
    spec.block_size = 16;
    spec.content_bytes = 64 / layers;  // a 1 KiB layout
    proto::EngineMessage m;
    m.set_seq(++seq_);
    auto* reg = m.mutable_register_region();
    kv::proto::ToWire(spec, reg->mutable_layout());
    reg->set_bytes(1024);
    reg->set_object_bytes(object_bytes);
    reg->set_memfd(true);
    return m;
  }

  // `m` with a memfd of `object_bytes` beside it.
  Status CallWithMemfd(const proto::EngineMessage& m, uint64_t object_bytes, bool seal = true) {
    const int memfd = Memfd(object_bytes, seal);
    if (memfd < 0) return Status::IoError("memfd");
    Status s = Call(m, memfd);
    close(memfd);
    return s;
  }

  Status Register(uint64_t bytes, bool seal) {
    return CallWithMemfd(HostRegion(bytes), bytes, seal);
  }

  // A save of `layer` naming `ids` (none: the blocks of the request's first save), answered.
  Status Save(const std::string& request, int layer, const std::vector<int64_t>& ids) {
    proto::EngineMessage m;
    m.set_seq(++seq_);
    auto* save = m.mutable_save_layer();
    save->set_request_id(request);
    save->set_layer(layer);
    for (int64_t id : ids) save->add_block_ids(id);
    return Call(m, -1);
  }

  int max_source_requests_ = 0;  // kvd's default unless a fixture sets it before SetUp
  std::filesystem::path dir_;
  std::shared_ptr<daemon::Daemon> daemon_;
  int fd_ = -1;
  uint64_t seq_ = 1;
};

// Saves as kvd takes them from a raw engine: the blocks named once (engine protocol 7), and a
// source table of one request.
class EngineSaves : public EngineMemory {
 protected:
  EngineSaves() { max_source_requests_ = 1; }
};

TEST_F(EngineMemory, AnUnsealedMemfdIsRefusedAndKvdKeepsServing) {
  Status s = Register(4096, /*seal=*/false);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("sealed"), std::string::npos) << s.ToString();
  EXPECT_TRUE(Register(4096, /*seal=*/true).ok());
  EXPECT_EQ(daemon_->Snapshot().regions(), 1u);
}

// An error that quotes the engine's input stays a readable reply: the order "LBN¼C" is valid UTF-8,
// but its unknown axis is the lone byte 0xc2, which once went into the reply's text as is, and a
// proto3 parser refuses a string field that is not UTF-8 (found by the daemon fuzz target).
TEST_F(EngineMemory, AnErrorQuotingPartOfAMultiByteCharacterIsStillAReadableReply) {
  proto::EngineMessage m = HostRegion(4096);
  m.mutable_register_region()->mutable_layout()->set_order(
      "LBN\xc2\xbc"
      "C");
  Status s = CallWithMemfd(m, 4096);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();  // not "bad reply"
  EXPECT_NE(s.message().find("unknown axis byte 194"), std::string::npos) << s.ToString();
  EXPECT_TRUE(Register(4096, /*seal=*/true).ok());  // and kvd keeps serving this engine
}

// kvd maps (and populates) only the layout's span of the object, wherever it lies in it: a
// 1 KiB layout naming a 1 GiB memfd (sparse, or shared with the engine's other caches) costs kvd
// one page, not 1 GiB of RSS.
TEST_F(EngineMemory, KvdMapsOnlyTheLayoutsSpanOfALargeObject) {
  const uint64_t before = daemon_->Snapshot().resident_bytes();
  Status s = Register(uint64_t{1} << 30, /*seal=*/true);  // sparse: costs nothing until mapped
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(daemon_->Snapshot().regions(), 1u);
  EXPECT_LT(daemon_->Snapshot().resident_bytes(), before + (uint64_t{64} << 20));
}

// One RegisterRegion serves host and GPU memory; its checks refuse every message whose share,
// location, fd, bounds and layer events do not agree, and kvd serves the engine afterwards.
TEST_F(EngineMemory, ARegistrationWhosePartsDisagreeIsRefused) {
  struct Case {
    std::string what;
    std::function<void(proto::RegisterRegion*)> change;
    bool with_fd;
    Code code;
    std::string says;
  };
  const std::string uuid(16, '\x7f');
  const std::vector<Case> cases = {
      {"no share", [](auto* r) { r->clear_share(); }, true, Code::kInvalidArgument, "no share"},
      {"a memfd without its fd", [](auto*) {}, false, Code::kInvalidArgument, "without"},
      {"a memfd of GPU memory", [&](auto* r) { r->mutable_location()->set_device_uuid(uuid); },
       true, Code::kInvalidArgument, "GPU memory is shared through"},
      {"cuda_ipc of host memory", [](auto* r) { r->set_cuda_ipc(std::string(64, 'h')); }, false,
       Code::kInvalidArgument, "host memory is shared as a memfd"},
      {"cuda_ipc with an fd",
       [&](auto* r) {
         r->mutable_location()->set_device_uuid(uuid);
         r->set_cuda_ipc(std::string(64, 'h'));
       },
       true, Code::kInvalidArgument, "came with an fd"},
      {"a short IPC handle",
       [&](auto* r) {
         r->mutable_location()->set_device_uuid(uuid);
         r->set_cuda_ipc("short");
       },
       false, Code::kInvalidArgument, "IPC handle"},
      {"layer events on host memory", [](auto* r) { r->add_layer_events("e"); }, true,
       Code::kInvalidArgument, "no layer events"},
      {"a region past its object", [](auto* r) { r->set_offset(4096 - 512); }, true,
       Code::kOutOfRange, "runs past"},
      {"a region smaller than its layout", [](auto* r) { r->set_bytes(512); }, true,
       Code::kOutOfRange, "cannot hold"},
      {"an object larger than the memfd",
       [](auto* r) {
         r->set_object_bytes(1 << 20);
         r->set_offset(8192);
       },
       true, Code::kOutOfRange, ""},
      {"a layout of another TP rank", [](auto* r) { r->mutable_layout()->set_tp_size(2); }, true,
       Code::kInvalidArgument, "TP rank"},
  };
  for (const Case& c : cases) {
    proto::EngineMessage m = HostRegion(4096);
    c.change(m.mutable_register_region());
    const Status s = c.with_fd ? CallWithMemfd(m, 4096) : Call(m, -1);
    EXPECT_EQ(s.code(), c.code) << c.what << ": " << s.ToString();
    EXPECT_NE(s.message().find(c.says), std::string::npos) << c.what << ": " << s.ToString();
  }
  EXPECT_EQ(daemon_->Snapshot().regions(), 0u);
  EXPECT_TRUE(Register(4096, /*seal=*/true).ok());
  EXPECT_EQ(daemon_->Snapshot().regions(), 1u);
}

// After a host region, the engine's regions stay host memory of its layer count.
TEST_F(EngineMemory, LaterRegionsAgreeWithTheFirst) {
  ASSERT_TRUE(Register(4096, /*seal=*/true).ok());
  Status layers = CallWithMemfd(HostRegion(4096, /*layers=*/2), 4096);
  EXPECT_EQ(layers.code(), Code::kIncompatible) << layers.ToString();
  EXPECT_NE(layers.message().find("layer count"), std::string::npos) << layers.ToString();
  proto::EngineMessage gpu = HostRegion(4096);
  gpu.mutable_register_region()->mutable_location()->set_device_uuid(std::string(16, 'u'));
  gpu.mutable_register_region()->set_cuda_ipc(std::string(64, 'h'));
  Status mixed = Call(gpu, -1);
  EXPECT_EQ(mixed.code(), Code::kIncompatible) << mixed.ToString();
  EXPECT_NE(mixed.message().find("not both"), std::string::npos) << mixed.ToString();
  EXPECT_EQ(daemon_->Snapshot().regions(), 1u);
}

// A GPU region goes through the same message and checks: its first region must carry one layer
// event per layer, and a kvd whose transport cannot reach GPU memory says so (this kvd runs the
// local transport).
TEST_F(EngineMemory, AGpuRegionTakesTheSamePath) {
  proto::EngineMessage m = HostRegion(1 << 20);
  auto* reg = m.mutable_register_region();
  reg->mutable_location()->set_device_uuid(std::string(16, 'u'));
  reg->set_cuda_ipc(std::string(64, 'h'));
  Status no_events = Call(m, -1);
  EXPECT_EQ(no_events.code(), Code::kInvalidArgument) << no_events.ToString();
  EXPECT_NE(no_events.message().find("0 layer events for 1 layers"), std::string::npos)
      << no_events.ToString();
  reg->add_layer_events(std::string(64, 'e'));
  m.set_seq(++seq_);
  Status unreachable = Call(m, -1);
  EXPECT_EQ(unreachable.code(), Code::kUnsupported) << unreachable.ToString();
  EXPECT_NE(unreachable.message().find("cannot reach GPU memory"), std::string::npos)
      << unreachable.ToString();
  EXPECT_EQ(daemon_->Snapshot().regions(), 0u);
}

// A request's first save on a rank names its blocks; a later one may leave them out and then
// stands for the same blocks, or name them again; other blocks, or none at first, are refused.
TEST_F(EngineSaves, ALaterSaveMayLeaveTheBlocksOutButNotTheFirst) {
  ASSERT_TRUE(CallWithMemfd(HostRegion(4096, /*layers=*/2), 4096).ok());
  Status first = Save("a", 1, {});
  EXPECT_EQ(first.code(), Code::kInvalidArgument) << first.ToString();
  EXPECT_NE(first.message().find("saved none of it"), std::string::npos) << first.ToString();
  ASSERT_TRUE(Save("a", 0, {0}).ok());
  EXPECT_TRUE(Save("a", 1, {}).ok());
  EXPECT_TRUE(Save("a", 1, {0}).ok());
  Status other = Save("a", 0, {0, 0});
  EXPECT_EQ(other.code(), Code::kInvalidArgument) << other.ToString();
  EXPECT_NE(other.message().find("other blocks than before"), std::string::npos)
      << other.ToString();
}

// max_source_requests bounds the requests held, not the saves of one held: a full table refuses a
// new request and keeps taking the layers of the one it holds (it refused them too before).
TEST_F(EngineSaves, AFullSourceTableTakesTheLaterLayersOfARequestItHolds) {
  ASSERT_TRUE(CallWithMemfd(HostRegion(4096, /*layers=*/2), 4096).ok());
  ASSERT_TRUE(Save("a", 0, {0}).ok());
  Status full = Save("b", 0, {0});
  EXPECT_EQ(full.code(), Code::kResourceExhausted) << full.ToString();
  Status held = Save("a", 1, {0});
  EXPECT_TRUE(held.ok()) << held.ToString();
  EXPECT_TRUE(Save("a", 1, {}).ok());
}

}  // namespace
}  // namespace kv
