#include "io/npy.h"

#include <string>
#include <fstream>

#include "core/error.h"

namespace deepinfer {

namespace {

std::string header_for(const char* descr, const std::vector<int64_t>& shape) {
  std::string sh = "(";
  for (size_t i = 0; i < shape.size(); ++i)
    sh += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
  sh += ")";
  std::string h =
      std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + sh + ", }";
  // Pad so that the data starts at a multiple of 64 bytes, ending the header with a newline.
  const size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h.push_back('\n');
  return h;
}

void write_npy(const std::string& path, const char* descr, const void* data, size_t elem,
               const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const std::string h = header_for(descr, shape);
  std::ofstream f(path, std::ios::binary);
  DI_REQUIRE(f, path, ": cannot create");
  const uint8_t magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(reinterpret_cast<const char*>(magic), 8);
  const uint16_t hl = uint16_t(h.size());
  const uint8_t hlb[2] = {uint8_t(hl & 0xff), uint8_t(hl >> 8)};
  f.write(reinterpret_cast<const char*>(hlb), 2);
  f.write(h.data(), std::streamsize(h.size()));
  f.write(static_cast<const char*>(data), std::streamsize(size_t(n) * elem));
  DI_REQUIRE(f, path, ": write failed");
}

}  // namespace

void npy_write_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  write_npy(path, "<f4", data, 4, shape);
}
void npy_write_i32(const std::string& path, const int32_t* data,
                   const std::vector<int64_t>& shape) {
  write_npy(path, "<i4", data, 4, shape);
}

}  // namespace deepinfer
