// `kvbench pd --memory cuda` where it cannot run: no CUDA device (this machine, the CPU-only CI)
// or no CUDA in the build. It must fail at once, before starting any kvd, and say why. On a GPU
// machine these cases skip: the GPU run itself (benchmarks/pd_gpu.md) is the check there.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "tools/kvbench/pd/pd_gpu.h"

namespace kv::connector {
namespace {

struct Outcome {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs build/bin/kvbench (beside this test) with `args`.
Outcome Kvbench(const std::string& args) {
  const auto self = std::filesystem::read_symlink("/proc/self/exe");
  const std::string command =
      "'" + (self.parent_path() / "kvbench").string() + "' " + args + " 2>&1";
  Outcome o;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return o;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) o.output.append(buf, n);
  const int status = pclose(pipe);
  if (WIFEXITED(status)) o.exit_code = WEXITSTATUS(status);
  return o;
}

TEST(PdGpuTest, CreateWithoutDeviceSaysWhy) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  PdConfig config;
  config.head_dim = 128;
  auto engines = CudaPdEngines::Create(config, 0, 0);
  ASSERT_FALSE(engines.ok());
  const std::string message = engines.status().message();
  EXPECT_NE(message.find("--memory cuda"), std::string::npos) << message;
  EXPECT_NE(message.find("CUDA"), std::string::npos) << message;
}

TEST(PdGpuTest, KvbenchPdMemoryCudaWithoutDeviceFailsClearly) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  const Outcome o = Kvbench("pd --memory cuda --requests 1 --tokens 16 --layers 1 --no-ceiling");
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_NE(o.output.find("kvbench pd: --memory cuda"), std::string::npos) << o.output;
  // It failed before starting kvds: no table, no progress.
  EXPECT_EQ(o.output.find("requests"), std::string::npos) << o.output;
}

TEST(PdGpuTest, KvbenchPdRefusesAnUnknownMemoryKind) {
  const Outcome o = Kvbench("pd --memory disk");
  EXPECT_EQ(o.exit_code, 2) << o.output;
  EXPECT_NE(o.output.find("--memory is host or cuda, not disk"), std::string::npos) << o.output;
}

}  // namespace
}  // namespace kv::connector
