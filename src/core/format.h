// Small text helpers shared by the command line and the benchmarks.
#pragma once

#include <cstdio>
#include <string>

namespace deepinfer {

// 1536 -> "1.50 KiB", 512 -> "512 B" (binary units up to TiB).
inline std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  for (; bytes >= 1024 && u < 4; ++u) bytes /= 1024;
  char buf[32];
  std::snprintf(buf, sizeof(buf), u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

}  // namespace deepinfer
