// Synthetic inputs for the kernel tests: weights in every checkpoint format with valid codes,
// activations with block-to-block magnitude changes, and a guard that restores the ISA, the
// linear path and the thread count a test changed.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "core/weight.h"
#include "kernels/linear.h"

namespace deepinfer::testing {

// A weight with owned storage. Codes avoid the e4m3 NaN patterns; scales are e8m0 in a
// realistic range.
struct OwnedWeight {
  std::vector<uint8_t> data, scale;
  Weight w;
};
// `quant_input`: Weight::quant_input (a QLin weight).
OwnedWeight make_weight(WeightFormat f, int64_t rows, int64_t cols, uint64_t seed,
                        bool quant_input = false);

// n rows of `cols` activations (row stride ld >= cols): normal values whose magnitude varies per
// 32-block over many octaves, with zeros, exact ties, the odd all-zero block and blocks with one
// value far below the others (no 16-bit integer form: LinearProducts::Int16Dot's fallback).
std::vector<float> make_activations(int64_t n, int64_t cols, int64_t ld, uint64_t seed,
                                    bool bf16_values);

// The ISAs this machine runs, scalar first.
std::vector<Isa> machine_isas();
// Every way of multiplying exact products (vdpbf16ps, FMAs, vpdpwssd) the CPU has.
std::vector<LinearProducts> machine_products();

bool bit_equal(const float* a, const float* b, int64_t n);
// Index of the first differing element, or -1.
int64_t first_diff(const float* a, const float* b, int64_t n);

class KernelEnvGuard {
 public:
  KernelEnvGuard();
  ~KernelEnvGuard();

 private:
  Isa isa_;
  LinearPath path_;
  LinearProducts products_;
  int threads_;
};

}  // namespace deepinfer::testing
