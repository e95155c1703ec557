// RegisterKvCaches of GPU caches where it cannot work: embedded mode, host memory, a build or
// machine without CUDA. Each is refused with a clear error, and the connector stays usable for host
// caches.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "connector/connector.h"
#include "daemon/daemon.h"
#include "kv/kv_connector.h"
#include "tests/support/c_api_layout.h"
#include "gpu/ipc_memory.h"

namespace kv {
namespace {

using connector::Connector;

LayoutSpec SmallLayout() {
  LayoutSpec s;
  s.layers = 2;
  s.blocks = 4;
  s.heads = 2;
  s.block_size = 4;
  s.content_bytes = 16;
  return s;
}

Result<std::shared_ptr<daemon::Daemon>> StartDaemon(const std::string& socket_path) {
  daemon::DaemonOptions options;
  options.name = "gpu-reg";
  options.socket_path = socket_path;
  options.transport_name = "local";
  return daemon::Daemon::Start(std::move(options));
}

TEST(GpuRegistration, EmbeddedModeIsUnsupported) {
  auto d = StartDaemon("");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto c = Connector::OpenEmbedded(*d, {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<uint8_t> memory(1 << 16);
  connector::KvCacheDesc cache = connector::GpuCache(memory.data(), 0, SmallLayout());
  auto r = (*c)->RegisterKvCaches({&cache, 1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(Code::kUnsupported, r.status().code());
  EXPECT_NE(std::string::npos, r.status().message().find("OpenEmbedded")) << r.status().ToString();
}

TEST(GpuRegistration, CApiRefusesEmbeddedModeWithItsCode) {
  kv_error err{};
  kv_daemon* d = nullptr;
  ASSERT_EQ(kv::c_api_test::StartDaemon("gpu-c", "127.0.0.1:0", "local", 0, &d, &err), 0)
      << err.message;
  kv_connector* c = nullptr;
  ASSERT_EQ(kv::c_api_test::OpenEmbedded(d, "engine", &c, &err), 0) << err.message;
  const LayoutSpec spec = SmallLayout();
  kv_layout layout{};
  layout.order = spec.order.c_str();
  layout.layers = spec.layers;
  layout.blocks = spec.blocks;
  layout.heads = spec.heads;
  layout.block_size = spec.block_size;
  layout.content_bytes = spec.content_bytes;
  layout.tp_size = 1;
  std::vector<uint8_t> memory(1 << 16);
  kv_cache_desc gpu = kv::c_api_test::HostDesc(layout, memory.data());
  gpu.memory = KV_MEMORY_CUDA;
  gpu.device = 0;
  void* bases[1] = {};
  EXPECT_EQ(static_cast<int>(Code::kUnsupported), kv_register_kv_caches(c, &gpu, 1, bases, &err));
  EXPECT_NE(nullptr, std::strstr(err.message, "OpenEmbedded")) << err.message;
  EXPECT_EQ(static_cast<int>(Code::kInvalidArgument),
            kv_register_kv_caches(c, &gpu, 1, nullptr, &err));
  // Host caches: save_layer ignores the stream.
  void* host_base = nullptr;
  ASSERT_EQ(kv::c_api_test::RegisterOne(c, layout, &host_base, &err), 0) << err.message;
  const int64_t blocks[] = {1};
  EXPECT_EQ(0, kv_save_layer(c, "r", 0, blocks, 1, nullptr, &err)) << err.message;
  kv_connector_close(c);
  kv_daemon_stop(d);
}

TEST(GpuRegistration, HostMemoryIsRefusedAndHostCachesStillRegister) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("kvd-gpureg-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto d = StartDaemon((dir / "kvd.sock").string());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto c = Connector::Open((dir / "kvd.sock").string(), {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();

  EXPECT_EQ(Code::kInvalidArgument, (*c)->RegisterKvCaches({}).status().code());
  std::vector<uint8_t> memory(1 << 16);
  connector::KvCacheDesc cache = connector::GpuCache(memory.data(), 0, SmallLayout());
  auto r = (*c)->RegisterKvCaches({&cache, 1});
  ASSERT_FALSE(r.ok());
  // Without CUDA (or without a device) the build or machine cannot serve GPU caches at all; with
  // one, host memory is the caller's mistake.
  const bool have_gpu = kv::gpu::DeviceUuid(0).ok();
  // kvd's MPS check answers for a visible device and refuses others (kUnsupported without one).
  auto mps = kv::gpu::SharedThroughMps(0);
  EXPECT_EQ(have_gpu, mps.ok()) << mps.status().ToString();
  EXPECT_EQ(have_gpu ? Code::kInvalidArgument : Code::kUnsupported,
            kv::gpu::SharedThroughMps(4096).status().code());
  EXPECT_EQ(have_gpu ? Code::kInvalidArgument : Code::kUnsupported, r.status().code())
      << r.status().ToString();
  EXPECT_NE(std::string::npos, r.status().message().find(have_gpu ? "host memory" : "CUDA"))
      << r.status().ToString();

  // Nothing was registered: host caches still can be, and SaveLayer ignores a stream for them.
  const LayoutSpec spec = SmallLayout();
  auto host = (*c)->RegisterKvCaches(connector::HostCaches({&spec, 1}));
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  const int64_t blocks[] = {1};
  int fake_stream = 0;
  EXPECT_TRUE((*c)->SaveLayer("r", 0, blocks, &fake_stream).ok());
  EXPECT_EQ(Code::kAlreadyExists, (*c)->RegisterKvCaches({&cache, 1}).status().code());
  c->reset();
  d->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kv
