// Issue 19: UCX's tcp interface listened on every interface even with `--listen 127.0.0.1`, so a
// loopback-only kvd still offered its UCX worker to the network. With ucx_net_devices = "lo"
// (what `kvd` sets without a secret) every TCP socket this process listens on is on loopback.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/daemon.h"
#include "transport/transport.h"

namespace kv {
namespace {

// Local addresses (hex, as /proc/net/tcp* print them) of the TCP sockets this process listens on.
std::vector<std::string> ListeningAddresses() {
  std::set<std::string> inodes;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream row(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      row >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >>
          inode;
      if (state == "0A" && inodes.count(inode)) out.push_back(local.substr(0, local.find(':')));
    }
  }
  return out;
}

bool Loopback(const std::string& hex) {
  if (hex.size() == 8) return hex.substr(6) == "7F";   // 127.x.x.x, little-endian
  return hex == "00000000000000000000000001000000" ||  // ::1
         (hex.substr(0, 24) == "0000000000000000FFFF0000" && hex.substr(30) == "7F");
}

TEST(UcxListen, ALoopbackOnlyKvdKeepsUcxOnLoopback) {
  const auto available = transport::AvailableTransports();
  if (std::find(available.begin(), available.end(), "ucx") == available.end()) {
    GTEST_SKIP() << "this build has no ucx transport";
  }
  daemon::DaemonOptions options;
  options.name = "loopback";
  options.transport_name = "ucx";
  options.ucx_net_devices = "lo";
  auto d = daemon::Daemon::Start(std::move(options));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  const std::vector<std::string> listening = ListeningAddresses();
  EXPECT_FALSE(listening.empty());
  for (const std::string& address : listening) {
    EXPECT_TRUE(Loopback(address)) << "listening on " << address << " (hex, /proc/net/tcp)";
  }
}

}  // namespace
}  // namespace kv
