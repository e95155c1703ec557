// Peer authentication: the challenge-response every peer connection starts with when kvd has a
// shared secret (DaemonOptions::auth_secret, `kvd --auth-secret-file`), and the secret's checks.
//
// Both sides send a PeerChallenge (protocol version, node name, a fresh 32-byte nonce) at once.
// On the other's challenge each answers with a PeerProof: HMAC-SHA256 under the secret over a
// domain label, the version, its role on the connection (dialer or acceptor), both node names
// and both nonces, each length-prefixed. The role and the refusal of a peer named like us keep a
// proof from being reflected back on a second connection; the nonces keep it from being
// replayed; the names bind the node name the peer later uses to the proof. Nothing else (hello,
// layouts, transport addresses) is sent or accepted before the other side's proof checked out,
// and every frame after the proofs is sealed (encrypted and authenticated, DeriveSessionKeys):
// the challenges and proofs are the only plaintext on the peer port. The version in the
// challenge (proto::PEER_PROTOCOL; sealed frames since 3) must match
// exactly, so a kvd of another version is refused with the two versions named.
// The primitives (HMAC-SHA256, random bytes, constant-time compare) are base/hmac.h's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kv::daemon::auth {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // SHA-256
inline constexpr size_t kMinSecretBytes = 32;
inline constexpr size_t kMaxSecretBytes = 4096;
inline constexpr size_t kTransferTokenBytes = 16;  // 128-bit capabilities (transfers.cc)
// An engine may choose a request's token itself (RequestFinished.transfer_token): 16 to 32 bytes.
inline constexpr size_t kMaxTransferTokenBytes = 32;

// `n` bytes from the kernel's CSPRNG (crypto::RandomBytes, getrandom(2)); kInternal when it
// cannot deliver (never silently weak).
Result<std::string> RandomBytes(size_t n);

// What the peer that `prover_dialed` (or accepted) the connection proves.
std::string Proof(std::string_view secret, uint32_t version, bool prover_dialed,
                  std::string_view prover_name, std::string_view verifier_name,
                  std::string_view prover_nonce, std::string_view verifier_nonce);

// The keys that seal every later frame of an authenticated connection, one per direction
// (Connection::EnableSealing: AES-256-GCM, 32 bytes each): HMAC-SHA256 under the secret over a
// label of their own ("kvd peer seal v1"), the direction, both names and both nonces, so each
// connection and direction has fresh keys, and a connection relayed between two kvds stays a pipe
// the relay can neither read, write into, replay nor reorder.
struct SessionKeys {
  std::string send;
  std::string receive;
};
SessionKeys DeriveSessionKeys(std::string_view secret, bool we_dialed, std::string_view our_name,
                              std::string_view their_name, std::string_view our_nonce,
                              std::string_view their_nonce);

// Constant-time equality of two byte strings (their lengths are not secret).
bool Equal(std::string_view a, std::string_view b);

// A secret's size bounds.
Status CheckSecret(std::string_view secret);

// Reads a secret file: a regular file owned by no one else's access (no group or other
// permission bits: mode 0600 or 0400), 32 to 4096 bytes, used byte for byte (a trailing newline
// included: both sides read the same file). Errors name the path and what to do.
Result<std::string> ReadSecretFile(const std::string& path);

}  // namespace kv::daemon::auth
