// The cryptographic primitives of kvd's authentication: HMAC-SHA256 and constant-time
// comparison over OpenSSL's libcrypto, random bytes from the kernel's CSPRNG. Pure functions,
// thread-safe, no I/O but getrandom(2). Callers build their messages with AppendField so that no
// two field lists encode alike.
// Users: the peer port's challenge-response (daemon/peer_auth.h) and the transports' TCP side
// channels (transport/channel_auth.h).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kv::crypto {

inline constexpr size_t kSha256Bytes = 32;

// HMAC-SHA256 of `message` under `key`: kSha256Bytes bytes, or empty when libcrypto fails (an
// empty MAC equals nothing under ConstantTimeEqual, so a failure never authenticates).
std::string HmacSha256(std::string_view key, std::string_view message);

// `n` bytes from the kernel's CSPRNG (getrandom(2)); kInternal when it cannot deliver (never
// silently weak).
Result<std::string> RandomBytes(size_t n);

// Equality of two byte strings in time independent of their contents (their lengths are not
// secret). False when either is empty.
bool ConstantTimeEqual(std::string_view a, std::string_view b);

// Appends `field` to `out` with its length first (u32, little-endian).
void AppendField(std::string* out, std::string_view field);

}  // namespace kv::crypto
