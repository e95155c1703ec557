// The deterministic K/V (and queries) of the P/D simulator: what every element of (request,
// layer, global head, token) holds, whatever the layout, TP split or memory it lives in. The
// host engines (pd_sim.cc) and the CUDA engines (pd_gpu.cu) both write and check through these
// functions, so one definition says what "every byte verified" compares against.
//
// Pure functions of their arguments; usable on the host and in CUDA kernels.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/strided_kv.h"  // KV_HOST_DEVICE

namespace kv::connector::pattern {

KV_HOST_DEVICE inline uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A request's seed: FNV-1a of its id.
inline uint64_t Seed(const std::string& id) {
  uint64_t h = 1469598103934665603ull;
  for (char c : id) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// The hash of row (layer, global head, token). One hash per row keeps writing and verifying
// cheap next to the transfer being measured; rows differ in every element.
KV_HOST_DEVICE inline uint64_t Row(uint64_t seed, int64_t layer, int64_t head, int64_t token) {
  return Mix(seed ^ Mix((static_cast<uint64_t>(layer) << 44) ^ (static_cast<uint64_t>(head) << 28) ^
                        static_cast<uint64_t>(token)));
}

// Element d of K (kv = 0) or V (kv = 1) of a row: any 16-bit pattern (the host engines, which
// only compare bytes).
KV_HOST_DEVICE inline uint16_t Element(uint64_t row, int64_t d, int kv) {
  return static_cast<uint16_t>((row >> (kv * 16)) + static_cast<uint64_t>(d) * 0x9e37u + kv);
}

// `bits` made a finite bf16 of magnitude in [1/8, 2): sign and 7 mantissa bits from `bits`, the
// exponent one of four. Attention over such values is well conditioned, so the decode attention
// of two caches holding the same bytes can be compared (the CUDA engines).
KV_HOST_DEVICE inline uint16_t FiniteBf16(uint16_t bits) {
  return static_cast<uint16_t>((bits & 0x807fu) | ((0x7cu + ((bits >> 7) & 3u)) << 7));
}

// Element d of the decode query of (request, layer, global query head), a finite bf16.
KV_HOST_DEVICE inline uint16_t QueryElement(uint64_t seed, int64_t layer, int64_t q_head,
                                            int64_t d) {
  const uint64_t row = Mix(
      seed ^ 0x51ull ^ Mix((static_cast<uint64_t>(layer) << 40) ^ static_cast<uint64_t>(q_head)));
  return FiniteBf16(Element(row, d, 0));
}

}  // namespace kv::connector::pattern
