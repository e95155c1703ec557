// Little-endian packing of the opaque blobs transports hand to peers (addresses, descriptors).
//
// Blobs come from outside the process, so ByteReader never reads past its input: every getter
// reports failure instead, and callers turn that into kInvalidArgument before any value is used.
// Not thread-safe; cheap value types.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace kv {

class ByteWriter {
 public:
  ByteWriter& u32(uint32_t v) { return raw(&v, sizeof v); }
  ByteWriter& u64(uint64_t v) { return raw(&v, sizeof v); }
  ByteWriter& bytes(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    return raw(s.data(), s.size());
  }
  // n bytes as they lie in memory, in one append: for arrays of structs of fixed-width integers
  // without padding, which are then little-endian like every other field.
  ByteWriter& raw(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string take() { return std::move(out_); }

 private:
  static_assert(std::endian::native == std::endian::little, "blobs are little-endian");
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view in) : in_(in) {}
  bool u32(uint32_t* v) { return raw(v, sizeof *v); }
  bool u64(uint64_t* v) { return raw(v, sizeof *v); }
  // A length-prefixed byte string; the view aliases the input.
  bool bytes(std::string_view* s) {
    uint32_t n = 0;
    if (!u32(&n) || n > in_.size()) return false;
    *s = in_.substr(0, n);
    in_.remove_prefix(n);
    return true;
  }
  bool at_end() const { return in_.empty(); }
  size_t remaining() const { return in_.size(); }
  // The next n bytes into p, as ByteWriter::raw wrote them. n == 0 touches nothing, so p may be
  // the null data() of an empty vector (memcpy's arguments must not be null even then: found by
  // fuzz_nccl_wire, a get request of no ranges).
  bool raw(void* p, size_t n) {
    if (in_.size() < n) return false;
    if (n == 0) return true;
    std::memcpy(p, in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }

 private:
  std::string_view in_;
};

}  // namespace kv
