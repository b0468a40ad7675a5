#include "core/weight.h"

namespace deepinfer {

uint64_t Weight::value_bytes() const {
  if (!data) return 0;
  const uint64_t n = uint64_t(shape.numel());
  if (format == WeightFormat::F32) return 4 * n;
  if (format == WeightFormat::BF16) return 2 * n;
  return format == WeightFormat::Fp4Row ? n / 2 : n;
}

uint64_t Weight::nbytes() const {
  if (!data) return 0;
  const uint64_t n = uint64_t(shape.numel());
  if (format == WeightFormat::Fp8Block)
    return n + uint64_t((rows() + 31) / 32) * uint64_t((cols() + 31) / 32);
  if (format == WeightFormat::Fp4Row || format == WeightFormat::Fp8Row)
    return value_bytes() + n / 32;
  return value_bytes();
}

}  // namespace deepinfer
