// Authenticated encryption for kvd's sealed channels: AES-256-GCM over OpenSSL's libcrypto (EVP),
// with a 96-bit nonce made of 4 zero bytes and a 64-bit message number (little-endian). Sealing
// encrypts a message and authenticates it together with associated data that travels in the
// clear; opening returns the message only if neither was altered and both sides used the same key
// and number. Under one key a number must never be used twice (GCM's confidentiality and
// integrity both fail on a reused nonce): callers give every direction of a channel a key of its
// own and count its messages (frame_seal.h does). Users: the peer port (daemon/connection.h) and
// the transports' TCP side channels (transport/channel_auth.h), through frame_seal.h.
//
// Aead owns one cipher context; not thread-safe (one per direction of one channel), movable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kv::crypto {

inline constexpr size_t kAeadKeyBytes = 32;  // AES-256
inline constexpr size_t kAeadTagBytes = 16;

class Aead {
 public:
  // A context keyed with `key`: kInvalidArgument unless it has kAeadKeyBytes bytes; kInternal
  // when libcrypto cannot set it up.
  static Result<Aead> Create(std::string_view key);
  ~Aead();
  Aead(Aead&&) noexcept;
  Aead& operator=(Aead&&) noexcept;

  // Appends the ciphertext of `plaintext` (as long as it) and then its kAeadTagBytes-byte tag to
  // `out`, authenticating `associated` with it. kInternal when libcrypto fails (`out` may then
  // hold a partial message: discard it).
  Status Seal(uint64_t number, std::string_view associated, std::string_view plaintext,
              std::string* out);
  // The plaintext of `sealed` (ciphertext, then the tag). kInvalidArgument when it is shorter
  // than a tag or does not open: altered, sealed under another key, number or associated data.
  // Nothing of a message that does not open is returned.
  Result<std::string> Open(uint64_t number, std::string_view associated, std::string_view sealed);

 private:
  struct Context;
  explicit Aead(std::unique_ptr<Context> context);
  std::unique_ptr<Context> context_;
};

}  // namespace kv::crypto
