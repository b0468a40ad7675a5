// A growable, 64-byte aligned scratch buffer; kernels keep one per thread (thread_local), so a
// call allocates only when it needs more than any call on that thread did before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace deepinfer {

class AlignedScratch {
 public:
  uint8_t* bytes(size_t n) {
    if (buf_.size() < n + 64) buf_.resize(n + 64);
    const uintptr_t p = reinterpret_cast<uintptr_t>(buf_.data());
    return buf_.data() + ((64 - (p & 63)) & 63);
  }
  float* floats(int64_t n) { return reinterpret_cast<float*>(bytes(size_t(n) * sizeof(float))); }

 private:
  std::vector<uint8_t> buf_;
};

}  // namespace deepinfer
