#include "kernel_test_util.h"

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/thread_pool.h"

namespace deepinfer::testing {

OwnedWeight make_weight(WeightFormat f, int64_t rows, int64_t cols, uint64_t seed,
                        bool quant_input) {
  std::mt19937_64 rng(seed);
  OwnedWeight o;
  Weight& w = o.w;
  w.name = "test.weight";
  w.quant_input = quant_input;
  w.format = f;
  w.shape = Shape{rows, cols};
  std::normal_distribution<float> nd(0.0f, 1.0f);
  switch (f) {
    case WeightFormat::F32: {
      o.data.resize(size_t(rows * cols * 4));
      float* p = reinterpret_cast<float*>(o.data.data());
      for (int64_t i = 0; i < rows * cols; ++i) p[i] = nd(rng) * 0.05f;
      break;
    }
    case WeightFormat::BF16: {
      o.data.resize(size_t(rows * cols * 2));
      uint16_t* p = reinterpret_cast<uint16_t*>(o.data.data());
      for (int64_t i = 0; i < rows * cols; ++i) p[i] = f32_to_bf16(nd(rng) * 0.05f);
      break;
    }
    case WeightFormat::Fp8Block:
    case WeightFormat::Fp8Row: {
      o.data.resize(size_t(rows * cols));
      for (auto& b : o.data) {
        b = uint8_t(rng());
        if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
      }
      const bool block = f == WeightFormat::Fp8Block;
      w.scale_cols = block ? (cols + 31) / 32 : cols / 32;
      o.scale.resize(size_t((block ? (rows + 31) / 32 : rows) * w.scale_cols));
      for (auto& s : o.scale) s = uint8_t(112 + rng() % 12);
      break;
    }
    case WeightFormat::Fp4Row: {
      o.data.resize(size_t(rows * cols / 2));
      for (auto& b : o.data) b = uint8_t(rng());
      w.scale_cols = cols / 32;
      o.scale.resize(size_t(rows * w.scale_cols));
      for (auto& s : o.scale) s = uint8_t(116 + rng() % 10);
      break;
    }
  }
  w.data = o.data.data();
  w.scale = o.scale.empty() ? nullptr : o.scale.data();
  return o;
}

std::vector<float> make_activations(int64_t n, int64_t cols, int64_t ld, uint64_t seed,
                                    bool bf16_values) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(n * ld), 1e30f);  // padding columns must not be read
  for (int64_t i = 0; i < n; ++i)
    for (int64_t b = 0; b < cols; b += 32) {
      const int kind = int(rng() % 16);
      const float mag = std::ldexp(1.0f, int(rng() % 40) - 20);
      for (int64_t k = b; k < std::min(cols, b + 32); ++k) {
        float v = nd(rng) * mag;
        if (kind == 0) v = 0.0f;                              // an all-zero block
        if (kind == 1 && k % 3 == 0) v = 0.0f;                // scattered zeros
        if (kind == 2) v = mag * float(int(rng() % 9) - 4);   // ties in the block maximum
        if (kind == 3) v = std::ldexp(v, -110);               // below the act_quant floor
        if (kind == 4 && k == b + 5) v = std::ldexp(v, -12);  // too fine for 16-bit integers
        x[size_t(i * ld + k)] = bf16_values ? round_bf16(v) : v;
      }
    }
  return x;
}

std::vector<Isa> machine_isas() {
  std::vector<Isa> v;
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (int(i) <= int(cpu_best_isa())) v.push_back(i);
  return v;
}

std::vector<LinearProducts> machine_products() {
  if (cpu_best_isa() != Isa::Avx512) return {LinearProducts::Auto};
  std::vector<LinearProducts> v = {LinearProducts::Bf16Dot, LinearProducts::Fp32Fma};
  if (int16_speedup() > 0) v.push_back(LinearProducts::Int16Dot);
  if (amx_available()) v.push_back(LinearProducts::Amx);
  return v;
}

bool bit_equal(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, size_t(n) * 4) == 0;
}

int64_t first_diff(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::memcmp(a + i, b + i, 4) != 0) return i;
  return -1;
}

KernelEnvGuard::KernelEnvGuard()
    : isa_(cpu_isa()),
      path_(linear_path()),
      products_(linear_products()),
      threads_(ThreadPool::global().size()) {}

KernelEnvGuard::~KernelEnvGuard() {
  set_cpu_isa(isa_);
  set_linear_path(path_);
  set_linear_products(products_);
  if (ThreadPool::global().size() != threads_) ThreadPool::set_global_threads(threads_);
}

}  // namespace deepinfer::testing
