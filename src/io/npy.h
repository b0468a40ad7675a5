// NumPy .npy arrays (format 1.0/2.0, little-endian float32/float64/int32/int64, C order) and .npz
// archives written without compression (numpy.savez). Used for activation dumps and for
// exchanging arrays with the numpy reference in tests.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace deepinfer {

struct NpyArray {
  std::string dtype;  // "f4", "f8", "i4", "i8"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // raw little-endian data

  int64_t numel() const;
  // The values converted to T (double or int64_t) from any of the four dtypes.
  template <typename T>
  std::vector<T> as() const;
};

void npy_write_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
void npy_write_i32(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape);
NpyArray npy_read(const std::string& path);
// Every array of an uncompressed .npz, by name (without ".npy").
std::map<std::string, NpyArray> npz_read(const std::string& path);

}  // namespace deepinfer
