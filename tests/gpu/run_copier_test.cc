// RunCopier between two GPUs of one process: peer copies by the copy engine are spread over the
// copier's lanes and joined back into the caller's stream; every byte must land, whatever the
// run count (fewer runs than lanes included), and copies queued back to back must keep their
// stream order.
#include "gpu/run_copier.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/plan_copy.h"
#include "tests/support/plan_copy_groups.h"

namespace kv::gpu {
namespace {

bool TwoPeerDevices() {
  int count = 0, can = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) return false;
  return cudaDeviceCanAccessPeer(&can, 0, 1) == cudaSuccess && can;
}

// `count` disjoint runs in shuffled order, lengths up to max_len (odd ones included).
std::vector<Run> Runs(std::mt19937_64& rng, size_t count, uint64_t max_len, uint64_t bytes) {
  std::vector<Run> runs;
  std::uniform_int_distribution<uint64_t> len(1, max_len);
  uint64_t dst = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint64_t n = len(rng);
    if (dst + n > bytes) break;
    runs.push_back({std::uniform_int_distribution<uint64_t>(0, bytes - n)(rng), dst, n});
    dst += n + len(rng) % 77;
  }
  std::shuffle(runs.begin(), runs.end(), rng);
  return runs;
}

class RunCopierPeerTest : public ::testing::TestWithParam<std::optional<kernels::CopyPath>> {};

TEST_P(RunCopierPeerTest, EveryByteLandsOnThePeer) {
  if (!TwoPeerDevices()) GTEST_SKIP() << "needs two CUDA devices with peer access";
  constexpr uint64_t kBytes = 64 << 20;
  std::mt19937_64 rng(5);
  std::vector<unsigned char> host(kBytes);
  for (auto& b : host) b = static_cast<unsigned char>(rng());
  auto src = DeviceBuffer::Allocate(0, kBytes);
  auto stream = CudaStream::Create(0);
  ASSERT_TRUE(src.ok() && stream.ok());
  ASSERT_EQ(cudaMemcpy(src->data(), host.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  DeviceGuard on0(0);
  cudaDeviceEnablePeerAccess(1, 0);
  cudaGetLastError();  // already enabled
  auto copier = RunCopier::Create(0, GetParam());
  ASSERT_TRUE(copier.ok()) << copier.status().ToString();

  // Back to back on one stream: fewer runs than lanes, a few, many; large and small runs.
  struct Case {
    size_t count;
    uint64_t max_len;
  };
  const Case cases[] = {{1, 8 << 20}, {3, 4 << 20}, {5, 3 << 20}, {300, 200 << 10}, {64, 1 << 20}};
  std::vector<DeviceBuffer> dsts;
  std::vector<std::vector<kv::Run>> plans;
  for (const Case& c : cases) {
    auto dst = DeviceBuffer::Allocate(1, kBytes);
    ASSERT_TRUE(dst.ok());
    ASSERT_EQ(cudaMemset(dst->data(), 0xEE, kBytes), cudaSuccess);
    plans.push_back(Runs(rng, c.count, c.max_len, kBytes));
    dsts.push_back(std::move(dst).value());
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t i = 0; i < plans.size(); ++i) {
    const Status s = (*copier)->Copy(src->data(), dsts[i].data(), plans[i],
                                     kernels::CopyDirection::kPeer, stream->get());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
  std::vector<unsigned char> got(kBytes);
  for (size_t i = 0; i < plans.size(); ++i) {
    std::vector<unsigned char> want(kBytes, 0xEE);
    kernels::CopyRunsHost(host.data(), want.data(), plans[i]);
    ASSERT_EQ(cudaMemcpy(got.data(), dsts[i].data(), kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(got == want) << "case " << i << ": " << plans[i].size() << " runs";
  }
}

// Groups over the peer: the group kernel, or rows expanded for the copy engine; a TP 1 -> 2
// shaped batch (16 rows of 2 KiB per group) and random ones.
TEST_P(RunCopierPeerTest, EveryGroupRowLandsOnThePeer) {
  if (!TwoPeerDevices()) GTEST_SKIP() << "needs two CUDA devices with peer access";
  constexpr uint64_t kBytes = 16 << 20;
  std::mt19937_64 rng(6);
  std::vector<unsigned char> host(kBytes);
  for (auto& b : host) b = static_cast<unsigned char>(rng());
  auto src = DeviceBuffer::Allocate(0, kBytes);
  auto dst = DeviceBuffer::Allocate(1, kBytes);
  auto stream = CudaStream::Create(0);
  ASSERT_TRUE(src.ok() && dst.ok() && stream.ok());
  ASSERT_EQ(cudaMemcpy(src->data(), host.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  DeviceGuard on0(0);
  cudaDeviceEnablePeerAccess(1, 0);
  cudaGetLastError();  // already enabled
  auto copier = RunCopier::Create(0, GetParam());
  ASSERT_TRUE(copier.ok()) << copier.status().ToString();
  std::vector<std::vector<RunGroup>> cases;
  std::vector<RunGroup> split;  // 256 pages of 16 tokens: 4 KiB per token at the source
  for (uint64_t p = 0; p < 256; ++p) {
    split.push_back({(p * 37 % 256) * 65536 + 2048, p * 32768, 2048, 16, 4096, 2048});
  }
  cases.push_back(split);
  cases.push_back(kv::testing::RandomGroups(rng, kBytes, kBytes, 3000, true));
  cases.push_back(kv::testing::RandomGroups(rng, kBytes, kBytes, 3 << 20, false));
  std::vector<unsigned char> got(kBytes);
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(cudaMemset(dst->data(), 0xEE, kBytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Status s = (*copier)->CopyGroups(src->data(), dst->data(), cases[i],
                                           kernels::CopyDirection::kPeer, stream->get());
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
    std::vector<unsigned char> want(kBytes, 0xEE);
    kernels::CopyGroupsHost(host.data(), want.data(), cases[i]);
    ASSERT_EQ(cudaMemcpy(got.data(), dst->data(), kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(got == want) << "case " << i << ": " << cases[i].size() << " groups";
  }
}

// Block entries over the peer (cuda_ipc's LBNHC -> BLHNC pages): the block kernel, or rows
// expanded for the copy engine. 16,384 pages of 8 heads of 16 rows of 64 B, one descriptor
// each: enough that an idle stream's copy goes in pieces; and random entries.
TEST_P(RunCopierPeerTest, EveryBlockRowLandsOnThePeer) {
  if (!TwoPeerDevices()) GTEST_SKIP() << "needs two CUDA devices with peer access";
  constexpr uint64_t kBytes = 128 << 20;
  std::mt19937_64 rng(8);
  std::vector<unsigned char> host(kBytes);
  for (auto& b : host) b = static_cast<unsigned char>(rng());
  auto src = DeviceBuffer::Allocate(0, kBytes);
  auto dst = DeviceBuffer::Allocate(1, kBytes);
  auto stream = CudaStream::Create(0);
  ASSERT_TRUE(src.ok() && dst.ok() && stream.ok());
  ASSERT_EQ(cudaMemcpy(src->data(), host.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  DeviceGuard on0(0);
  cudaDeviceEnablePeerAccess(1, 0);
  cudaGetLastError();  // already enabled
  auto copier = RunCopier::Create(0, GetParam());
  ASSERT_TRUE(copier.ok()) << copier.status().ToString();
  std::vector<std::vector<GroupBlocks>> cases;
  std::vector<GroupBlocks> pages;  // 8 KiB pages: heads 64 B apart at the source, 1 KiB apart
  for (uint64_t p = 0; p < 16384; ++p) {
    pages.push_back({{(p * 769 % 16384) * 8192, p * 8192, 64, 16, 512, 64}, 8, 64, 1024});
  }
  ASSERT_GT(pages.size(), 2 * kernels::PlanCopier::kFirstPieceChunks);
  cases.push_back(pages);
  cases.push_back(kv::testing::RandomBlocks(rng, kBytes, kBytes, 3000, true));
  std::vector<unsigned char> got(kBytes);
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_EQ(cudaMemset(dst->data(), 0xEE, kBytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Status s = (*copier)->CopyBlocks(src->data(), dst->data(), cases[i],
                                           kernels::CopyDirection::kPeer, stream->get());
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
    std::vector<unsigned char> want(kBytes, 0xEE);
    kernels::CopyBlocksHost(host.data(), want.data(), cases[i]);
    ASSERT_EQ(cudaMemcpy(got.data(), dst->data(), kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(got == want) << "case " << i << ": " << cases[i].size() << " entries";
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, RunCopierPeerTest,
                         ::testing::Values(std::optional(kernels::CopyPath::kCopyEngine),
                                           std::optional(kernels::CopyPath::kKernel),
                                           std::optional<kernels::CopyPath>()),
                         [](const auto& info) {
                           if (!info.param) return std::string("Chooser");
                           return std::string(
                               *info.param == kernels::CopyPath::kKernel ? "Kernel" : "CopyEngine");
                         });

}  // namespace
}  // namespace kv::gpu
