// Internal to the activation/cache conversions of kernels/quant.h: their AVX-512 versions
// (quant_avx512.cpp), exact twins of the scalar code in quant.cpp.
#pragma once

#include <cstdint>

namespace deepinfer::quant_isa {

void round_bf16_avx512(float* x, int64_t n);
void fp8_dequant_avx512(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out);
void fp4i_dequant_avx512(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out);
void fp4c_dequant_avx512(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out);

}  // namespace deepinfer::quant_isa
