// IEEE fp16 and bfloat16 on the host, for the CPU references and for tests.
//
// Conversions to the narrow types round to nearest, ties to even, as the CUDA intrinsics
// __float2half_rn and __float2bfloat16_rn do, so CPU and GPU agree bit for bit on stores.
#pragma once

#include <cstdint>

#include "kernels/strided_kv.h"

namespace kv::kernels {

float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);
float Bfloat16ToFloat(uint16_t bits);
uint16_t FloatToBfloat16(float value);

// The element at `p` (two bytes, any alignment) as a float, and back.
float LoadElement(const void* p, DType dtype);
void StoreElement(void* p, DType dtype, float value);

}  // namespace kv::kernels
