// A weight matrix or vector as kernels read it: its storage format, logical shape and the
// mapped (or owned) bytes. Checkpoints produce these; kernels consume them. Non-owning.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace deepinfer {

enum class WeightFormat : uint8_t {
  F32,       // float32
  BF16,      // bfloat16
  Fp8Block,  // e4m3 [rows, cols] + e8m0 scale [ceil(rows/32), ceil(cols/32)] (dense linears)
  Fp4Row,    // e2m1 packed [rows, cols/2] + e8m0 scale [rows, cols/32] (routed experts)
  Fp8Row,    // e4m3 [rows, cols] + e8m0 scale [rows, cols/32] (Engram tables)
};

// One weight as the kernels read it. 2-D weights are [rows = out, cols = in].
struct Weight {
  std::string name;
  WeightFormat format = WeightFormat::F32;
  Shape shape;                     // logical shape (fp4: logical elements)
  const void* data = nullptr;      // f32 / bf16 (uint16) / e4m3 / packed e2m1 bytes
  const uint8_t* scale = nullptr;  // e8m0 scales for the quantized formats
  int64_t scale_cols = 0;          // row length of the scale grid
  // The input of this linear is act-quantized (V41_SPEC.md §3.4) before the product: true for
  // fp8/fp4 weights in slots the reference computes as quantized linears, false for weights it
  // computes on plain values (its `linear()` dispatches on the stored dtype the same way).
  bool quant_input = false;

  bool present() const { return data != nullptr; }
  int64_t rows() const { return shape[0]; }
  int64_t cols() const { return shape.ndim > 1 ? shape[1] : 1; }
  // Data bytes only (codes or values, without scales).
  uint64_t value_bytes() const {
    if (!data) return 0;
    const uint64_t n = uint64_t(shape.numel());
    if (format == WeightFormat::F32) return 4 * n;
    if (format == WeightFormat::BF16) return 2 * n;
    return format == WeightFormat::Fp4Row ? n / 2 : n;
  }
  // Data and scale bytes.
  uint64_t nbytes() const {
    if (!data) return 0;
    const uint64_t n = uint64_t(shape.numel());
    if (format == WeightFormat::Fp8Block)
      return n + uint64_t((rows() + 31) / 32) * uint64_t((cols() + 31) / 32);
    if (format == WeightFormat::Fp4Row || format == WeightFormat::Fp8Row)
      return value_bytes() + n / 32;
    return value_bytes();
  }
  const uint16_t* bf16() const { return static_cast<const uint16_t*>(data); }
  const float* f32() const { return static_cast<const float*>(data); }
  const uint8_t* u8() const { return static_cast<const uint8_t*>(data); }
};

}  // namespace deepinfer
