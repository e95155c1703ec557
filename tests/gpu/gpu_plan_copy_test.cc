#include <algorithm>
#include <deque>
#include <random>
#include <vector>

#include "kernels/plan_copy.h"
#include "tests/support/cuda_test_util.h"
#include "tests/support/plan_copy_groups.h"

namespace kv::kernels {
namespace {

using testing::DeviceBuffer;
using testing::PinnedBuffer;
using testing::Stream;

// Disjoint destinations in random order, lengths 1..max_len, odd offsets on both sides.
std::vector<kv::Run> RandomRuns(std::mt19937_64& rng, uint64_t src_bytes, uint64_t dst_bytes,
                                uint64_t max_len) {
  std::vector<kv::Run> runs;
  std::uniform_int_distribution<uint64_t> len(1, max_len), gap(0, 33);
  for (uint64_t dst = gap(rng);;) {
    kv::Run r;
    r.length = len(rng);
    if (dst + r.length > dst_bytes) break;
    r.dst_offset = dst;
    r.src_offset = std::uniform_int_distribution<uint64_t>(0, src_bytes - r.length)(rng);
    runs.push_back(r);
    dst += r.length + gap(rng);
  }
  std::shuffle(runs.begin(), runs.end(), rng);
  return runs;
}

std::vector<unsigned char> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

enum class Side { kDevice, kPinned };

// Copies runs from a `from` buffer to a `to` buffer by `path` and checks against CopyRunsHost.
void CheckCopy(Side from, Side to, bool copy_engine, uint64_t max_len, int max_ctas,
               uint64_t seed) {
  std::mt19937_64 rng(seed);
  const uint64_t src_bytes = 3 << 20, dst_bytes = 4 << 20;
  const auto src_host = RandomBytes(rng, src_bytes);
  const auto runs = RandomRuns(rng, src_bytes, dst_bytes, max_len);
  std::vector<unsigned char> want(dst_bytes, 0xEE);
  CopyRunsHost(src_host.data(), want.data(), runs);

  DeviceBuffer src_dev(src_bytes), dst_dev(dst_bytes);
  PinnedBuffer src_pin(src_bytes), dst_pin(dst_bytes);
  unsigned char* src = from == Side::kDevice ? src_dev.get() : src_pin.get();
  unsigned char* dst = to == Side::kDevice ? dst_dev.get() : dst_pin.get();
  KV_CUDA_OK(cudaMemcpy(src, src_host.data(), src_bytes, cudaMemcpyDefault));
  KV_CUDA_OK(cudaMemset(dst_dev.get(), 0xEE, dst_bytes));
  std::memset(dst_pin.get(), 0xEE, dst_bytes);

  Stream stream;
  if (copy_engine) {
    const Status s = LaunchBatchCopy(src, dst, runs, stream.opaque());
    ASSERT_TRUE(s.ok()) << s.ToString();
  } else {
    auto copier = PlanCopier::Create(PlanCopyOptions{max_ctas});
    ASSERT_TRUE(copier.ok()) << copier.status().ToString();
    const Status s = (*copier)->Copy(src, dst, runs, stream.opaque());
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  KV_CUDA_OK(cudaStreamSynchronize(stream.get()));
  std::vector<unsigned char> got(dst_bytes);
  KV_CUDA_OK(cudaMemcpy(got.data(), dst, dst_bytes, cudaMemcpyDefault));
  ASSERT_EQ(got, want) << runs.size() << " runs";
}

TEST(GpuPlanCopy, DeviceToDeviceMatchesReference) {
  KV_SKIP_WITHOUT_CUDA();
  for (uint64_t max_len : {1ull, 17ull, 4096ull, 300000ull}) {
    for (int ctas : {0, 1, 3})
      CheckCopy(Side::kDevice, Side::kDevice, false, max_len, ctas, max_len);
  }
}

TEST(GpuPlanCopy, PinnedHostBothWaysMatchesReference) {
  KV_SKIP_WITHOUT_CUDA();
  CheckCopy(Side::kDevice, Side::kPinned, false, 70000, 0, 1);
  CheckCopy(Side::kPinned, Side::kDevice, false, 70000, 0, 2);
  CheckCopy(Side::kDevice, Side::kPinned, false, 1, 0, 3);
}

TEST(GpuPlanCopy, CopyEngineMatchesReference) {
  KV_SKIP_WITHOUT_CUDA();
  CheckCopy(Side::kDevice, Side::kDevice, true, 300000, 0, 4);
  CheckCopy(Side::kDevice, Side::kPinned, true, 300000, 0, 5);
  CheckCopy(Side::kPinned, Side::kDevice, true, 5000, 0, 6);
  EXPECT_EQ(LaunchBatchCopy(nullptr, nullptr, {}, nullptr).code(), Code::kInvalidArgument);
}

// The group kernel against CopyGroupsHost: 16-byte aligned groups (the flat vector path) and
// unaligned ones (row by row), rows from a few bytes to longer than a chunk, in pieces on an
// idle stream and whole.
TEST(GpuPlanCopy, GroupsMatchReference) {
  KV_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(21);
  const uint64_t src_bytes = 3 << 20, dst_bytes = 4 << 20;
  auto copier = PlanCopier::Create();
  ASSERT_TRUE(copier.ok()) << copier.status().ToString();
  DeviceBuffer src(src_bytes), dst(dst_bytes);
  Stream stream;
  for (int trial = 0; trial < 12; ++trial) {
    const uint64_t max_len = trial % 3 == 0 ? 80 << 10 : trial % 3 == 1 ? 50 : 4096;
    const auto groups =
        kv::testing::RandomGroups(rng, src_bytes, dst_bytes, max_len, trial % 2 == 0);
    const auto src_host = RandomBytes(rng, src_bytes);
    std::vector<unsigned char> want(dst_bytes, 0xEE);
    CopyGroupsHost(src_host.data(), want.data(), groups);
    KV_CUDA_OK(cudaMemcpy(src.get(), src_host.data(), src_bytes, cudaMemcpyDefault));
    KV_CUDA_OK(cudaMemset(dst.get(), 0xEE, dst_bytes));
    // cudaMemset runs on the legacy stream, which the copier's non-blocking stream does not wait
    // for: without this the kernel raced the fill (the first GPU run failed a trial).
    KV_CUDA_OK(cudaDeviceSynchronize());
    const Status s = (*copier)->CopyGroups(src.get(), dst.get(), groups, stream.opaque());
    ASSERT_TRUE(s.ok()) << s.ToString();
    KV_CUDA_OK(cudaStreamSynchronize(stream.get()));
    std::vector<unsigned char> got(dst_bytes);
    KV_CUDA_OK(cudaMemcpy(got.data(), dst.get(), dst_bytes, cudaMemcpyDefault));
    ASSERT_TRUE(got == want) << "trial " << trial << ": " << groups.size() << " groups";
  }
}

// The copier reuses its device tables; a copy on a second stream must not overwrite one while the
// first stream's kernel still reads it.
TEST(GpuPlanCopy, CopierIsSafeAcrossStreams) {
  KV_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(9);
  const uint64_t bytes = 8 << 20;
  const auto host = RandomBytes(rng, bytes);
  DeviceBuffer src(bytes), a(bytes), b(bytes);
  src.Upload(host);
  auto copier = PlanCopier::Create();
  ASSERT_TRUE(copier.ok());
  std::vector<kv::Run> forward, backward;
  for (uint64_t off = 0; off < bytes; off += 4096) {
    forward.push_back({off, off, 4096});
    backward.push_back({off, bytes - 4096 - off, 4096});
  }
  Stream s1, s2;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE((*copier)->Copy(src.get(), a.get(), forward, s1.opaque()).ok());
    ASSERT_TRUE((*copier)->Copy(src.get(), b.get(), backward, s2.opaque()).ok());
  }
  KV_CUDA_OK(cudaDeviceSynchronize());
  std::vector<unsigned char> want_b(bytes);
  CopyRunsHost(host.data(), want_b.data(), backward);
  EXPECT_EQ(a.Download<unsigned char>(bytes), host);
  EXPECT_EQ(b.Download<unsigned char>(bytes), want_b);
}

// Copies queued back to back with different tables (and tables that grow mid-way) use the
// copier's pool of table slots: each must see its own table, not a later copy's.
TEST(GpuPlanCopy, CopierPipelinesDistinctTables) {
  KV_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(11);
  const uint64_t bytes = 4 << 20;
  const auto host = RandomBytes(rng, bytes);
  DeviceBuffer src(bytes);
  src.Upload(host);
  auto copier = PlanCopier::Create();
  ASSERT_TRUE(copier.ok());
  constexpr int kCopies = 7;
  std::deque<DeviceBuffer> dsts;  // DeviceBuffer does not move
  std::vector<std::vector<kv::Run>> plans;
  Stream stream;
  for (int i = 0; i < kCopies; ++i) {
    // Page sizes shrink, so later tables are larger than earlier ones.
    plans.push_back(RandomRuns(rng, bytes, bytes, uint64_t{65536} >> (2 * (i / 2))));
    dsts.emplace_back(bytes);
    KV_CUDA_OK(cudaMemset(dsts.back().get(), 0, bytes));
  }
  for (int i = 0; i < kCopies; ++i) {
    ASSERT_TRUE((*copier)->Copy(src.get(), dsts[i].get(), plans[i], stream.opaque()).ok());
  }
  KV_CUDA_OK(cudaStreamSynchronize(stream.get()));
  for (int i = 0; i < kCopies; ++i) {
    std::vector<unsigned char> want(bytes, 0);
    CopyRunsHost(host.data(), want.data(), plans[i]);
    EXPECT_EQ(dsts[i].Download<unsigned char>(bytes), want) << "copy " << i;
  }
}

// On an idle stream a large copy goes in pieces of growing size; a run longer than a whole piece
// makes a piece of its own. Every byte must land as one launch would place it.
TEST(GpuPlanCopy, IdleStreamCopiesInPieces) {
  KV_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(13);
  const uint64_t big = (PlanCopier::kFirstPieceChunks + 64) * kPlanCopyChunkBytes;
  const uint64_t bytes = big + (8 << 20);
  const auto host = RandomBytes(rng, bytes);
  DeviceBuffer src(bytes), dst(bytes);
  src.Upload(host);
  KV_CUDA_OK(cudaMemset(dst.get(), 0, bytes));
  // First a run of more chunks than the first piece's limit (a piece of its own), then small runs.
  std::vector<kv::Run> runs;
  runs.push_back({rng() % (bytes - big), 0, big});
  for (uint64_t dst_at = big; dst_at + 97 <= bytes; dst_at += 211) {
    runs.push_back({rng() % (bytes - 97), dst_at, 97});
  }
  ASSERT_GT(PlanCopyChunks(runs), 2 * PlanCopier::kFirstPieceChunks);
  auto copier = PlanCopier::Create();
  ASSERT_TRUE(copier.ok());
  Stream stream;
  KV_CUDA_OK(cudaStreamSynchronize(stream.get()));  // idle: the copy goes in pieces
  const Status s = (*copier)->Copy(src.get(), dst.get(), runs, stream.opaque());
  ASSERT_TRUE(s.ok()) << s.ToString();
  KV_CUDA_OK(cudaStreamSynchronize(stream.get()));
  std::vector<unsigned char> want(bytes, 0);
  CopyRunsHost(host.data(), want.data(), runs);
  EXPECT_TRUE(dst.Download<unsigned char>(bytes) == want);
}

// Encodes `runs`, uploads the table and launches the kernel over it, as kvbench times the kernel
// alone; returns once the copy finished.
void CopyOverUploadedTable(const unsigned char* src, unsigned char* dst,
                           const std::vector<kv::Run>& runs, int max_ctas, Stream& stream) {
  const uint64_t chunks = PlanCopyChunks(runs);
  std::vector<unsigned char> table(PlanCopyTableBytes(runs.size(), chunks));
  ASSERT_TRUE(EncodePlanCopyTable(runs, table.data(), table.size()).ok());
  DeviceBuffer device_table(table.size());
  device_table.Upload(table);
  const Status s = LaunchPlanCopy(src, dst, device_table.get(), runs.size(), chunks,
                                  PlanCopyOptions{max_ctas}, stream.opaque());
  ASSERT_TRUE(s.ok()) << s.ToString();
  KV_CUDA_OK(cudaStreamSynchronize(stream.get()));
}

// The block kernel over a table encoded and uploaded here (as the nccl backend's RunTables does)
// against CopyBlocksHost: packed and cut blocks, aligned rows (the flat vector path) and not,
// a few entries (sliced across the grid) and many, on the whole grid and on one CTA.
TEST(GpuPlanCopy, BlocksMatchReference) {
  KV_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(41);
  const uint64_t src_bytes = 3 << 20, dst_bytes = 4 << 20;
  DeviceBuffer src(src_bytes), dst(dst_bytes);
  Stream stream;
  for (int trial = 0; trial < 18; ++trial) {
    const uint64_t max_len = trial % 3 == 0 ? 80 << 10 : trial % 3 == 1 ? 50 : 4096;
    auto entries = kv::testing::RandomBlocks(rng, src_bytes, dst_bytes, max_len, trial % 2 == 0);
    if (trial % 4 == 1) entries.resize(std::min<size_t>(entries.size(), 1 + trial % 5));
    const int ctas = trial % 6 == 5 ? 1 : 0;
    const auto src_host = RandomBytes(rng, src_bytes);
    std::vector<unsigned char> want(dst_bytes, 0xEE);
    CopyBlocksHost(src_host.data(), want.data(), entries);
    uint64_t chunks = 0;
    for (const GroupBlocks& e : entries) chunks += PlanCopyBlockChunks(e);
    std::vector<PlanCopyBlockChunk> table(chunks);
    auto written = EncodePlanCopyBlocks(entries, chunks, table.data());
    ASSERT_TRUE(written.ok() && *written == chunks) << written.status().ToString();
    DeviceBuffer device_table(std::max<uint64_t>(chunks, 1) * sizeof(PlanCopyBlockChunk));
    device_table.Upload(table);
    KV_CUDA_OK(cudaMemcpy(src.get(), src_host.data(), src_bytes, cudaMemcpyDefault));
    KV_CUDA_OK(cudaMemset(dst.get(), 0xEE, dst_bytes));
    KV_CUDA_OK(cudaDeviceSynchronize());  // the legacy-stream memset before the copy
    const Status s = LaunchPlanCopyBlocks(src.get(), dst.get(), device_table.get(), chunks,
                                          PlanCopyOptions{ctas}, stream.opaque());
    ASSERT_TRUE(s.ok()) << s.ToString();
    KV_CUDA_OK(cudaStreamSynchronize(stream.get()));
    std::vector<unsigned char> got(dst_bytes);
    KV_CUDA_OK(cudaMemcpy(got.data(), dst.get(), dst_bytes, cudaMemcpyDefault));
    ASSERT_TRUE(got == want) << "trial " << trial << ": " << entries.size() << " entries, "
                             << chunks << " descriptors";
  }
}

// A table encoded and uploaded by the caller, as kvbench times the kernel alone.
TEST(GpuPlanCopy, LaunchOverCallerTable) {
  KV_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(12);
  const uint64_t bytes = 2 << 20;
  const auto host = RandomBytes(rng, bytes);
  DeviceBuffer src(bytes), dst(bytes);
  src.Upload(host);
  KV_CUDA_OK(cudaMemset(dst.get(), 0, bytes));
  const auto runs = RandomRuns(rng, bytes, bytes, 100000);
  Stream stream;
  ASSERT_NO_FATAL_FAILURE(CopyOverUploadedTable(src.get(), dst.get(), runs, 5, stream));
  std::vector<unsigned char> want(bytes, 0);
  CopyRunsHost(host.data(), want.data(), runs);
  EXPECT_EQ(dst.Download<unsigned char>(bytes), want);
}

// A launch of fewer chunks than the grid has warps splits each chunk into slices, one warp
// each (plan_copy.cu): tables of 1 to 40 runs and a few groups, lengths from 1 byte to several
// chunks, odd offsets and unaligned rows included, against the references; a grid of one CTA
// copies such tables in fewer slices, or none.
TEST(GpuPlanCopy, AFewChunksAreSlicedAcrossTheGrid) {
  KV_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng(31);
  const uint64_t bytes = 1 << 20;
  const auto host = RandomBytes(rng, bytes);
  DeviceBuffer src(bytes), dst(bytes);
  src.Upload(host);
  Stream stream;
  for (int trial = 0; trial < 24; ++trial) {
    const int ctas = trial % 4 == 3 ? 1 : 0;
    std::vector<unsigned char> want(bytes, 0);
    KV_CUDA_OK(cudaMemset(dst.get(), 0, bytes));
    KV_CUDA_OK(cudaDeviceSynchronize());  // the legacy-stream memset before the copy
    if (trial % 2 == 0) {
      auto runs = RandomRuns(rng, bytes, bytes, trial % 3 == 0 ? 17 : 100000);
      runs.resize(std::min<size_t>(runs.size(), 1 + trial % 40));
      ASSERT_NO_FATAL_FAILURE(CopyOverUploadedTable(src.get(), dst.get(), runs, ctas, stream));
      CopyRunsHost(host.data(), want.data(), runs);
      ASSERT_EQ(dst.Download<unsigned char>(bytes), want) << "trial " << trial;
    } else {
      auto groups =
          kv::testing::RandomGroups(rng, bytes, bytes, trial % 3 == 0 ? 50 : 40000, trial % 4 == 1);
      groups.resize(std::min<size_t>(groups.size(), 1 + trial % 7));
      auto copier = PlanCopier::Create(PlanCopyOptions{ctas});
      ASSERT_TRUE(copier.ok()) << copier.status().ToString();
      ASSERT_TRUE((*copier)->CopyGroups(src.get(), dst.get(), groups, stream.opaque()).ok());
      KV_CUDA_OK(cudaStreamSynchronize(stream.get()));
      CopyGroupsHost(host.data(), want.data(), groups);
      ASSERT_EQ(dst.Download<unsigned char>(bytes), want) << "trial " << trial;
    }
  }
}

TEST(GpuPlanCopy, IntoPeerGpu) {
  KV_SKIP_WITHOUT_CUDA();
  int count = 0, can = 0;
  cudaGetDeviceCount(&count);
  if (count < 2) GTEST_SKIP() << "one GPU";
  cudaDeviceCanAccessPeer(&can, 0, 1);
  if (!can) GTEST_SKIP() << "GPU 0 cannot reach GPU 1";
  std::mt19937_64 rng(10);
  const uint64_t bytes = 1 << 20;
  const auto host = RandomBytes(rng, bytes);
  KV_CUDA_OK(cudaSetDevice(1));
  DeviceBuffer peer(bytes);
  KV_CUDA_OK(cudaSetDevice(0));
  // Already enabled (an earlier test, or --gtest_repeat) is fine; the error it leaves must not
  // be read as the copy kernel's launch error.
  if (cudaDeviceEnablePeerAccess(1, 0) != cudaSuccess) (void)cudaGetLastError();
  DeviceBuffer src(bytes);
  src.Upload(host);
  const auto runs = RandomRuns(rng, bytes, bytes, 5000);
  std::vector<unsigned char> want(bytes, 0);
  CopyRunsHost(host.data(), want.data(), runs);
  KV_CUDA_OK(cudaMemset(peer.get(), 0, bytes));
  auto copier = PlanCopier::Create();
  ASSERT_TRUE(copier.ok());
  Stream stream;
  ASSERT_TRUE((*copier)->Copy(src.get(), peer.get(), runs, stream.opaque()).ok());
  KV_CUDA_OK(cudaStreamSynchronize(stream.get()));
  std::vector<unsigned char> got(bytes);
  KV_CUDA_OK(cudaMemcpy(got.data(), peer.get(), bytes, cudaMemcpyDefault));
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace kv::kernels
