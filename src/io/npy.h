// NumPy .npy array writer (format 1.0, little-endian, C order), for activation dumps compared
// with the numpy reference in tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer {

void npy_write_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
void npy_write_i32(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape);

}  // namespace deepinfer
