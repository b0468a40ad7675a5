#include "bench_util.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/huge_alloc.h"
#include "core/thread_pool.h"

namespace deepinfer::bench {

Row& Row::add(const std::string& key, const std::string& value) {
  fields_.push_back({key, value, false, 0});
  return *this;
}

Row& Row::add(const std::string& key, double value, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, value);
  // A small non-zero figure keeps three significant digits instead of rounding to zero (a ratio
  // of a tiny shape on a loaded machine can fall below 0.0005).
  if (value != 0 && std::strtod(buf, nullptr) == 0) std::snprintf(buf, sizeof(buf), "%.3g", value);
  fields_.push_back({key, buf, true, value});
  return *this;
}

Row& Row::add(const std::string& key, int64_t value) {
  fields_.push_back({key, std::to_string(value), true, double(value)});
  return *this;
}

void Reporter::print(const Row& r) {
  if (json_) {
    nlohmann::ordered_json j;
    for (const auto& f : r.fields()) {
      if (f.number)
        j[f.key] = std::strtod(f.text.c_str(), nullptr);
      else
        j[f.key] = f.text;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::string line;
    for (const auto& f : r.fields()) line += (line.empty() ? "" : "  ") + f.key + "=" + f.text;
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void Reporter::note(const std::string& text) {
  std::fprintf(json_ ? stderr : stdout, "# %s\n", text.c_str());
  std::fflush(json_ ? stderr : stdout);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

namespace {
// Sums 64-bit lanes of [p, p + n) (n a multiple of 128 bytes) in V-wide loads (V: a vector of
// uint64_t), one accumulator per vector of each 128 bytes. With `prefetch`, each 128 bytes also
// prefetch the lines 8 KiB ahead into L2, as the GEMVs do: on some machines (a Sapphire Rapids
// VM) the hardware prefetchers alone reach 0.6 of what a prefetched read does, so a limit read
// without them would flatter every ratio.
template <typename V, bool prefetch>
[[gnu::always_inline]] inline uint64_t sum_lanes(const uint8_t* p, uint64_t n) {
  constexpr int kVecs = int(128 / sizeof(V));
  V a[kVecs] = {};
  for (uint64_t i = 0; i < n; i += 128) {
    if (prefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 8192), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 8192 + 64), _MM_HINT_T1);
    }
    // Unrolled, so the accumulators are registers: left in a stack array (a load, add and store
    // per vector) the read ran 30-36 GB/s on the Xeon VM depending on where the stack fell
    // relative to the buffer, which any code change could move; unrolled, 37-39
    // (docs/benchmarks.md).
#pragma GCC unroll 8
    for (int k = 0; k < kVecs; ++k) a[k] += *reinterpret_cast<const V*>(p + i + sizeof(V) * k);
  }
  for (int k = 1; k < kVecs; ++k) a[0] += a[k];
  uint64_t out = 0;
  for (size_t j = 0; j < sizeof(V) / 8; ++j) out += a[0][j];
  return out;
}
using U64x2 = uint64_t __attribute__((vector_size(16)));
using U64x4 = uint64_t __attribute__((vector_size(32)));

// 16-byte loads (the baseline ISA).
template <bool prefetch>
uint64_t sum_range(const uint8_t* p, uint64_t n) {
  return sum_lanes<U64x2, prefetch>(p, n);
}
// 32-byte loads (AVX2, where the CPU has it). The limit is the faster loop.
template <bool prefetch>
__attribute__((target("avx2"))) uint64_t sum_range_avx2(const uint8_t* p, uint64_t n) {
  return sum_lanes<U64x4, prefetch>(p, n);
}

// One read of bufs by every thread, with or without software prefetch, with 16- or 32-byte loads.
template <bool prefetch, bool wide = false>
double sweep_once(const std::vector<std::span<const uint8_t>>& bufs) {
  // Thread t reads share t of the buffers' concatenation (crossing buffer ends), so that no
  // synchronisation between buffers lowers the limit.
  ThreadPool& pool = ThreadPool::global();
  const int64_t parts = pool.size();
  uint64_t total = 0;
  for (const auto& b : bufs) total += b.size() / 128 * 128;
  std::vector<uint64_t> sink(static_cast<size_t>(parts));
  const double t0 = now_s();
  pool.parallel_for(parts, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const uint64_t lo = total / uint64_t(parts) * uint64_t(i) / 128 * 128;
      const uint64_t hi =
          i + 1 == parts ? total : total / uint64_t(parts) * uint64_t(i + 1) / 128 * 128;
      uint64_t at = 0, acc = 0;
      for (const auto& b : bufs) {
        const uint64_t n = b.size() / 128 * 128, from = std::max(lo, at), to = std::min(hi, at + n);
        if (from < to)
          acc += wide ? sum_range_avx2<prefetch>(b.data() + (from - at), to - from)
                      : sum_range<prefetch>(b.data() + (from - at), to - from);
        at += n;
      }
      sink[size_t(i)] = acc;
    }
  });
  const double dt = now_s() - t0;
  uint64_t check = 0;
  for (uint64_t s : sink) check += s;
  return check == 1 ? dt * 2 : dt;  // `check` keeps the sums alive
}
}  // namespace

double read_bandwidth_gbs(uint64_t bytes, int reps) {
  bytes = bytes / 4096 * 4096;
  // On huge pages like the repacked weights the kernels read (core/huge_alloc.h).
  const std::shared_ptr<uint8_t> mem = huge_alloc(bytes);
  uint8_t* buf = mem.get();
  ThreadPool& pool = ThreadPool::global();
  const int64_t parts = pool.size();
  const uint64_t part = bytes / uint64_t(parts) / 128 * 128;
  pool.parallel_for(parts, 1, [&](int64_t b, int64_t e) {  // first touch by the reading thread
    for (int64_t i = b; i < e; ++i) std::memset(buf + uint64_t(i) * part, int(i + 1), part);
  });
  const std::vector<std::span<const uint8_t>> all = {{buf, size_t(part * uint64_t(parts))}};
  double best = 0;
  for (int r = 0; r < reps; ++r)
    best = std::max(best, double(all[0].size()) / sweep_seconds(all) / 1e9);
  return best;
}

double sweep_seconds(const std::vector<std::span<const uint8_t>>& bufs) {
  double t = std::min(sweep_once<false>(bufs), sweep_once<true>(bufs));
  if (__builtin_cpu_supports("avx2"))
    t = std::min({t, sweep_once<false, true>(bufs), sweep_once<true, true>(bufs)});
  return t;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
double min_of(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::min_element(v.begin(), v.end());
}
double max_of(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

void add_pairs(Row& row, const PairStats& p, const std::string& name, const std::string& limit_name,
               int precision) {
  row.add(name, median(p.figure), precision)
      .add(limit_name, median(p.limit), precision)
      .add("ratio", median(p.ratio), 3)
      .add("ratio_min", min_of(p.ratio), 3)
      .add("ratio_max", max_of(p.ratio), 3)
      .add("pairs", int64_t(p.ratio.size()));
}

}  // namespace deepinfer::bench
