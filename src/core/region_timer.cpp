#include "core/region_timer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

namespace deepinfer {

namespace {
struct Table {
  std::mutex mu;
  std::vector<RegionStat> rows;
  std::string title;
};
// The table, locked until the lock returned with it goes.
std::pair<Table&, std::unique_lock<std::mutex>> locked_table() {
  static Table* t = new Table();  // never destroyed: regions may close during exit
  return {*t, std::unique_lock(t->mu)};
}
}  // namespace

bool RegionTimer::enabled_ = [] {
  const char* s = std::getenv("DEEPINFER_REGION_TIMING");
  const bool on = s && *s && std::strcmp(s, "0") != 0;
  if (on) std::atexit([] { RegionTimer::print(stderr); });
  return on;
}();

void RegionTimer::add(const char* name, double ms) {
  auto [t, lock] = locked_table();
  auto row = std::ranges::find(t.rows, std::string_view(name), &RegionStat::name);
  if (row == t.rows.end()) row = t.rows.insert(row, {name});
  ++row->calls;
  row->total_ms += ms;
}

std::vector<RegionStat> RegionTimer::snapshot() {
  auto [t, lock] = locked_table();
  return t.rows;
}

void RegionTimer::reset() {
  auto [t, lock] = locked_table();
  t.rows.clear();
}

void RegionTimer::set_title(const std::string& title) {
  auto [t, lock] = locked_table();
  t.title = title;
}

void RegionTimer::print(std::FILE* out) {
  auto [t, lock] = locked_table();
  if (t.rows.empty()) return;
  if (!t.title.empty()) std::fprintf(out, "%s\n", t.title.c_str());
  std::fprintf(out, "%-32s %10s %12s %12s\n", "region", "calls", "total ms", "mean us");
  for (const auto& r : t.rows)
    std::fprintf(out, "%-32s %10llu %12.3f %12.2f\n", r.name.c_str(),
                 static_cast<unsigned long long>(r.calls), r.total_ms,
                 r.calls ? 1000.0 * r.total_ms / double(r.calls) : 0.0);
}

}  // namespace deepinfer
