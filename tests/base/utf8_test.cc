#include "base/utf8.h"

#include <gtest/gtest.h>

#include <string>

namespace kv {
namespace {

TEST(Utf8, WellFormedTextIsValidAndUnchanged) {
  for (const std::string text : {"", "LBNHC", "L\xc2\xbc", "\xe2\x82\xac 5", "\xf0\x9f\x98\x80"}) {
    EXPECT_TRUE(IsValidUtf8(text)) << text;
    EXPECT_EQ(ToValidUtf8(text), text);
  }
}

TEST(Utf8, MalformedBytesAreRefusedAndEscaped) {
  // A lone lead byte (half of U+00BC, as an error text quoting one byte of an order did), a stray
  // continuation byte, an overlong '/', a UTF-16 surrogate, a code point past U+10FFFF, 0xff.
  const std::string cases[] = {"axis '\xc2'",      "\xbc", "\xc0\xaf", "\xed\xa0\x80",
                               "\xf4\x90\x80\x80", "\xff"};
  for (const std::string& text : cases) {
    EXPECT_FALSE(IsValidUtf8(text)) << text;
    const std::string fixed = ToValidUtf8(text);
    EXPECT_TRUE(IsValidUtf8(fixed)) << fixed;
    EXPECT_NE(fixed.find("\\x"), std::string::npos) << fixed;
  }
  EXPECT_EQ(ToValidUtf8("axis '\xc2'"), "axis '\\xc2'");
  EXPECT_EQ(ToValidUtf8("ok \xe2\x82\xac, bad \xe2\x82"), "ok \xe2\x82\xac, bad \\xe2\\x82");
}

}  // namespace
}  // namespace kv
