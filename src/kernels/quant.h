// Fake quantization of activations and the packed cache-row formats (V41_SPEC.md §3.3-§3.5).
//
//   act_quant   fp8 e4m3 values, one e8m0 scale per 32 (before every quantized linear, and the
//               window KV cache)
//   fp4 "I"     e2m1 values, one e8m0 scale per 32 (indexer queries and keys)
//   fp4 "C"     e2m1 values, one e4m3 scale per 16 (compressed KV latents)
// Each has a packed form (codes + scales, as caches store them); fp4 "I" also a QDQ form (values
// replaced by their quantized value, in place), exact in bf16 and equal to dequant(quant(x)).
#pragma once

#include <cstdint>

namespace deepinfer {

// --- act_quant (fp8 e4m3, block 32, e8m0 scales); n % 32 == 0 ---
// codes[n] e4m3, scales[n/32] e8m0.
void act_quant(const float* x, int64_t n, uint8_t* codes, uint8_t* scales);
void act_quant_ref(const float* x, int64_t n, uint8_t* codes, uint8_t* scales);
void fp8_dequant(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out);
void fp8_dequant_ref(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out);

// --- fp4 variant I (e2m1, block 32, e8m0 scales); n % 32 == 0 ---
// packed[n/2] (low nibble = even element), scales[n/32].
void fp4i_quant(const float* x, int64_t n, uint8_t* packed, uint8_t* scales);
void fp4i_qdq(float* x, int64_t n);
void fp4i_qdq_ref(float* x, int64_t n);
void fp4i_dequant(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out);
void fp4i_dequant_ref(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out);

// --- fp4 variant C (e2m1, block 16, e4m3 scales); n % 16 == 0 ---
// packed[n/2], scales[n/16] e4m3.
void fp4c_quant(const float* x, int64_t n, uint8_t* packed, uint8_t* scales);
void fp4c_dequant(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out);
void fp4c_dequant_ref(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out);

// Rounds every element to bf16 (RNE), in place.
void round_bf16_inplace(float* x, int64_t n);
void round_bf16_inplace_ref(float* x, int64_t n);

}  // namespace deepinfer
