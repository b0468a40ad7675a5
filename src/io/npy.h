// NumPy .npy array writer (format 1.0, little-endian, C order), for activation dumps compared
// with the numpy reference in tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer {

// T is float ("<f4") or int32_t ("<i4"), the two instantiations npy.cpp provides.
template <typename T>
void npy_write(const std::string& path, const T* data, const std::vector<int64_t>& shape);

}  // namespace deepinfer
