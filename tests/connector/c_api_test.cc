// The C API end to end: two embedded kvd cores, a prefill and a decode engine, one request.
#include "kv/kv_connector.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/support/c_api_layout.h"

namespace {

using namespace kv::c_api_test;
constexpr auto Layout = SmallCLayout;

// Two embedded daemons on loopback, a prefill and a decode connector, each with the small
// layout registered (src and dst are their caches).
class CApi : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(StartDaemon("p", "127.0.0.1:0", "local", 0, &p, &err), 0) << err.message;
    ASSERT_EQ(StartDaemon("d", "127.0.0.1:0", "local", 0, &d, &err), 0) << err.message;
    ASSERT_EQ(OpenEmbedded(p, "prefill", &prefill, &err), 0) << err.message;
    ASSERT_EQ(OpenEmbedded(d, "decode", &decode, &err), 0) << err.message;
    ASSERT_EQ(RegisterOne(prefill, layout, &src, &err), 0) << err.message;
    ASSERT_EQ(RegisterOne(decode, layout, &dst, &err), 0) << err.message;
  }
  void TearDown() override {
    if (prefill != nullptr) kv_connector_close(prefill);
    if (decode != nullptr) kv_connector_close(decode);
    if (p != nullptr) kv_daemon_stop(p);
    if (d != nullptr) kv_daemon_stop(d);
  }

  kv_error err{};
  kv_daemon *p = nullptr, *d = nullptr;
  kv_connector *prefill = nullptr, *decode = nullptr;
  kv_layout layout = Layout();
  void *src = nullptr, *dst = nullptr;
};

TEST_F(CApi, MovesOneRequestAndReportsItFinishedOnBothSides) {
  // Blocks 1 and 2 of every layer (LBNHC: a block is 2·4·16 = 128 bytes, a layer 1024).
  for (int l = 0; l < 2; ++l) {
    std::memset(static_cast<char*>(src) + l * 1024 + 128, 0x40 + l, 256);
  }
  const int64_t src_blocks[] = {1, 2};
  const int64_t dst_blocks[] = {6, 5};
  kv_transfer_params params = ParamsFrom(kv_daemon_address(p), 8);
  ASSERT_EQ(kv_start_load(decode, "r1", &params, dst_blocks, 2, &err), 0) << err.message;
  for (int l = 0; l < 2; ++l) {
    ASSERT_EQ(kv_save_layer(prefill, "r1", l, src_blocks, 2, nullptr, &err), 0) << err.message;
  }
  kv_transfer_params out;
  KV_INIT(out);
  // The prefill side's blocks come back for the decode scheduler; a short buffer is cut, and
  // the count says so.
  int64_t remote[1] = {-1};
  size_t remote_count = 0;
  ASSERT_EQ(kv_request_finished(prefill, "r1", &out, remote, 1, &remote_count, &err), 0)
      << err.message;
  EXPECT_STREQ(out.peer_name, "p");
  EXPECT_EQ(remote_count, 2u);
  EXPECT_EQ(remote[0], 1);
  for (int l = 0; l < 2; ++l) {
    ASSERT_EQ(kv_wait_layer(decode, "r1", l, &err), 0) << err.message;
    const char* base = static_cast<const char*>(dst) + l * 1024;
    for (int b : {5, 6}) {
      for (int i = 0; i < 128; ++i) ASSERT_EQ(base[b * 128 + i], 0x40 + l);
    }
    for (int i = 0; i < 128; ++i) ASSERT_EQ(base[4 * 128 + i], 0);  // untouched neighbour
  }
  std::vector<std::pair<std::string, int>> finished;
  auto collect = [](void* ctx, const char* id, int sent) {
    static_cast<std::vector<std::pair<std::string, int>>*>(ctx)->emplace_back(id, sent);
  };
  for (int i = 0; i < 500 && finished.size() < 2; ++i) {
    ASSERT_EQ(kv_get_finished(prefill, collect, &finished, &err), 0);
    ASSERT_EQ(kv_get_finished(decode, collect, &finished, &err), 0);
    if (finished.size() < 2) usleep(2000);
  }
  ASSERT_EQ(finished.size(), 2u) << finished[0].first << " sent=" << finished[0].second;

  // Errors are values: a wait on an unknown request names it.
  EXPECT_EQ(kv_wait_layer(decode, "nope", 0, &err), 4);
  EXPECT_NE(std::string(err.message).find("nope"), std::string::npos);
  EXPECT_EQ(kv_save_layer(nullptr, "r", 0, src_blocks, 1, nullptr, &err), 1);
}

TEST_F(CApi, StartsSeveralLoadsInOneCallEachWithItsOwnResult) {
  kv_transfer_params params = ParamsFrom(kv_daemon_address(p), 4);  // one block
  const int64_t a_blocks[] = {3}, bad_blocks[] = {8}, b_blocks[] = {4};
  const kv_load loads[] = {
      {"a", &params, a_blocks, 1}, {"bad", &params, bad_blocks, 1}, {"b", &params, b_blocks, 1}};
  kv_error results[3] = {};
  ASSERT_EQ(kv_start_loads(decode, loads, 3, results, &err), 0) << err.message;
  EXPECT_EQ(results[0].code, 0) << results[0].message;
  EXPECT_EQ(results[1].code, 2) << results[1].message;  // out of range
  EXPECT_NE(std::string(results[1].message).find("block id 8"), std::string::npos);
  EXPECT_EQ(results[2].code, 0) << results[2].message;
  const char* ids[] = {"a", "b"};
  const int64_t src_blocks[] = {1, 2};
  // One call per layer for both requests (a forward pass's saves); a third save of an unknown
  // block is refused on its own.
  const int64_t outside[] = {8};
  const kv_save saves[] = {{"a", &src_blocks[0], 1}, {"b", &src_blocks[1], 1}, {"c", outside, 1}};
  for (int l = 0; l < 2; ++l) {
    for (int r = 0; r < 2; ++r) {
      std::memset(kv::c_api_test::SmallPage(src, l, static_cast<int>(src_blocks[r])), 0x50 + r,
                  128);
    }
    kv_error save_results[3] = {};
    ASSERT_EQ(kv_save_layers(prefill, l, saves, 3, nullptr, save_results, &err), 0) << err.message;
    EXPECT_EQ(save_results[0].code, KV_OK) << save_results[0].message;
    EXPECT_EQ(save_results[1].code, KV_OK) << save_results[1].message;
    EXPECT_EQ(save_results[2].code, KV_OUT_OF_RANGE) << save_results[2].message;
  }
  EXPECT_EQ(kv_save_layers(prefill, 0, saves, 0, nullptr, nullptr, &err), KV_INVALID_ARGUMENT);
  for (int r = 0; r < 2; ++r) {
    for (int l = 0; l < 2; ++l) {
      ASSERT_EQ(kv_wait_layer(decode, ids[r], l, &err), 0) << err.message;
      const char* page = kv::c_api_test::SmallPage(dst, l, r == 0 ? 3 : 4);
      for (int i = 0; i < 128; ++i) ASSERT_EQ(page[i], 0x50 + r);
    }
  }
  // The batch's own errors: nothing to report results into, an empty batch.
  EXPECT_EQ(kv_start_loads(decode, loads, 3, nullptr, &err), 1);
  EXPECT_EQ(kv_start_loads(decode, loads, 0, results, &err), 1);
  EXPECT_NE(std::string(err.message).find("1 to 1024 loads"), std::string::npos) << err.message;
}

TEST_F(CApi, FinishesSeveralRequestsInOneCallEachWithItsOwnResult) {
  const int64_t blocks[] = {1};
  for (const char* id : {"f1", "f2"}) {
    ASSERT_EQ(kv_save_layer(prefill, id, 0, blocks, 1, nullptr, &err), 0) << err.message;
  }
  const std::string token(32, 'c');  // 16 bytes in hex
  const kv_finish finishes[] = {
      {"f1", nullptr}, {"never-saved", nullptr}, {"f2", token.c_str()}, {"f3", "0011zz"}};
  kv_transfer_params out[4];
  for (kv_transfer_params& o : out) KV_INIT(o);
  kv_error results[4] = {};
  ASSERT_EQ(kv_requests_finished(prefill, finishes, 4, out, results, &err), 0) << err.message;
  EXPECT_EQ(results[0].code, KV_OK) << results[0].message;
  EXPECT_STREQ(out[0].request_id, "f1");
  EXPECT_STREQ(out[0].peer_name, "p");
  EXPECT_EQ(std::strlen(out[0].transfer_token), 32u);
  EXPECT_EQ(results[1].code, KV_NOT_FOUND) << results[1].message;
  EXPECT_NE(std::string(results[1].message).find("never-saved"), std::string::npos);
  EXPECT_EQ(results[2].code, KV_OK) << results[2].message;
  EXPECT_EQ(std::string(out[2].transfer_token), token);
  EXPECT_EQ(results[3].code, KV_INVALID_ARGUMENT) << results[3].message;
  // Without params out; the batch's own errors.
  ASSERT_EQ(kv_requests_finished(prefill, finishes, 1, nullptr, results, &err), 0) << err.message;
  EXPECT_EQ(results[0].code, KV_OK) << results[0].message;
  EXPECT_EQ(kv_requests_finished(prefill, finishes, 0, out, results, &err), KV_INVALID_ARGUMENT);
  EXPECT_EQ(kv_requests_finished(prefill, finishes, 1, out, nullptr, &err), KV_INVALID_ARGUMENT);
  out[0].struct_size = 0;
  EXPECT_EQ(kv_requests_finished(prefill, finishes, 1, out, results, &err), KV_INVALID_ARGUMENT);
}

// A load that fails: its blocks come back through kv_get_failed_blocks, and kv_load_error still
// says why afterwards (an engine's log line), here a source kvd nobody listens at.
TEST_F(CApi, AFailedLoadSaysWhyAfterItsBlocksCameBack) {
  kv_transfer_params params = ParamsFrom("127.0.0.1:1", 4);
  const int64_t blocks[] = {3};
  ASSERT_EQ(kv_start_load(decode, "lost", &params, blocks, 1, &err), 0) << err.message;
  EXPECT_EQ(kv_wait_layer(decode, "lost", 0, &err), KV_UNAVAILABLE) << err.message;
  int64_t failed[4] = {};
  size_t count = 0;
  ASSERT_EQ(kv_get_failed_blocks(decode, failed, 4, &count, &err), 0) << err.message;
  ASSERT_EQ(count, 1u);
  EXPECT_EQ(failed[0], 3);
  kv_error why;
  ASSERT_EQ(kv_load_error(decode, "lost", &why, &err), 0) << err.message;
  EXPECT_EQ(why.code, KV_UNAVAILABLE);
  EXPECT_NE(std::string(why.message).find("127.0.0.1:1"), std::string::npos) << why.message;
  ASSERT_EQ(kv_load_error(decode, "never", &why, &err), 0) << err.message;
  EXPECT_EQ(why.code, KV_OK);
}

// kv_set_transfer_token: with a peer secret (tokens required) the decode's Want presents the
// token the prefill fixed before its first save, and layer 0 arrives while the prefill still
// runs (layer 1 not saved, the request not finished); kv_request_finished returns that token.
TEST(CApiEarlyToken, AFixedTokenLetsLayersStreamBeforeTheRequestFinished) {
  char dir_template[] = "/tmp/kv-c-api-token-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string secret = std::string(dir_template) + "/secret";
  {
    const int fd = open(secret.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    const std::string bytes(32, 'q');
    ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    close(fd);
  }
  kv_error err{};
  kv_daemon *p = nullptr, *d = nullptr;
  for (auto [name, out] : {std::pair{"p", &p}, std::pair{"d", &d}}) {
    kv_daemon_options o;
    KV_INIT(o);
    o.name = name;
    o.transport = "local";
    o.auth_secret_file = secret.c_str();
    ASSERT_EQ(kv_daemon_start(&o, out, &err), 0) << err.message;
  }
  kv_connector *prefill = nullptr, *decode = nullptr;
  void *src = nullptr, *dst = nullptr;
  ASSERT_EQ(OpenEmbedded(p, "prefill", &prefill, &err), 0) << err.message;
  ASSERT_EQ(OpenEmbedded(d, "decode", &decode, &err), 0) << err.message;
  ASSERT_EQ(RegisterOne(prefill, Layout(), &src, &err), 0) << err.message;
  ASSERT_EQ(RegisterOne(decode, Layout(), &dst, &err), 0) << err.message;

  const char* token = "0123456789abcdef0123456789abcdef";
  ASSERT_EQ(kv_set_transfer_token(prefill, "r", token, &err), 0) << err.message;
  kv_transfer_params params = ParamsFrom(kv_daemon_address(p), 4);  // one block
  std::snprintf(params.transfer_token, sizeof(params.transfer_token), "%s", token);
  const int64_t src_blocks[] = {1}, dst_blocks[] = {3};
  ASSERT_EQ(kv_start_load(decode, "r", &params, dst_blocks, 1, &err), 0) << err.message;
  std::memset(SmallPage(src, 0, 1), 0x61, 128);
  ASSERT_EQ(kv_save_layer(prefill, "r", 0, src_blocks, 1, nullptr, &err), 0) << err.message;
  ASSERT_EQ(kv_wait_layer(decode, "r", 0, &err), 0) << err.message;
  for (int i = 0; i < 128; ++i) ASSERT_EQ(SmallPage(dst, 0, 3)[i], 0x61);

  std::memset(SmallPage(src, 1, 1), 0x62, 128);
  ASSERT_EQ(kv_save_layer(prefill, "r", 1, src_blocks, 1, nullptr, &err), 0) << err.message;
  kv_transfer_params out;
  KV_INIT(out);
  ASSERT_EQ(kv_request_finished(prefill, "r", &out, nullptr, 0, nullptr, &err), 0) << err.message;
  EXPECT_STREQ(out.transfer_token, token);
  ASSERT_EQ(kv_wait_layer(decode, "r", 1, &err), 0) << err.message;
  for (int i = 0; i < 128; ++i) ASSERT_EQ(SmallPage(dst, 1, 3)[i], 0x62);

  kv_connector_close(prefill);
  kv_connector_close(decode);
  kv_daemon_stop(p);
  kv_daemon_stop(d);
  unlink(secret.c_str());
  rmdir(dir_template);
}

// busy_poll: both connectors spin (their readers on kvd's socket, kv_wait_layer while it waits).
// A request moves as it does sleeping, and a wait for a layer that never comes still ends at the
// connector's timeout. A caller built before busy_poll existed (a shorter struct) still opens.
TEST(CApiBusyPoll, SpinningConnectorsMoveARequestAndStillTimeOut) {
  kv_error err{};
  kv_daemon *p = nullptr, *d = nullptr;
  ASSERT_EQ(StartDaemon("p", "127.0.0.1:0", "local", 0, &p, &err), 0) << err.message;
  ASSERT_EQ(StartDaemon("d", "127.0.0.1:0", "local", 0, &d, &err), 0) << err.message;
  kv_connector *prefill = nullptr, *decode = nullptr, *older = nullptr;
  kv_connector_options spin = ConnectorOptions("prefill", 300);
  spin.busy_poll = 1;
  ASSERT_EQ(kv_connector_open_embedded(p, &spin, &prefill, &err), 0) << err.message;
  spin.instance = "decode";
  ASSERT_EQ(kv_connector_open_embedded(d, &spin, &decode, &err), 0) << err.message;
  kv_connector_options before = ConnectorOptions("older");
  before.struct_size = offsetof(kv_connector_options, busy_poll);
  ASSERT_EQ(kv_connector_open_embedded(d, &before, &older, &err), 0) << err.message;
  void *src = nullptr, *dst = nullptr;
  ASSERT_EQ(RegisterOne(prefill, Layout(), &src, &err), 0) << err.message;
  ASSERT_EQ(RegisterOne(decode, Layout(), &dst, &err), 0) << err.message;

  kv_transfer_params params = ParamsFrom(kv_daemon_address(p), 4);  // one block
  const int64_t src_blocks[] = {2}, dst_blocks[] = {5};
  ASSERT_EQ(kv_start_load(decode, "r", &params, dst_blocks, 1, &err), 0) << err.message;
  for (int l = 0; l < 2; ++l) {
    std::memset(SmallPage(src, l, 2), 0x70 + l, 128);
    ASSERT_EQ(kv_save_layer(prefill, "r", l, src_blocks, 1, nullptr, &err), 0) << err.message;
  }
  kv_transfer_params out;
  KV_INIT(out);
  ASSERT_EQ(kv_request_finished(prefill, "r", &out, nullptr, 0, nullptr, &err), 0) << err.message;
  for (int l = 0; l < 2; ++l) {
    ASSERT_EQ(kv_wait_layer(decode, "r", l, &err), 0) << err.message;
    for (int i = 0; i < 128; ++i) ASSERT_EQ(SmallPage(dst, l, 5)[i], 0x70 + l);
  }

  // Asked for, never saved: the spinning wait gives up at the connector's 300 ms.
  ASSERT_EQ(kv_start_load(decode, "never", &params, dst_blocks, 1, &err), 0) << err.message;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(kv_wait_layer(decode, "never", 0, &err), 7) << err.message;  // kTimeout
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(290));
  EXPECT_LT(waited, std::chrono::seconds(10));

  kv_connector_close(older);
  kv_connector_close(prefill);
  kv_connector_close(decode);
  kv_daemon_stop(p);
  kv_daemon_stop(d);
}

}  // namespace
