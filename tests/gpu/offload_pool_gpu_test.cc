// The offload pool with engine pages in GPU memory: the pool is pinned, a store's copy waits in
// kvd's event gate (daemon/event_gate.h) for the engine's event, and pages come back bit-exact in
// both a layer-first and a blocks-first layout, by either copy path and in copy-engine batches of
// any size; a load never waits for the engine's stream; a store whose event never fires fails
// alone at the gate's deadline, copies nothing, frees its slots and holds up no other copy. Skips
// without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <vector>

#include "daemon/event_gate.h"
#include "daemon/offload/offload_pool.h"

namespace kv::offload {
namespace {

const MemoryLocation kCuda0 = MemoryLocation::Cuda(0);

bool HaveDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

LayoutSpec Shape(const std::string& order, int64_t blocks) {
  LayoutSpec s;
  s.order = order;
  s.layers = 4;
  s.blocks = blocks;
  s.heads = 2;
  s.block_size = 16;
  s.content_bytes = 256;
  return s;
}

Status Wait(std::future<Status> f) {
  if (f.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    return Status::Timeout("offload copy did not complete within 30 s");
  }
  return f.get();
}

// Whether every logical byte of block `a` in `x` equals that of block `b` in `y`.
bool SameBlock(const KvRegion& r, const std::vector<uint8_t>& x, int64_t a,
               const std::vector<uint8_t>& y, int64_t b) {
  for (int64_t l = 0; l < r.size(Axis::kL); ++l)
    for (int64_t h = 0; h < r.size(Axis::kH); ++h)
      for (int64_t n = 0; n < r.size(Axis::kN); ++n)
        for (int64_t c = 0; c < r.logical_content_bytes(); ++c)
          if (x[r.offset(l, a, h, n) + c] != y[r.offset(l, b, h, n) + c]) return false;
  return true;
}

// A store's gate as kvd builds it (offload_service.cc): held in `gate` until `event` fired, seen
// from the host, or failed at `deadline`.
CopyGate GateOn(daemon::EventGate& gate, cudaEvent_t event,
                std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
  return [&gate, event, deadline](std::function<void()> start, std::function<void(Status)> fail) {
    gate.Hold(
        [event]() -> Result<bool> {
          const cudaError_t e = cudaEventQuery(event);
          if (e == cudaSuccess) return true;
          if (e == cudaErrorNotReady) return false;
          cudaGetLastError();
          return Status::Internal(cudaGetErrorString(e));
        },
        std::chrono::steady_clock::now() + deadline, std::move(start), std::move(fail));
  };
}

struct Variant {
  const char* order;
  DeviceCopy how;
  int dma_slice_runs;
};

class OffloadPoolGpu : public ::testing::TestWithParam<Variant> {};

TEST_P(OffloadPoolGpu, DevicePagesRoundTripThroughThePinnedPool) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const std::string order = GetParam().order;
  auto region = KvRegion::Create(Shape(order, 32));
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  PoolOptions options;
  options.slot_layout = Shape(order, 1);
  options.capacity_bytes = 16 * 4 * 2 * 16 * 256;
  options.gpu.how = GetParam().how;
  options.gpu.dma_slice_runs = GetParam().dma_slice_runs;
  auto pool = OffloadPool::Create(options);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_TRUE((*pool)->stats().pinned_memory);

  std::vector<uint8_t> host(region->span_bytes());
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, host.size()), cudaSuccess);
  cudaStream_t engine_stream;
  cudaEvent_t written;
  ASSERT_EQ(cudaStreamCreateWithFlags(&engine_stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&written, cudaEventDisableTiming), cudaSuccess);
  // The engine's "forward pass": the pages are written on its stream; the store must wait.
  ASSERT_EQ(cudaMemcpyAsync(dev, host.data(), host.size(), cudaMemcpyHostToDevice, engine_stream),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(written, engine_stream), cudaSuccess);

  std::vector<BlockKey> keys;
  for (uint64_t k : {11, 12, 13, 14}) keys.push_back(BlockKey::FromUint64(k));
  std::vector<int64_t> sources = {3, 4, 5, 9}, targets = {20, 21, 22, 10};
  std::byte* base = static_cast<std::byte*>(dev);
  daemon::EventGate gate(nullptr);
  std::promise<Status> stored;
  auto st = (*pool)->Store({&*region, base, keys, sources, GateOn(gate, written), kCuda0},
                           [&](Status s) { stored.set_value(s); });
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_TRUE(Wait(stored.get_future()).ok());

  std::promise<Status> loaded;
  std::vector<int64_t> layers;
  auto ld = (*pool)->Load(
      {&*region, base, keys, targets, nullptr, kCuda0}, [&](int64_t l) { layers.push_back(l); },
      [&](Status s) { loaded.set_value(s); });
  ASSERT_TRUE(ld.ok()) << ld.status().ToString();
  ASSERT_TRUE(Wait(loaded.get_future()).ok());
  EXPECT_EQ(layers, (std::vector<int64_t>{0, 1, 2, 3}));

  std::vector<uint8_t> back(host.size());
  ASSERT_EQ(cudaMemcpy(back.data(), dev, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(SameBlock(*region, host, sources[i], back, targets[i])) << "key " << i;
  }
  EXPECT_TRUE(SameBlock(*region, host, 0, back, 0));  // untouched blocks stay as they were
  EXPECT_EQ((*pool)->stats().bytes_out, ld->bytes);

  cudaEventDestroy(written);
  cudaStreamDestroy(engine_stream);
  cudaFree(dev);
}

INSTANTIATE_TEST_SUITE_P(Paths, OffloadPoolGpu,
                         ::testing::Values(Variant{"LBNHC", DeviceCopy::kAuto, 512},
                                           Variant{"BLNHC", DeviceCopy::kAuto, 512},
                                           Variant{"LBNHC", DeviceCopy::kKernel, 512},
                                           Variant{"BLNHC", DeviceCopy::kKernel, 512},
                                           Variant{"LBNHC", DeviceCopy::kCopyEngine, 3},
                                           Variant{"BLNHC", DeviceCopy::kCopyEngine, 1}));

// An engine stream held by a host function until the test opens the gate: its event stands for
// a forward pass that has not finished writing (store) or reading (load) the pages.
class Gate {
 public:
  Gate() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), cudaSuccess);
    EXPECT_EQ(
        cudaLaunchHostFunc(
            stream_, [](void* f) { static_cast<std::shared_future<void>*>(f)->wait(); }, &opened_),
        cudaSuccess);
    EXPECT_EQ(cudaEventRecord(event_, stream_), cudaSuccess);
  }
  ~Gate() {
    Open();
    cudaStreamSynchronize(stream_);
    cudaEventDestroy(event_);
    cudaStreamDestroy(stream_);
  }
  void Open() {
    if (!open_) open_promise_.set_value();
    open_ = true;
  }
  cudaEvent_t event() const { return event_; }

 private:
  std::promise<void> open_promise_;
  std::shared_future<void> opened_ = open_promise_.get_future().share();
  bool open_ = false;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
};

struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::byte* base() const { return static_cast<std::byte*>(ptr); }
};

std::vector<BlockKey> Keys(uint64_t first, size_t n) {
  std::vector<BlockKey> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back(BlockKey::FromUint64(first + i));
  return keys;
}

// A per-layer load through the copy kernel is many phases; none of them may hold the submitting
// thread (kvd's io thread), and none waits for the engine's stream: its target blocks are idle in
// the engine, so the load lands while the engine's stream is still held.
TEST(OffloadPoolGpuOrdering, PerLayerLoadNeverWaitsForTheEnginesStream) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  LayoutSpec shape = Shape("LBNHC", 32);
  shape.layers = 8;
  auto region = KvRegion::Create(shape);
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  DeviceBuffer cache(region->span_bytes());
  PoolOptions options;
  options.slot_layout = shape;
  options.capacity_bytes = 8 * region->span_bytes() / 32;
  options.gpu.how = DeviceCopy::kKernel;
  auto pool = OffloadPool::Create(options);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  const auto keys = Keys(100, 4);
  const std::vector<int64_t> blocks = {1, 2, 3, 4}, targets = {10, 11, 12, 13};
  std::promise<Status> stored;
  ASSERT_TRUE((*pool)
                  ->Store({&*region, cache.base(), keys, blocks, nullptr, kCuda0},
                          [&](Status s) { stored.set_value(s); })
                  .ok());
  ASSERT_TRUE(Wait(stored.get_future()).ok());

  Gate gate;  // the engine's stream, held until the end
  std::promise<Status> loaded;
  std::atomic<int> layers{0};
  auto submitted = std::async(std::launch::async, [&] {
    return (*pool)
        ->Load(
            {&*region, cache.base(), keys, targets, {}, kCuda0}, [&](int64_t) { ++layers; },
            [&](Status s) { loaded.set_value(s); })
        .status();
  });
  const bool returned = submitted.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  EXPECT_TRUE(returned) << "Load() waited for the GPU";
  ASSERT_TRUE(submitted.get().ok());
  ASSERT_TRUE(Wait(loaded.get_future()).ok());
  EXPECT_EQ(layers.load(), 8);
  gate.Open();
}

// An engine killed mid-layer leaves the event a store waits for unfired for good. The store
// fails alone at the gate's deadline with kTimeout, having copied nothing: its keys are absent
// and its slots free again, a store submitted meanwhile lands, and the device's copies go on
// (the mover's stream never waited for the event).
TEST(OffloadPoolGpuOrdering, AStoreWhoseEventNeverFiresFailsAloneAndFreesItsSlots) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  auto region = KvRegion::Create(Shape("BLNHC", 8));
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  DeviceBuffer cache(region->span_bytes());
  PoolOptions options;
  options.slot_layout = Shape("BLNHC", 1);
  options.capacity_bytes = 4 * region->span_bytes() / 8;
  auto pool = OffloadPool::Create(options);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  daemon::EventGate events(nullptr);
  Gate gate;  // never opened before the store's deadline
  const auto keys = Keys(7, 2);
  const std::vector<int64_t> blocks = {0, 1};
  std::promise<Status> stuck;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE((*pool)
                  ->Store({&*region, cache.base(), keys, blocks,
                           GateOn(events, gate.event(), std::chrono::milliseconds(300)),
                           kCuda0},
                          [&](Status s) { stuck.set_value(s); })
                  .ok());
  auto stuck_done = stuck.get_future();
  // Beside it, a store that waits for nothing lands while the first is held.
  std::promise<Status> beside;
  ASSERT_TRUE(
      (*pool)
          ->Store({&*region, cache.base(), Keys(20, 1), std::span(blocks).first(1), nullptr, kCuda0},
                  [&](Status s) { beside.set_value(s); })
          .ok());
  ASSERT_TRUE(Wait(beside.get_future()).ok());
  EXPECT_EQ(stuck_done.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the held store ended before its deadline";
  const Status s = Wait(std::move(stuck_done));
  EXPECT_EQ(s.code(), Code::kTimeout) << s.ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(300));
  const PoolStats stats = (*pool)->stats();
  EXPECT_EQ(stats.used_slots, 1u);  // the store beside; the failed one's slots are free again
  EXPECT_EQ(stats.failed_copies, 1u);
  auto probe = (*pool)->Probe(*region, keys);
  ASSERT_TRUE(probe.ok());
  EXPECT_EQ((*probe)[0], OffloadPool::KeyState::kAbsent);
  EXPECT_EQ((*probe)[1], OffloadPool::KeyState::kAbsent);
  // The same keys store again, and the device's copies were never held up.
  std::promise<Status> again;
  ASSERT_TRUE((*pool)
                  ->Store({&*region, cache.base(), keys, blocks, nullptr, kCuda0},
                          [&](Status s) { again.set_value(s); })
                  .ok());
  EXPECT_TRUE(Wait(again.get_future()).ok());
  gate.Open();
}

}  // namespace
}  // namespace kv::offload
