#include "core/region_timer.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace deepinfer {

namespace {
struct Table {
  std::mutex mu;
  std::vector<RegionStat> rows;
  std::string title;
};
Table& table() {
  static Table* t = new Table();  // never destroyed: regions may close during exit
  return *t;
}
bool install() {
  const char* s = std::getenv("DEEPINFER_REGION_TIMING");
  const bool on = s && *s && std::strcmp(s, "0") != 0;
  if (on) std::atexit([] { RegionTimer::print(stderr); });
  return on;
}
}  // namespace

bool RegionTimer::enabled_ = install();

void RegionTimer::set_enabled(bool on) {
  enabled_ = on;
}

void RegionTimer::add(const char* name, double ms) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  for (auto& r : t.rows)
    if (r.name == name) {
      ++r.calls;
      r.total_ms += ms;
      return;
    }
  t.rows.push_back({name, 1, ms});
}

std::vector<RegionStat> RegionTimer::snapshot() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.rows;
}

void RegionTimer::reset() {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.rows.clear();
}

void RegionTimer::set_title(const std::string& title) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.title = title;
}

void RegionTimer::print(std::FILE* out) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.rows.empty()) return;
  if (!t.title.empty()) std::fprintf(out, "%s\n", t.title.c_str());
  std::fprintf(out, "%-32s %10s %12s %12s\n", "region", "calls", "total ms", "mean us");
  for (const auto& r : t.rows)
    std::fprintf(out, "%-32s %10llu %12.3f %12.2f\n", r.name.c_str(),
                 static_cast<unsigned long long>(r.calls), r.total_ms,
                 r.calls ? 1000.0 * r.total_ms / double(r.calls) : 0.0);
}

}  // namespace deepinfer
