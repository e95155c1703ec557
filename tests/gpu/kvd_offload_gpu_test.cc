// GPU engines offload through kvd (a child process: --transport ipc --offload-bytes): an engine
// with a cudaMalloc'ed cache stores blocks its stream is still writing (kvd's copy must wait on
// the device for the engine's event), and leaves; a new engine process registers a fresh cache,
// finds the blocks and loads them back per layer, byte-exact, every other byte untouched. Skips
// without a CUDA device. Every wait is bounded.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "connector/connector.h"
#include "tools/testing/kvd_process.h"

extern char** environ;

namespace kv {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kChildSocket = "KV_OFFLOAD_GPU_CHILD_SOCKET";
constexpr uint8_t kUntouched = 0xEE;
const std::vector<int64_t> kStored = {5, 2, 9, 12};  // the first engine's blocks
const std::vector<int64_t> kLoaded = {1, 7, 3, 14};  // where the new engine takes them

bool HaveDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

LayoutSpec Spec() {
  LayoutSpec s;
  s.order = "LBNHC";  // per-layer pages: the load lands layer by layer
  s.layers = 4;
  s.blocks = 16;
  s.heads = 4;
  s.block_size = 16;
  s.content_bytes = 256;
  return s;
}

std::vector<offload::BlockKey> Keys() {
  std::vector<offload::BlockKey> keys;
  for (uint64_t i = 0; i < kStored.size(); ++i)
    keys.push_back(offload::BlockKey::FromUint64(0xB10C + i));
  return keys;
}

uint8_t Pattern(uint64_t i) {
  return static_cast<uint8_t>(i * 29 + 11);
}

// The engine's cache: cudaMalloc'ed on device 0, every byte kUntouched, freed on destruction.
struct Cache {
  void* ptr = nullptr;
  uint64_t bytes = 0;
  explicit Cache(uint64_t n) : bytes(n) {
    if (cudaMalloc(&ptr, n) != cudaSuccess || cudaMemset(ptr, kUntouched, n) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      ADD_FAILURE() << "cannot set up a device cache of " << n << " bytes";
    }
  }
  ~Cache() { cudaFree(ptr); }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> host(bytes);
    if (cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) host.clear();
    return host;
  }
};

std::unique_ptr<connector::Connector> OpenEngine(const std::string& socket,
                                                 const std::string& instance) {
  connector::ConnectorOptions o;
  o.instance = instance;
  // The restarted engine has another instance name; one offload namespace is what lets it find
  // the first engine's blocks (kvd keeps other namespaces' keys out of reach).
  o.offload_namespace = "model-a";
  o.timeout = 20s;
  auto c = connector::Connector::Open(socket, o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// Holds a stream until `flag` is set (at most 30 s).
void CUDART_CB Hold(void* flag) {
  const auto until = Clock::now() + 30s;
  while (!static_cast<std::atomic<bool>*>(flag)->load() && Clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
}

// Runs this test binary again as the second engine; its exit code, or -1 past `timeout`.
int RunChildEngine(const std::string& socket, std::chrono::seconds timeout) {
  std::vector<std::string> env_strings = {std::string(kChildSocket) + "=" + socket};
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string filter = "--gtest_filter=OffloadGpuChild.*";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
  const auto until = Clock::now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(10ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(OffloadGpu, AnEngineThatRestartsLoadsItsGpuPagesBack) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  if (std::getenv(kChildSocket) != nullptr) GTEST_SKIP() << "the child runs the second engine";
  const auto dir =
      std::filesystem::temp_directory_path() / ("kvd-offload-gpu-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  kv::harness::KvdProcess::Options o;
  o.binary = kv::harness::KvdBesideSelf();
  o.name = "offload-gpu";
  o.socket_path = (dir / "kvd.sock").string();
  o.transport = "ipc";
  // The side channel's sockets in the test's directory: kvd is SIGKILLed at the end.
  o.extra_args = {"--device",    "0",    "--offload-bytes", "16M",
                  "--log-level", "warn", "--transport-opt", "socket_dir=" + dir.string()};
  auto kvd = kv::harness::KvdProcess::Start(o);
  ASSERT_TRUE(kvd.ok()) << kvd.status().ToString();

  {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    auto region = KvRegion::Create(Spec());
    ASSERT_TRUE(region.ok());
    Cache cache(region->span_bytes());
    auto engine = OpenEngine(o.socket_path, "engine-1");
    ASSERT_NE(engine, nullptr);
    connector::KvCacheDesc gpu = connector::GpuCache(cache.ptr, 0, Spec());
    auto caches = engine->RegisterKvCaches({&gpu, 1});
    ASSERT_TRUE(caches.ok()) << caches.status().ToString();

    // The "forward pass": the stream is held, then writes the cache. The store is issued behind
    // it; if kvd's copy did not wait for the engine's event it would store kUntouched bytes.
    void* pinned = nullptr;
    ASSERT_EQ(cudaMallocHost(&pinned, cache.bytes), cudaSuccess);
    for (uint64_t i = 0; i < cache.bytes; ++i) static_cast<uint8_t*>(pinned)[i] = Pattern(i);
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    std::atomic<bool> go{false};
    ASSERT_EQ(cudaLaunchHostFunc(stream, Hold, &go), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(cache.ptr, pinned, cache.bytes, cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    std::thread release([&] {  // long after kvd took the store (microseconds)
      std::this_thread::sleep_for(200ms);
      go = true;
    });
    const auto keys = Keys();
    {
      auto stored = engine->OffloadStore(keys, kStored, 0, stream);  // dropped before `engine`
      const Status s = stored.ok() ? stored->op.Wait() : stored.status();
      release.join();
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(stored->stored, kStored.size());
    }
    auto hits = engine->OffloadLookup(keys);
    ASSERT_TRUE(hits.ok()) << hits.status().ToString();
    EXPECT_EQ(*hits, keys.size());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaStreamDestroy(stream);
    cudaFreeHost(pinned);
    engine.reset();  // the engine leaves; its pages stay in kvd's pool
  }

  EXPECT_EQ(RunChildEngine(o.socket_path, 60s), 0) << "the second engine's test failed";
  EXPECT_TRUE((*kvd)->running()) << "kvd died";
  kvd->reset();
  std::filesystem::remove_all(dir);
}

// The second engine, in its own process (run by the test above).
TEST(OffloadGpuChild, LoadsTheFirstEnginesPages) {
  const char* socket = std::getenv(kChildSocket);
  if (socket == nullptr) GTEST_SKIP() << "run by AnEngineThatRestartsLoadsItsGpuPagesBack";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto region = KvRegion::Create(Spec());
  ASSERT_TRUE(region.ok());
  Cache cache(region->span_bytes());
  auto engine = OpenEngine(socket, "engine-2");
  ASSERT_NE(engine, nullptr);
  connector::KvCacheDesc gpu = connector::GpuCache(cache.ptr, 0, Spec());
  ASSERT_TRUE(engine->RegisterKvCaches({&gpu, 1}).ok());

  const auto keys = Keys();
  auto hits = engine->OffloadLookup(keys);
  ASSERT_TRUE(hits.ok()) << hits.status().ToString();
  ASSERT_EQ(*hits, keys.size());
  auto loaded = engine->OffloadLoad(keys, kLoaded, /*per_layer=*/true);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE(loaded->per_layer);
  for (int l = 0; l < Spec().layers; ++l) {
    const Status s = loaded->op.WaitLayer(l);
    ASSERT_TRUE(s.ok()) << "layer " << l << ": " << s.ToString();
  }
  ASSERT_TRUE(loaded->op.Wait().ok());

  // The first engine's bytes of block kStored[i] are now in block kLoaded[i]; nothing else moved.
  std::vector<uint8_t> want(cache.bytes, kUntouched);
  const int64_t content = region->logical_content_bytes();
  for (size_t i = 0; i < kStored.size(); ++i)
    for (int64_t l = 0; l < region->size(Axis::kL); ++l)
      for (int64_t h = 0; h < region->size(Axis::kH); ++h)
        for (int64_t n = 0; n < region->size(Axis::kN); ++n)
          for (int64_t c = 0; c < content; ++c)
            want[region->offset(l, kLoaded[i], h, n) + c] =
                Pattern(region->offset(l, kStored[i], h, n) + c);
  const std::vector<uint8_t> got = cache.Download();
  ASSERT_EQ(got.size(), want.size());
  int64_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != want[i];
  EXPECT_EQ(mismatches, 0);
}

}  // namespace
}  // namespace kv
