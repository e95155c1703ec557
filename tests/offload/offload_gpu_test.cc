// The offload pool with engine pages in GPU memory: the pool is pinned, the copy waits for the
// engine's event, and pages come back bit-exact in both a layer-first and a blocks-first layout.
// Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <vector>

#include "daemon/offload/offload_pool.h"

namespace kv::offload {
namespace {

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

class OffloadPoolGpu : public ::testing::TestWithParam<const char*> {};

TEST_P(OffloadPoolGpu, DevicePagesRoundTripThroughThePinnedPool) {
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device";
  const std::string order = GetParam();
  auto region = KvRegion::Create(Shape(order, 32), MemoryLocation::Cuda(0));
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  PoolOptions options;
  options.slot_layout = Shape(order, 1);
  options.capacity_bytes = 16 * 4 * 2 * 16 * 256;
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
  std::promise<Status> stored;
  auto st = (*pool)->Store({&*region, base, keys, sources, written},
                           [&](Status s) { stored.set_value(s); });
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  ASSERT_TRUE(Wait(stored.get_future()).ok());

  std::promise<Status> loaded;
  std::vector<int64_t> layers;
  auto ld = (*pool)->Load(
      {&*region, base, keys, targets, nullptr}, [&](int64_t l) { layers.push_back(l); },
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

INSTANTIATE_TEST_SUITE_P(Layouts, OffloadPoolGpu, ::testing::Values("LBNHC", "BLNHC"));

}  // namespace
}  // namespace kv::offload
