#include "daemon/peer_auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/hmac.h"

namespace kv::daemon::auth {

using crypto::AppendField;
using crypto::HmacSha256;

Result<std::string> RandomBytes(size_t n) {
  return crypto::RandomBytes(n);
}

std::string Proof(std::string_view secret, uint32_t version, bool prover_dialed,
                  std::string_view prover_name, std::string_view verifier_name,
                  std::string_view prover_nonce, std::string_view verifier_nonce) {
  std::string message;
  AppendField(&message, "kvd peer auth v1");
  AppendField(&message, std::to_string(version));
  AppendField(&message, prover_dialed ? "dialer" : "acceptor");
  AppendField(&message, prover_name);
  AppendField(&message, verifier_name);
  AppendField(&message, prover_nonce);
  AppendField(&message, verifier_nonce);
  return HmacSha256(secret, message);  // empty on failure: matches no proof
}

SessionKeys DeriveSessionKeys(std::string_view secret, bool we_dialed, std::string_view our_name,
                              std::string_view their_name, std::string_view our_nonce,
                              std::string_view their_nonce) {
  // Written from the dialer's side, so that both ends derive the same two keys.
  const std::string_view dialer = we_dialed ? our_name : their_name;
  const std::string_view acceptor = we_dialed ? their_name : our_name;
  const std::string_view dialer_nonce = we_dialed ? our_nonce : their_nonce;
  const std::string_view acceptor_nonce = we_dialed ? their_nonce : our_nonce;
  auto key = [&](std::string_view direction) {
    std::string message;
    AppendField(&message, "kvd peer seal v1");
    AppendField(&message, direction);
    AppendField(&message, dialer);
    AppendField(&message, acceptor);
    AppendField(&message, dialer_nonce);
    AppendField(&message, acceptor_nonce);
    return HmacSha256(secret, message);
  };
  std::string from_dialer = key("dialer to acceptor");
  std::string from_acceptor = key("acceptor to dialer");
  if (we_dialed) return {std::move(from_dialer), std::move(from_acceptor)};
  return {std::move(from_acceptor), std::move(from_dialer)};
}

bool Equal(std::string_view a, std::string_view b) {
  return crypto::ConstantTimeEqual(a, b);
}

Status CheckSecret(std::string_view secret) {
  if (secret.size() < kMinSecretBytes || secret.size() > kMaxSecretBytes) {
    return Status::InvalidArgument(
        "the peer secret has " + std::to_string(secret.size()) + " bytes; it needs " +
        std::to_string(kMinSecretBytes) + " to " + std::to_string(kMaxSecretBytes) +
        " (e.g. `head -c 32 /dev/urandom > kvd.secret; chmod 600 kvd.secret`)");
  }
  return Status::Ok();
}

Result<std::string> ReadSecretFile(const std::string& path) {
  const std::string where = "--auth-secret-file '" + path + "': ";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return Status::IoError(where + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::IoError(where + "fstat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(where + "not a regular file");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Status::InvalidArgument(where + "mode " + mode +
                                   " lets others read it; it must be 0600 (chmod 600 '" + path +
                                   "')");
  }
  if (st.st_size > static_cast<off_t>(kMaxSecretBytes)) {
    return Status::InvalidArgument(where + std::to_string(st.st_size) + " bytes, above the " +
                                   std::to_string(kMaxSecretBytes) + "-byte limit");
  }
  std::string secret;
  char buf[1024];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::IoError(where + "read: " + std::strerror(errno));
    if (n == 0) break;
    secret.append(buf, static_cast<size_t>(n));
    if (secret.size() > kMaxSecretBytes) break;
  }
  Status s = CheckSecret(secret);
  if (!s.ok()) return s.WithContext(where.substr(0, where.size() - 2));
  return secret;
}

}  // namespace kv::daemon::auth
