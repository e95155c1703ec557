#include "kernels/half.h"

#include <cmath>
#include <cstring>

namespace kv::kernels {
namespace {

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    // Subnormal (or zero): value is mantissa · 2^-24, exact in float.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  return BitsFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t FloatToHalf(float value) {
  const uint32_t u = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00u;
  if (magnitude >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (magnitude < 6.103515625e-05f) {
    // Subnormal half: round magnitude / 2^-24 to nearest even integer.
    const float scaled = magnitude * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // Normal: drop 13 mantissa bits with round-to-nearest-even on the float's bit pattern.
  uint32_t mag_bits = u & 0x7fffffffu;
  const uint32_t lsb = (mag_bits >> 13) & 1u;
  mag_bits += 0xfffu + lsb;
  return sign | static_cast<uint16_t>((mag_bits >> 13) - (112u << 10));
}

float Bfloat16ToFloat(uint16_t bits) {
  return BitsFloat(static_cast<uint32_t>(bits) << 16);
}

uint16_t FloatToBfloat16(float value) {
  const uint32_t u = FloatBits(value);
  if (std::isnan(value)) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t lsb = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + lsb) >> 16);
}

float LoadElement(const void* p, DType dtype) {
  uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return dtype == DType::kBFloat16 ? Bfloat16ToFloat(bits) : HalfToFloat(bits);
}

void StoreElement(void* p, DType dtype, float value) {
  const uint16_t bits = dtype == DType::kBFloat16 ? FloatToBfloat16(value) : FloatToHalf(value);
  std::memcpy(p, &bits, sizeof bits);
}

}  // namespace kv::kernels
