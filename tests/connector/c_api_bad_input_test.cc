// Every exported C function with each kind of bad argument: NULL pointers, zero counts, ids over
// KV_MAX_ID_BYTES, unknown region indices, option structs without their size. Each must come back
// as a code and a message; nothing aborts, nothing throws, no output pointer is left dangling.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "kv/kv_connector.h"
#include "tests/support/c_api_layout.h"

namespace {

using namespace kv::c_api_test;

class CApiBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(StartDaemon("bad", "127.0.0.1:0", "local", 1 << 20, &d, &err), 0) << err.message;
    ASSERT_EQ(OpenEmbedded(d, "engine", &c, &err), 0) << err.message;
    ASSERT_EQ(RegisterOne(c, SmallCLayout(), &base, &err), 0) << err.message;
  }
  void TearDown() override {
    kv_connector_close(c);
    kv_daemon_stop(d);
  }
  // The call returned `code` and said something containing `words`.
  void Expect(int rc, int code, const char* words) {
    EXPECT_EQ(rc, code) << err.message;
    EXPECT_EQ(err.code, code);
    EXPECT_NE(std::string(err.message).find(words), std::string::npos) << err.message;
  }

  kv_error err{};
  kv_daemon* d = nullptr;
  kv_connector* c = nullptr;
  void* base = nullptr;
  const int64_t blocks[2] = {1, 2};
  const std::string long_id = std::string(KV_MAX_ID_BYTES + 1, 'x');
  const std::string longest_id = std::string(KV_MAX_ID_BYTES, 'y');
};

TEST_F(CApiBadInput, NamesAndVersion) {
  EXPECT_STREQ(kv_strerror(KV_OK), "ok");
  EXPECT_STREQ(kv_strerror(KV_TIMEOUT), "timeout");
  EXPECT_STREQ(kv_strerror(KV_UNAVAILABLE), "unavailable");
  EXPECT_STREQ(kv_strerror(KV_INTERNAL), "internal");
  EXPECT_STREQ(kv_strerror(-1), "unknown");
  EXPECT_STREQ(kv_strerror(KV_INTERNAL + 1), "unknown");
  EXPECT_STREQ(kv_version(), KV_VERSION_STRING);
  EXPECT_STREQ(kv_daemon_address(nullptr), "");
  kv_daemon_stop(nullptr);  // ignored
  kv_connector_close(nullptr);
  kv_offload_op_free(nullptr);
}

TEST_F(CApiBadInput, DaemonAndConnectorOptions) {
  kv_daemon* out = reinterpret_cast<kv_daemon*>(&err);
  Expect(kv_daemon_start(nullptr, &out, &err), KV_INVALID_ARGUMENT, "options is NULL");
  EXPECT_EQ(out, nullptr);
  kv_daemon_options o{};  // struct_size 0
  Expect(kv_daemon_start(&o, &out, &err), KV_INVALID_ARGUMENT, "struct_size");
  o.struct_size = sizeof(o) + 8;  // a newer caller's bigger struct
  Expect(kv_daemon_start(&o, &out, &err), KV_INVALID_ARGUMENT, "struct_size");
  KV_INIT(o);
  Expect(kv_daemon_start(&o, nullptr, &err), KV_INVALID_ARGUMENT, "out is NULL");
  o.name = long_id.c_str();
  Expect(kv_daemon_start(&o, &out, &err), KV_INVALID_ARGUMENT, "longer than 256");
  o.name = "x";
  o.transport = "carrier-pigeon";
  EXPECT_NE(kv_daemon_start(&o, &out, &err), KV_OK);
  EXPECT_NE(std::string(err.message).find("carrier-pigeon"), std::string::npos) << err.message;

  kv_connector* conn = reinterpret_cast<kv_connector*>(&err);
  kv_connector_options co = ConnectorOptions("e");
  Expect(kv_connector_open(nullptr, &co, &conn, &err), KV_INVALID_ARGUMENT, "socket_path");
  EXPECT_EQ(conn, nullptr);
  Expect(kv_connector_open("/nonexistent/kvd.sock", &co, &conn, &err), KV_UNAVAILABLE,
         "/nonexistent/kvd.sock");
  Expect(kv_connector_open_embedded(nullptr, &co, &conn, &err), KV_INVALID_ARGUMENT, "daemon");
  Expect(kv_connector_open_embedded(d, nullptr, &conn, &err), KV_INVALID_ARGUMENT, "options");
  Expect(kv_connector_open_embedded(d, &co, nullptr, &err), KV_INVALID_ARGUMENT, "out");
  co.struct_size = 0;
  Expect(kv_connector_open_embedded(d, &co, &conn, &err), KV_INVALID_ARGUMENT, "struct_size");
  co = ConnectorOptions(long_id.c_str());
  Expect(kv_connector_open_embedded(d, &co, &conn, &err), KV_INVALID_ARGUMENT, "instance");
  co = ConnectorOptions("e");
  co.tp_rank = 2;
  co.tp_size = 2;
  Expect(kv_connector_open_embedded(d, &co, &conn, &err), KV_INVALID_ARGUMENT, "tp_rank");
  co = ConnectorOptions("e", -5);
  Expect(kv_connector_open_embedded(d, &co, &conn, &err), KV_INVALID_ARGUMENT, "timeout_ms");
}

TEST_F(CApiBadInput, Registration) {
  kv_cache_desc desc = HostDesc(SmallCLayout());
  void* out[2] = {};
  Expect(kv_register_kv_caches(nullptr, &desc, 1, out, &err), KV_INVALID_ARGUMENT, "connector");
  Expect(kv_register_kv_caches(c, nullptr, 1, out, &err), KV_INVALID_ARGUMENT, "caches");
  Expect(kv_register_kv_caches(c, &desc, 0, out, &err), KV_INVALID_ARGUMENT, "count is 0");
  Expect(kv_register_kv_caches(c, &desc, 1, nullptr, &err), KV_INVALID_ARGUMENT, "bases");
  desc.struct_size = 0;
  Expect(kv_register_kv_caches(c, &desc, 1, out, &err), KV_INVALID_ARGUMENT, "struct_size");
  desc = HostDesc(SmallCLayout());
  desc.memory = 7;
  Expect(kv_register_kv_caches(c, &desc, 1, out, &err), KV_INVALID_ARGUMENT, "memory 7");
  desc = HostDesc(SmallCLayout());
  Expect(kv_register_kv_caches(c, &desc, 1, out, &err), KV_ALREADY_EXISTS, "already");

  // A fresh connector: a malformed layout, and host memory kvd cannot map.
  kv_connector* other = nullptr;
  ASSERT_EQ(OpenEmbedded(d, "other", &other, &err), 0) << err.message;
  desc.layout.order = "LBNQC";
  Expect(kv_register_kv_caches(other, &desc, 1, out, &err), KV_INVALID_ARGUMENT, "LBNQC");
  static char not_shared[1 << 14];
  desc = HostDesc(SmallCLayout(), not_shared);
  Expect(kv_register_kv_caches(other, &desc, 1, out, &err), KV_INVALID_ARGUMENT,
         "kv_host_memory_alloc");
  // Inside kv_host_memory_alloc's memory it works, also at an offset; past its end it does not.
  void* memory = nullptr;
  ASSERT_EQ(kv_host_memory_alloc(3 * 4096, &memory, &err), 0) << err.message;
  desc = HostDesc(SmallCLayout(), static_cast<char*>(memory) + 8192);  // 2048 bytes of 4096 left
  EXPECT_EQ(kv_register_kv_caches(other, &desc, 1, out, &err), KV_OK) << err.message;
  EXPECT_EQ(out[0], desc.base);
  kv_connector_close(other);
  ASSERT_EQ(OpenEmbedded(d, "third", &other, &err), 0) << err.message;
  desc = HostDesc(SmallCLayout(), static_cast<char*>(memory) + 3 * 4096 - 1024);
  Expect(kv_register_kv_caches(other, &desc, 1, out, &err), KV_INVALID_ARGUMENT,
         "not inside memory kvd can map");
  kv_connector_close(other);
  EXPECT_EQ(kv_host_memory_free(memory, &err), KV_OK) << err.message;
  Expect(kv_host_memory_free(memory, &err), KV_NOT_FOUND, "freed already");
  Expect(kv_host_memory_free(nullptr, &err), KV_INVALID_ARGUMENT, "base");
  Expect(kv_host_memory_alloc(0, &memory, &err), KV_INVALID_ARGUMENT, "0 bytes");
  Expect(kv_host_memory_alloc(64, nullptr, &err), KV_INVALID_ARGUMENT, "out");
}

TEST_F(CApiBadInput, SaveFinishLoadWait) {
  Expect(kv_save_layer(nullptr, "r", 0, blocks, 2, nullptr, &err), KV_INVALID_ARGUMENT,
         "connector");
  Expect(kv_save_layer(c, nullptr, 0, blocks, 2, nullptr, &err), KV_INVALID_ARGUMENT, "request");
  Expect(kv_save_layer(c, "", 0, blocks, 2, nullptr, &err), KV_INVALID_ARGUMENT, "empty");
  Expect(kv_save_layer(c, long_id.c_str(), 0, blocks, 2, nullptr, &err), KV_INVALID_ARGUMENT,
         "longer than 256");
  Expect(kv_save_layer(c, "r", 0, nullptr, 2, nullptr, &err), KV_INVALID_ARGUMENT, "block_ids");
  Expect(kv_save_layer(c, "r", 0, blocks, 0, nullptr, &err), KV_INVALID_ARGUMENT, "count is 0");
  Expect(kv_save_layer(c, "r", 9, blocks, 2, nullptr, &err), KV_OUT_OF_RANGE, "layer 9");
  const int64_t outside[] = {8};
  Expect(kv_save_layer(c, "r", 0, outside, 1, nullptr, &err), KV_OUT_OF_RANGE, "block id 8");
  // The longest id is whole, not cut: saved, finished and named back byte for byte.
  for (int l = 0; l < 2; ++l) {
    ASSERT_EQ(kv_save_layer(c, longest_id.c_str(), l, blocks, 2, nullptr, &err), KV_OK)
        << err.message;
  }
  kv_transfer_params params;
  KV_INIT(params);
  int64_t remote[4];
  size_t count = 0;
  ASSERT_EQ(kv_request_finished(c, longest_id.c_str(), &params, remote, 4, &count, &err), KV_OK)
      << err.message;
  EXPECT_EQ(std::string(params.request_id), longest_id);
  EXPECT_EQ(count, 2u);
  Expect(kv_request_finished(c, "r", nullptr, nullptr, 0, nullptr, &err), KV_INVALID_ARGUMENT,
         "out");
  Expect(kv_request_finished(c, "r", &params, nullptr, 4, nullptr, &err), KV_INVALID_ARGUMENT,
         "remote_block_ids");
  params.struct_size = 0;
  Expect(kv_request_finished(c, "r", &params, nullptr, 0, nullptr, &err), KV_INVALID_ARGUMENT,
         "struct_size");
  // The engine's own transfer token: 32 to 64 hex digits, handed back as given.
  KV_INIT(params);
  for (int l = 0; l < 2; ++l) ASSERT_EQ(kv_save_layer(c, "t", l, blocks, 2, nullptr, &err), KV_OK);
  const std::string token = "00112233445566778899AABBCCDDEEFF";
  Expect(kv_request_finished_with_token(c, "t", nullptr, &params, nullptr, 0, nullptr, &err),
         KV_INVALID_ARGUMENT, "transfer_token");
  Expect(kv_request_finished_with_token(c, "t", "0011zz", &params, nullptr, 0, nullptr, &err),
         KV_INVALID_ARGUMENT, "non-hex");
  Expect(kv_request_finished_with_token(c, "t", "00112", &params, nullptr, 0, nullptr, &err),
         KV_INVALID_ARGUMENT, "even number");
  Expect(kv_request_finished_with_token(c, "t", "0011", &params, nullptr, 0, nullptr, &err),
         KV_INVALID_ARGUMENT, "2 bytes");
  Expect(kv_request_finished_with_token(c, "t", std::string(66, 'a').c_str(), &params, nullptr, 0,
                                        nullptr, &err),
         KV_INVALID_ARGUMENT, "at most 64");
  ASSERT_EQ(
      kv_request_finished_with_token(c, "t", token.c_str(), &params, nullptr, 0, nullptr, &err),
      KV_OK)
      << err.message;
  EXPECT_EQ(std::string(params.transfer_token), "00112233445566778899aabbccddeeff");
  // The token fixed early (kv_set_transfer_token): checked here as above, one-way once good.
  Expect(kv_set_transfer_token(nullptr, "u", token.c_str(), &err), KV_INVALID_ARGUMENT,
         "connector");
  Expect(kv_set_transfer_token(c, nullptr, token.c_str(), &err), KV_INVALID_ARGUMENT, "request");
  Expect(kv_set_transfer_token(c, long_id.c_str(), token.c_str(), &err), KV_INVALID_ARGUMENT,
         "longer than 256");
  Expect(kv_set_transfer_token(c, "u", nullptr, &err), KV_INVALID_ARGUMENT, "transfer_token");
  Expect(kv_set_transfer_token(c, "u", "0011zz", &err), KV_INVALID_ARGUMENT, "non-hex");
  Expect(kv_set_transfer_token(c, "u", "0011", &err), KV_INVALID_ARGUMENT, "2 bytes");
  ASSERT_EQ(kv_set_transfer_token(c, "u", token.c_str(), &err), KV_OK) << err.message;
  for (int l = 0; l < 2; ++l) ASSERT_EQ(kv_save_layer(c, "u", l, blocks, 2, nullptr, &err), KV_OK);
  ASSERT_EQ(kv_request_finished(c, "u", &params, nullptr, 0, nullptr, &err), KV_OK) << err.message;
  EXPECT_EQ(std::string(params.transfer_token), "00112233445566778899aabbccddeeff");

  kv_transfer_params p = ParamsFrom(kv_daemon_address(d), 4);
  Expect(kv_start_load(nullptr, "a", &p, blocks, 1, &err), KV_INVALID_ARGUMENT, "connector");
  Expect(kv_start_load(c, long_id.c_str(), &p, blocks, 1, &err), KV_INVALID_ARGUMENT, "256");
  Expect(kv_start_load(c, "a", nullptr, blocks, 1, &err), KV_INVALID_ARGUMENT, "params");
  Expect(kv_start_load(c, "a", &p, nullptr, 1, &err), KV_INVALID_ARGUMENT, "block_ids");
  Expect(kv_start_load(c, "a", &p, blocks, 0, &err), KV_INVALID_ARGUMENT, "no blocks");
  p.mode = 5;
  Expect(kv_start_load(c, "a", &p, blocks, 1, &err), KV_INVALID_ARGUMENT, "mode 5");
  p = ParamsFrom("", 4);
  Expect(kv_start_load(c, "a", &p, blocks, 1, &err), KV_INVALID_ARGUMENT, "peer_address");
  p = ParamsFrom(kv_daemon_address(d), 4);
  std::strcpy(p.transfer_token, "abc");
  Expect(kv_start_load(c, "a", &p, blocks, 1, &err), KV_INVALID_ARGUMENT, "hex");
  std::memset(p.request_id, 'z', sizeof(p.request_id));  // no NUL
  p.transfer_token[0] = '\0';
  Expect(kv_start_load(c, "a", &p, blocks, 1, &err), KV_INVALID_ARGUMENT, "NUL");

  p = ParamsFrom(kv_daemon_address(d), 4);
  kv_load loads[1] = {{"a", &p, blocks, 1}};
  kv_error results[1];
  Expect(kv_start_loads(c, nullptr, 1, results, &err), KV_INVALID_ARGUMENT, "loads");
  Expect(kv_start_loads(c, loads, 1, nullptr, &err), KV_INVALID_ARGUMENT, "results");
  Expect(kv_start_loads(c, loads, 0, results, &err), KV_INVALID_ARGUMENT, "1 to 1024");
  Expect(kv_start_loads(c, loads, KV_MAX_LOADS_PER_CALL + 1, results, &err), KV_INVALID_ARGUMENT,
         "1 to 1024");
  loads[0].request = long_id.c_str();
  Expect(kv_start_loads(c, loads, 1, results, &err), KV_INVALID_ARGUMENT, "load 0");

  kv_error why;
  Expect(kv_load_error(c, "a", nullptr, &err), KV_INVALID_ARGUMENT, "load_error");
  Expect(kv_load_error(c, long_id.c_str(), &why, &err), KV_INVALID_ARGUMENT, "256");
  ASSERT_EQ(kv_load_error(c, "never-loaded", &why, &err), KV_OK) << err.message;
  EXPECT_EQ(why.code, KV_OK);

  Expect(kv_wait_layer(nullptr, "a", 0, &err), KV_INVALID_ARGUMENT, "connector");
  Expect(kv_wait_layer(c, nullptr, 0, &err), KV_INVALID_ARGUMENT, "request");
  Expect(kv_wait_layer(c, "never-loaded", 0, &err), KV_NOT_FOUND, "never-loaded");
}

TEST_F(CApiBadInput, CompletionAndStatus) {
  Expect(kv_get_finished(c, nullptr, nullptr, &err), KV_INVALID_ARGUMENT, "on_request");
  Expect(kv_get_finished(
             nullptr, [](void*, const char*, int) {}, nullptr, &err),
         KV_INVALID_ARGUMENT, "connector");
  size_t count = 99;
  EXPECT_EQ(kv_get_failed_blocks(c, nullptr, 0, &count, &err), KV_OK) << err.message;
  EXPECT_EQ(count, 0u);
  Expect(kv_get_failed_blocks(c, nullptr, 0, nullptr, &err), KV_INVALID_ARGUMENT, "count");
  Expect(kv_get_failed_blocks(c, nullptr, 4, &count, &err), KV_INVALID_ARGUMENT, "block_ids");

  size_t length = 0;
  char tiny[4];
  Expect(kv_daemon_status_json(c, tiny, sizeof(tiny), &length, &err), KV_RESOURCE_EXHAUSTED,
         "buffer holds 4");
  ASSERT_GT(length, 4u);
  std::string json(length + 4096, '\0');  // its figures may grow between two calls
  ASSERT_EQ(kv_daemon_status_json(c, json.data(), json.size(), &length, &err), KV_OK)
      << err.message;
  EXPECT_NE(json.find("\"name\":\"bad\""), std::string::npos) << json;
  Expect(kv_daemon_status_json(c, nullptr, 8, nullptr, &err), KV_INVALID_ARGUMENT, "buf");
}

TEST_F(CApiBadInput, Offload) {
  uint8_t keys[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  kv_offload_op* op = reinterpret_cast<kv_offload_op*>(&err);
  Expect(kv_offload_store(c, 0, keys, 8, blocks, 2, nullptr, nullptr, nullptr, nullptr, 0, &err),
         KV_INVALID_ARGUMENT, "op");
  Expect(kv_offload_store(c, 0, keys, 8, nullptr, 2, nullptr, &op, nullptr, nullptr, 0, &err),
         KV_INVALID_ARGUMENT, "block_ids");
  EXPECT_EQ(op, nullptr);
  Expect(kv_offload_store(c, 0, keys, 8, blocks, 0, nullptr, &op, nullptr, nullptr, 0, &err),
         KV_INVALID_ARGUMENT, "count is 0");
  Expect(kv_offload_store(c, 0, keys, 8, blocks, 2, nullptr, &op, nullptr, nullptr, 3, &err),
         KV_INVALID_ARGUMENT, "evicted");
  kv_offload_store_info info{};  // no struct_size
  Expect(kv_offload_store(c, 0, keys, 8, blocks, 2, nullptr, &op, &info, nullptr, 0, &err),
         KV_INVALID_ARGUMENT, "struct_size");
  Expect(kv_offload_store(c, 5, keys, 8, blocks, 2, nullptr, &op, nullptr, nullptr, 0, &err),
         KV_OUT_OF_RANGE, "region 5");
  Expect(kv_offload_store(c, 0, keys, 33, blocks, 2, nullptr, &op, nullptr, nullptr, 0, &err),
         KV_INVALID_ARGUMENT, "33 bytes");
  size_t hits = 0;
  Expect(kv_offload_lookup(c, 0, keys, 8, 2, nullptr, &err), KV_INVALID_ARGUMENT, "hits");
  Expect(kv_offload_lookup(c, 0, keys, 8, 0, &hits, &err), KV_INVALID_ARGUMENT, "count is 0");
  Expect(kv_offload_lookup(nullptr, 0, keys, 8, 2, &hits, &err), KV_INVALID_ARGUMENT, "connector");
  Expect(kv_offload_load(c, 0, keys, 8, blocks, 2, 0, nullptr, &err), KV_INVALID_ARGUMENT, "op");
  Expect(kv_offload_load(c, 0, keys, 8, blocks, 2, 0, &op, &err), KV_NOT_FOUND, "0102030405060708");
  EXPECT_EQ(op, nullptr);
  Expect(kv_offload_load(c, 9, keys, 8, blocks, 2, 0, &op, &err), KV_OUT_OF_RANGE, "region 9");
  Expect(kv_offload_wait(nullptr, &err), KV_INVALID_ARGUMENT, "op");
  Expect(kv_offload_wait_layer(nullptr, 0, &err), KV_INVALID_ARGUMENT, "op");
}

}  // namespace
