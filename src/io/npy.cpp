#include "io/npy.h"

#include <fstream>
#include <string>
#include <type_traits>

#include "core/error.h"

namespace deepinfer {

template <typename T>
void npy_write(const std::string& path, const T* data, const std::vector<int64_t>& shape) {
  const char* descr = std::is_same_v<T, float> ? "<f4" : "<i4";
  int64_t n = 1;
  std::string sh;
  for (size_t i = 0; i < shape.size(); ++i) {
    n *= shape[i];
    sh += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  }
  // Magic, version 1.0, the header length (little-endian u16, filled in below), the header.
  std::string h = std::string("\x93NUMPY\x01\x00..", 10) + "{'descr': '" + descr +
                  "', 'fortran_order': False, 'shape': (" + sh + "), }";
  // Pad so that the data starts at a multiple of 64 bytes, ending the header with a newline.
  h.append((64 - (h.size() + 1) % 64) % 64, ' ');
  h.push_back('\n');
  h[8] = char((h.size() - 10) & 0xff);
  h[9] = char((h.size() - 10) >> 8);
  std::ofstream f(path, std::ios::binary);
  DI_REQUIRE(f, path, ": cannot create");
  f.write(h.data(), std::streamsize(h.size()));
  f.write(reinterpret_cast<const char*>(data), std::streamsize(size_t(n) * sizeof(T)));
  DI_REQUIRE(f, path, ": write failed");
}

template void npy_write(const std::string&, const float*, const std::vector<int64_t>&);
template void npy_write(const std::string&, const int32_t*, const std::vector<int64_t>&);

}  // namespace deepinfer
