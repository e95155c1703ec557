// Issue 20: transport settings reach the backend from DaemonOptions::transport_settings and from
// `kvd --transport-opt KEY=VALUE`, checked against the keys the backend takes; `kvd --help` lists
// them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>

#include "daemon/daemon.h"
#include "transport/transport.h"

namespace kv {
namespace {

bool HasUcx() {
  const auto available = transport::AvailableTransports();
  return std::find(available.begin(), available.end(), "ucx") != available.end();
}

TEST(TransportSettings, AKeyTheBackendDoesNotTakeFailsTheStart) {
  daemon::DaemonOptions options;
  options.transport_name = "local";
  options.listen = "";
  options.transport_settings = {{"lanes", "2"}};
  auto d = daemon::Daemon::Start(std::move(options));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
  EXPECT_NE(d.status().message().find("lanes"), std::string::npos) << d.status().ToString();
}

TEST(TransportSettings, UcxTakesItsOwnKeysAndRefusesBadValues) {
  if (!HasUcx()) GTEST_SKIP() << "this build has no ucx transport";
  daemon::DaemonOptions good;
  good.transport_name = "ucx";
  good.listen = "";
  good.ucx_net_devices = "lo";
  good.transport_settings = {{"put_path", "am"}, {"max_inflight_bytes", "4194304"}};
  auto d = daemon::Daemon::Start(std::move(good));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  (*d)->Shutdown();

  daemon::DaemonOptions bad;
  bad.transport_name = "ucx";
  bad.listen = "";
  bad.transport_settings = {{"put_path", "sideways"}};
  auto refused = daemon::Daemon::Start(std::move(bad));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument) << refused.status().ToString();
}

// Runs the kvd beside this test with `args`; its exit code and output. Bounded by timeout(1): a
// kvd that wrongly starts serving is killed.
std::pair<int, std::string> RunKvd(const std::string& args) {
  const auto kvd = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "kvd";
  const std::string command = "timeout 20 '" + kvd.string() + "' " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  std::string output;
  char buf[512];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

TEST(TransportSettings, KvdHelpListsEveryBackendsKeys) {
  auto [code, out] = RunKvd("--help");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("--transport-opt KEY=VALUE"), std::string::npos) << out;
  EXPECT_NE(out.find("  local: none"), std::string::npos) << out;
  for (const std::string& name : transport::AvailableTransports()) {
    auto info = transport::DescribeTransport(name);
    ASSERT_TRUE(info.ok());
    for (const transport::SettingInfo& s : info->settings) {
      EXPECT_NE(out.find(std::string("    ") + s.key + " "), std::string::npos)
          << name << " " << s.key;
    }
  }
}

TEST(TransportSettings, KvdRefusesBadTransportOptsBeforeServing) {
  const std::string socket = "/tmp/kvd-transport-opt-" + std::to_string(::getpid()) + ".sock";
  const std::string base = "--socket " + socket + " --transport local ";
  for (const auto& [args, expected] :
       {std::pair<std::string, std::string>{"--transport-opt lanes=2", "takes no setting lanes"},
        {"--transport-opt device=1", "use --device"},
        {"--transport-opt novalue", "is not KEY=VALUE"}}) {
    auto [code, out] = RunKvd(base + args);
    EXPECT_EQ(code, 2) << args << ": " << out;
    EXPECT_NE(out.find(expected), std::string::npos) << args << ": " << out;
    EXPECT_EQ(out.find("ready"), std::string::npos) << out;
  }
  std::filesystem::remove(socket);
}

}  // namespace
}  // namespace kv
