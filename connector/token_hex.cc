#include "connector/token_hex.h"

#include <cstring>

namespace kv::connector {

std::string TokenToHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    hex.push_back(kDigits[c >> 4]);
    hex.push_back(kDigits[c & 0xf]);
  }
  return hex;
}

Result<std::string> TokenFromHex(const char* hex, size_t max_chars) {
  const size_t n = strnlen(hex, max_chars + 1);
  if (n > max_chars || n % 2 != 0) {
    return Status::InvalidArgument("transfer_token is not an even number of hex digits, at most " +
                                   std::to_string(max_chars));
  }
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < n; i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return Status::InvalidArgument("transfer_token holds a non-hex digit");
    out.push_back(static_cast<char>(hi << 4 | lo));
  }
  return out;
}

}  // namespace kv::connector
