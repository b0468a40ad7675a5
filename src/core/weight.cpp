#include "core/weight.h"

namespace deepinfer {

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32:
      return "f32";
    case WeightFormat::BF16:
      return "bf16";
    case WeightFormat::Fp8Block:
      return "fp8 (e4m3, 32x32 e8m0 scales)";
    case WeightFormat::Fp4Row:
      return "fp4 (e2m1, per-32 e8m0 scales)";
    case WeightFormat::Fp8Row:
      return "fp8 (e4m3, per-32 e8m0 row scales)";
  }
  return "?";
}

uint64_t Weight::value_bytes() const {
  if (!data) return 0;
  const uint64_t n = uint64_t(shape.numel());
  switch (format) {
    case WeightFormat::F32:
      return 4 * n;
    case WeightFormat::BF16:
      return 2 * n;
    case WeightFormat::Fp4Row:
      return n / 2;
    case WeightFormat::Fp8Block:
    case WeightFormat::Fp8Row:
      return n;
  }
  return 0;
}

uint64_t Weight::nbytes() const {
  if (!data) return 0;
  const uint64_t n = uint64_t(shape.numel());
  switch (format) {
    case WeightFormat::Fp8Block:
      return n + uint64_t((rows() + 31) / 32) * uint64_t((cols() + 31) / 32);
    case WeightFormat::Fp4Row:
    case WeightFormat::Fp8Row:
      return value_bytes() + n / 32;
    default:
      return value_bytes();
  }
}

}  // namespace deepinfer
