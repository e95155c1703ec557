#include "base/hmac.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace kv::crypto {

std::string HmacSha256(std::string_view key, std::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac,
           &length) == nullptr) {
    return std::string();
  }
  return std::string(reinterpret_cast<const char*>(mac), length);
}

// getrandom(2), the kernel's CSPRNG, rather than OpenSSL's RAND_bytes: the same strength, and
// a token minted on the start-up path of a transfer (the decode kvd's first Want of a wave, after
// the io thread slept) costs about a third of RAND_bytes there, whose DRBG code and state
// are cold by then (benchmarks/pd.md, "start-up hops").
Result<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  for (size_t got = 0; got < n;) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::Internal("getrandom could not produce " + std::to_string(n) +
                              " bytes: " + std::strerror(errno));
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() && !a.empty() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void AppendField(std::string* out, std::string_view field) {
  const uint32_t n = static_cast<uint32_t>(field.size());
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out->append(field);
}

}  // namespace kv::crypto
