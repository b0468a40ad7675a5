// What the CPU can run. Kernels pick their code path from `cpu_isa()` once; the environment
// variable DEEPINFER_ISA=scalar|avx2|avx512 lowers the choice (tests run every path that the
// machine supports).
#pragma once

#include <cstdint>

namespace deepinfer {

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };

// The best ISA this machine supports (AVX-512 means F, BW, VL, DQ and BF16).
Isa cpu_best_isa();
// The ISA kernels should use: the best one, capped by DEEPINFER_ISA or set_cpu_isa().
Isa cpu_isa();
// Caps the ISA (clamped to what the machine supports). Returns the ISA now in effect.
Isa set_cpu_isa(Isa isa);
const char* isa_name(Isa isa);

// Resident memory of this process in bytes (/proc/self/statm); 0 when unavailable.
int64_t resident_memory_bytes();

}  // namespace deepinfer
