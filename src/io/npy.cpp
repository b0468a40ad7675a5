#include "io/npy.h"

#include <fstream>
#include <string>

#include "core/error.h"

namespace deepinfer {

namespace {

// A .npy 1.0 file of 4-byte elements.
void write_npy(const std::string& path, const char* descr, const void* data,
               const std::vector<int64_t>& shape) {
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
  f.write(static_cast<const char*>(data), std::streamsize(size_t(n) * 4));
  DI_REQUIRE(f, path, ": write failed");
}

}  // namespace

void npy_write_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  write_npy(path, "<f4", data, shape);
}
void npy_write_i32(const std::string& path, const int32_t* data,
                   const std::vector<int64_t>& shape) {
  write_npy(path, "<i4", data, shape);
}

}  // namespace deepinfer
