// Named-region timing. With DEEPINFER_REGION_TIMING=1 every DI_REGION scope adds its wall time
// to a process-wide table, printed to stderr at exit (or on demand). Disabled, a region costs one
// predictable branch. Regions may nest; times are inclusive.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace deepinfer {

struct RegionStat {
  std::string name;
  uint64_t calls = 0;
  double total_ms = 0;
};

class RegionTimer {
 public:
  static bool enabled() { return enabled_; }
  // Overrides the environment (tests, benchmarks).
  static void set_enabled(bool on) { enabled_ = on; }
  static void add(const char* name, double ms);
  static std::vector<RegionStat> snapshot();  // in first-use order
  static void reset();
  static void print(std::FILE* out);
  // A title printed above the table (e.g. "rank 2" when several ranks print theirs).
  static void set_title(const std::string& title);

 private:
  static bool enabled_;
};

class ScopedRegion {
 public:
  explicit ScopedRegion(const char* name) : name_(RegionTimer::enabled() ? name : nullptr) {
    if (name_) t0_ = std::chrono::steady_clock::now();
  }
  ~ScopedRegion() {
    if (name_)
      RegionTimer::add(
          name_, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_)
                     .count());
  }
  ScopedRegion(const ScopedRegion&) = delete;
  ScopedRegion& operator=(const ScopedRegion&) = delete;

 private:
  const char* name_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace deepinfer

#define DI_REGION_CAT2(a, b) a##b
#define DI_REGION_CAT(a, b) DI_REGION_CAT2(a, b)
// DI_REGION("attn.indexer"): times the rest of the enclosing scope. `name` must be a literal.
#define DI_REGION(name) ::deepinfer::ScopedRegion DI_REGION_CAT(di_region_, __LINE__)(name)
