#include "base/framing.h"

#include <gtest/gtest.h>

#include <string>

namespace kv {
namespace {

TEST(Framing, RoundTripsFramesSplitAtEveryByte) {
  std::string stream;
  ASSERT_TRUE(AppendFrame("hello", &stream).ok());
  ASSERT_TRUE(AppendFrame("", &stream).ok());
  ASSERT_TRUE(AppendFrame(std::string(1000, 'x'), &stream).ok());
  FrameDecoder decoder;
  std::vector<std::string> frames;
  for (char c : stream) {
    decoder.Append(&c, 1);
    for (;;) {
      auto next = decoder.Next();
      ASSERT_TRUE(next.ok());
      if (!next->has_value()) break;
      frames.push_back(**next);
    }
  }
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0], "hello");
  EXPECT_EQ(frames[1], "");
  EXPECT_EQ(frames[2], std::string(1000, 'x'));
  EXPECT_EQ(decoder.pending_bytes(), 0u);
}

TEST(Framing, RejectsAnOversizedLengthBeforeBufferingItsBody) {
  FrameDecoder decoder(1024);
  const char header[4] = {0, 0, 0, static_cast<char>(0x80)};  // 2 GiB announced
  decoder.Append(header, sizeof(header));
  auto next = decoder.Next();
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().code(), Code::kInvalidArgument);
  EXPECT_NE(next.status().message().find("1024"), std::string::npos);
}

TEST(Framing, HalfAMessageIsPendingNotDelivered) {
  std::string stream;
  ASSERT_TRUE(AppendFrame("0123456789", &stream).ok());
  FrameDecoder decoder;
  decoder.Append(stream.data(), 7);
  auto next = decoder.Next();
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->has_value());
  EXPECT_EQ(decoder.pending_bytes(), 7u);
}

TEST(Framing, SenderRefusesBodiesAboveTheLimit) {
  std::string out;
  Status s = AppendFrame(std::string(2048, 'y'), &out, 1024);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace kv
