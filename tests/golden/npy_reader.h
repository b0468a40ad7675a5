// Reading NumPy .npy arrays (format 1.0/2.0, little-endian float32/float64/int32/int64, C order)
// and .npz archives written without compression (numpy.savez): the numpy reference's outputs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace deepinfer::testing {

struct NpyArray {
  std::string dtype;  // "f4", "f8", "i4", "i8"
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // raw little-endian data

  int64_t numel() const;
  // The values converted to T (double or int64_t) from any of the four dtypes.
  template <typename T>
  std::vector<T> as() const;
};

NpyArray npy_read(const std::string& path);
// Every array of an uncompressed .npz, by name (without ".npy").
std::map<std::string, NpyArray> npz_read(const std::string& path);

}  // namespace deepinfer::testing
