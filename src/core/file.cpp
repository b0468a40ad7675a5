#include "core/file.h"

#include <cstdio>

#include "core/error.h"

namespace deepinfer {

std::string read_file(const std::string& path, const std::string& what, size_t max_bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  DI_REQUIRE(f, what, ": cannot read");
  std::string out;
  char buf[1 << 16];
  for (size_t n; out.size() <= max_bytes && (n = std::fread(buf, 1, sizeof buf, f)) > 0;)
    out.append(buf, n);
  const bool failed = std::ferror(f);  // e.g. a directory
  std::fclose(f);
  DI_REQUIRE(!failed, what, ": cannot read");
  return out;
}

}  // namespace deepinfer
