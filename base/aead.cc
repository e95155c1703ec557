#include "base/aead.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <climits>
#include <utility>

namespace kv::crypto {
namespace {

constexpr size_t kNonceBytes = 12;

void Nonce(uint64_t number, unsigned char out[kNonceBytes]) {
  for (size_t i = 0; i < 4; ++i) out[i] = 0;
  for (size_t i = 0; i < 8; ++i) out[4 + i] = static_cast<unsigned char>(number >> (8 * i));
}

const unsigned char* Bytes(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

}  // namespace

struct Aead::Context {
  EVP_CIPHER_CTX* ctx = nullptr;
  ~Context() { EVP_CIPHER_CTX_free(ctx); }
};

Aead::Aead(std::unique_ptr<Context> context) : context_(std::move(context)) {}
Aead::~Aead() = default;
Aead::Aead(Aead&&) noexcept = default;
Aead& Aead::operator=(Aead&&) noexcept = default;

Result<Aead> Aead::Create(std::string_view key) {
  if (key.size() != kAeadKeyBytes) {
    return Status::InvalidArgument("an AES-256-GCM key has " + std::to_string(kAeadKeyBytes) +
                                   " bytes, not " + std::to_string(key.size()));
  }
  auto context = std::make_unique<Context>();
  context->ctx = EVP_CIPHER_CTX_new();
  // The key is set once; each message then sets only its nonce. The IV length is the default
  // (12 bytes) of EVP_aes_256_gcm.
  if (context->ctx == nullptr ||
      EVP_CipherInit_ex(context->ctx, EVP_aes_256_gcm(), nullptr, Bytes(key), nullptr, 1) != 1) {
    return Status::Internal("libcrypto could not set up AES-256-GCM");
  }
  return Aead(std::move(context));
}

Status Aead::Seal(uint64_t number, std::string_view associated, std::string_view plaintext,
                  std::string* out) {
  if (plaintext.size() > INT_MAX || associated.size() > INT_MAX) {
    return Status::InvalidArgument("AEAD message above 2 GiB");
  }
  EVP_CIPHER_CTX* ctx = context_->ctx;
  unsigned char nonce[kNonceBytes];
  Nonce(number, nonce);
  int n = 0;
  if (EVP_CipherInit_ex(ctx, nullptr, nullptr, nullptr, nonce, 1) != 1 ||
      (!associated.empty() && EVP_EncryptUpdate(ctx, nullptr, &n, Bytes(associated),
                                                static_cast<int>(associated.size())) != 1)) {
    return Status::Internal("AES-256-GCM: could not start a message");
  }
  const size_t start = out->size();
  out->resize(start + plaintext.size() + kAeadTagBytes);
  auto* cipher = reinterpret_cast<unsigned char*>(out->data() + start);
  int written = 0;
  if (!plaintext.empty() && EVP_EncryptUpdate(ctx, cipher, &written, Bytes(plaintext),
                                              static_cast<int>(plaintext.size())) != 1) {
    return Status::Internal("AES-256-GCM: encryption failed");
  }
  int last = 0;
  if (EVP_EncryptFinal_ex(ctx, cipher + written, &last) != 1 ||
      static_cast<size_t>(written + last) != plaintext.size() ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kAeadTagBytes),
                          cipher + plaintext.size()) != 1) {
    return Status::Internal("AES-256-GCM: could not finish a message");
  }
  return Status::Ok();
}

Result<std::string> Aead::Open(uint64_t number, std::string_view associated,
                               std::string_view sealed) {
  if (sealed.size() < kAeadTagBytes) {
    return Status::InvalidArgument("sealed message of " + std::to_string(sealed.size()) +
                                   " bytes, shorter than its tag");
  }
  if (sealed.size() > INT_MAX || associated.size() > INT_MAX) {
    return Status::InvalidArgument("AEAD message above 2 GiB");
  }
  const std::string_view cipher = sealed.substr(0, sealed.size() - kAeadTagBytes);
  std::string tag(sealed.substr(cipher.size()));
  EVP_CIPHER_CTX* ctx = context_->ctx;
  unsigned char nonce[kNonceBytes];
  Nonce(number, nonce);
  int n = 0;
  if (EVP_CipherInit_ex(ctx, nullptr, nullptr, nullptr, nonce, 0) != 1 ||
      (!associated.empty() && EVP_DecryptUpdate(ctx, nullptr, &n, Bytes(associated),
                                                static_cast<int>(associated.size())) != 1)) {
    return Status::Internal("AES-256-GCM: could not start a message");
  }
  std::string plain(cipher.size(), '\0');
  auto* p = reinterpret_cast<unsigned char*>(plain.data());
  int written = 0;
  if (!cipher.empty() &&
      EVP_DecryptUpdate(ctx, p, &written, Bytes(cipher), static_cast<int>(cipher.size())) != 1) {
    return Status::Internal("AES-256-GCM: decryption failed");
  }
  int last = 0;
  if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kAeadTagBytes), tag.data()) !=
      1) {
    return Status::Internal("AES-256-GCM: could not set the tag");
  }
  // The tag is checked here (in constant time, by libcrypto): on a mismatch nothing decrypted
  // leaves this function.
  if (EVP_DecryptFinal_ex(ctx, p + written, &last) != 1 ||
      static_cast<size_t>(written + last) != cipher.size()) {
    OPENSSL_cleanse(plain.data(), plain.size());
    return Status::InvalidArgument(
        "sealed message does not open (altered, or sealed under another "
        "key, number or associated data)");
  }
  return plain;
}

}  // namespace kv::crypto
