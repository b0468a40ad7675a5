// Small text helpers shared by the command line and the benchmarks.
#pragma once

#include <string>

namespace deepinfer {

// 1536 -> "1.50 KiB", 512 -> "512 B" (binary units up to TiB).
std::string human_bytes(double bytes);

}  // namespace deepinfer
