// The nccl backend's side channel (the ncclUniqueId exchange) admits only peers that prove the
// secret of TransportOptions::auth (transport/channel_auth.h): a connect with a wrong secret, or
// without one to a backend that has one, fails on the first answer with the reason and no link;
// the right secret connects, and with two GPUs a put then lands. Skips without a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <future>
#include <vector>

#include "transport/transport.h"

namespace kv::transport {
namespace {

using namespace std::chrono_literals;

int Devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

const std::string kSecret(32, 's');

Result<std::unique_ptr<Transport>> Nccl(int device, PeerAuth auth) {
  TransportOptions options;
  options.settings = {{"device", std::to_string(device)}, {"timeout_ms", "20000"}};
  options.auth = std::move(auth);
  return CreateTransport("nccl", options);
}

TEST(GpuNcclAuth, AWrongOrMissingSecretGetsNoLink) {
  if (Devices() < 1) GTEST_SKIP() << "needs a CUDA device";
  auto server = Nccl(0, {kSecret, false, "prefill"});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto wrong = Nccl(0, {std::string(32, 'w'), false, "intruder"});
  ASSERT_TRUE(wrong.ok()) << wrong.status().ToString();
  auto none = Nccl(0, {"", false, "anonymous"});
  ASSERT_TRUE(none.ok()) << none.status().ToString();

  auto refused = (*wrong)->connect((*server)->address());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kIncompatible) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("does not hold"), std::string::npos)
      << refused.status().ToString();

  auto anonymous = (*none)->connect((*server)->address());
  ASSERT_FALSE(anonymous.ok());
  EXPECT_EQ(anonymous.status().code(), Code::kIncompatible) << anonymous.status().ToString();

  // The server keeps serving: a peer with the secret connects afterwards.
  auto right = Nccl(0, {kSecret, false, "decode"});
  ASSERT_TRUE(right.ok()) << right.status().ToString();
  auto peer = (*right)->connect((*server)->address());
  EXPECT_TRUE(peer.ok()) << peer.status().ToString();
}

TEST(GpuNcclAuth, WithTheSecretAPutLands) {
  if (Devices() < 2) GTEST_SKIP() << "needs two CUDA devices";
  constexpr uint64_t kBytes = 1 << 20;
  auto sender = Nccl(0, {kSecret, false, "prefill"});
  auto receiver = Nccl(1, {kSecret, false, "decode"});
  ASSERT_TRUE(sender.ok() && receiver.ok());
  void* src = nullptr;
  void* dst = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&src, kBytes), cudaSuccess);
  std::vector<uint8_t> pattern(kBytes);
  for (uint64_t i = 0; i < kBytes; ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_EQ(cudaMemcpy(src, pattern.data(), kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dst, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(dst, 0, kBytes), cudaSuccess);
  {
    auto local = (*sender)->register_memory(src, kBytes, MemoryLocation::Cuda(0));
    auto remote_reg = (*receiver)->register_memory(dst, kBytes, MemoryLocation::Cuda(1));
    ASSERT_TRUE(local.ok() && remote_reg.ok());
    auto peer = (*sender)->connect((*receiver)->address());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    auto remote = (*sender)->import_remote(*peer, (*remote_reg)->packed_descriptor());
    ASSERT_TRUE(remote.ok()) << remote.status().ToString();
    const std::vector<kv::Run> runs = {{0, 0, kBytes}};
    std::promise<Status> done;
    Batch batch{Op::kPut, local->get(), remote->get(), runs, Clock::now() + 30s};
    ASSERT_TRUE((*sender)->post(batch, [&](Status s) { done.set_value(s); }).ok());
    auto landed = done.get_future();
    ASSERT_EQ(landed.wait_for(40s), std::future_status::ready);
    Status s = landed.get();
    ASSERT_TRUE(s.ok()) << s.ToString();
    std::vector<uint8_t> got(kBytes);
    ASSERT_EQ(cudaMemcpy(got.data(), dst, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(got == pattern);
  }
  sender->reset();
  receiver->reset();
  cudaFree(dst);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaFree(src);
}

}  // namespace
}  // namespace kv::transport
