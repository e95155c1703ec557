// The C API's offload calls: store, lookup, load with per-layer waits, and errors as values.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kv/kv_connector.h"
#include "tests/support/c_api_layout.h"

namespace {

constexpr auto Layout = kv::c_api_test::SmallCLayout;
constexpr auto Page = kv::c_api_test::SmallPage;

TEST(OffloadCApi, StoreLookupLoadAndErrorsAsValues) {
  kv_error err{};
  kv_daemon* daemon = nullptr;
  ASSERT_EQ(kv::c_api_test::StartDaemon("c", "", "local", 16 * 256, &daemon, &err), 0)
      << err.message;
  kv_connector* c = nullptr;
  ASSERT_EQ(kv::c_api_test::OpenEmbedded(daemon, "engine", &c, &err), 0) << err.message;
  void* base = nullptr;
  ASSERT_EQ(kv::c_api_test::RegisterOne(c, Layout(), &base, &err), 0) << err.message;
  for (int l = 0; l < 2; ++l) {
    std::memset(Page(base, l, 1), 0x10 + l, 128);
    std::memset(Page(base, l, 2), 0x20 + l, 128);
  }

  // Two 16-byte keys, back to back.
  uint8_t keys[32];
  for (int i = 0; i < 32; ++i) keys[i] = static_cast<uint8_t>(i * 7 + 1);
  const int64_t src[2] = {1, 2};
  kv_offload_op* op = nullptr;
  kv_offload_store_info info;
  KV_INIT(info);
  ASSERT_EQ(kv_offload_store(c, 0, keys, 16, src, 2, nullptr, &op, &info, nullptr, 0, &err), 0)
      << err.message;
  EXPECT_EQ(info.stored, 2u);
  EXPECT_EQ(info.evicted, 0u);
  ASSERT_EQ(kv_offload_wait(op, &err), 0) << err.message;
  kv_offload_op_free(op);

  size_t hits = 0;
  ASSERT_EQ(kv_offload_lookup(c, 0, keys, 16, 2, &hits, &err), 0) << err.message;
  EXPECT_EQ(hits, 2u);

  const int64_t dst[2] = {6, 5};
  ASSERT_EQ(kv_offload_load(c, 0, keys, 16, dst, 2, /*per_layer=*/1, &op, &err), 0) << err.message;
  for (int l = 0; l < 2; ++l) {
    ASSERT_EQ(kv_offload_wait_layer(op, l, &err), 0) << err.message;
    EXPECT_EQ(std::memcmp(Page(base, l, 6), Page(base, l, 1), 128), 0);
    EXPECT_EQ(std::memcmp(Page(base, l, 5), Page(base, l, 2), 128), 0);
  }
  EXPECT_EQ(kv_offload_wait_layer(op, 2, &err), 2);  // out of range: the load has 2 layers
  kv_offload_op_free(op);

  // A key of 4 bytes, an unknown key, NULL arguments: codes and messages, nothing thrown.
  op = reinterpret_cast<kv_offload_op*>(&err);  // must come back NULL on error
  EXPECT_EQ(kv_offload_store(c, 0, keys, 4, src, 1, nullptr, &op, nullptr, nullptr, 0, &err), 1);
  EXPECT_EQ(op, nullptr);
  EXPECT_NE(std::strstr(err.message, "key 0"), nullptr) << err.message;
  uint8_t unknown[8] = {9, 9, 9, 9, 9, 9, 9, 9};
  EXPECT_EQ(kv_offload_load(c, 0, unknown, 8, dst, 1, 0, &op, &err), 4);
  EXPECT_NE(std::strstr(err.message, "0909090909090909"), nullptr) << err.message;
  EXPECT_EQ(kv_offload_lookup(c, 0, nullptr, 8, 1, &hits, &err), 1);
  EXPECT_EQ(kv_offload_wait(nullptr, &err), 1);

  kv_connector_close(c);
  kv_daemon_stop(daemon);
}

}  // namespace
