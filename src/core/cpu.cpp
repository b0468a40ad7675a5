#include "core/cpu.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace deepinfer {

namespace {
// The ISA in effect: the best one, capped by DEEPINFER_ISA when it is read on first use.
std::atomic<Isa>& current_isa() {
  static std::atomic<Isa> isa{[] {
    const Isa best = cpu_best_isa();
    const char* s = std::getenv("DEEPINFER_ISA");
    if (!s || !*s) return best;
    for (Isa want : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
      if (!std::strcmp(s, isa_name(want))) return std::min(want, best);
    throw Error(str_cat("DEEPINFER_ISA=", s, ": expected scalar, avx2 or avx512"));
  }()};
  return isa;
}
}  // namespace

Isa cpu_best_isa() {
  static const Isa best = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bf16");
    return avx512 ? Isa::Avx512 : avx2 ? Isa::Avx2 : Isa::Scalar;
  }();
  return best;
}

Isa cpu_isa() {
  return current_isa().load(std::memory_order_relaxed);
}

Isa set_cpu_isa(Isa isa) {
  const Isa v = std::min(isa, cpu_best_isa());
  current_isa().store(v, std::memory_order_relaxed);
  return v;
}

const char* isa_name(Isa isa) {
  const char* const names[] = {"scalar", "avx2", "avx512"};
  return unsigned(isa) < 3 ? names[int(isa)] : "?";
}

int64_t resident_memory_bytes() {
  std::ifstream statm("/proc/self/statm");
  long long size = 0, resident = 0;
  return statm >> size >> resident ? int64_t(resident) * int64_t(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace deepinfer
