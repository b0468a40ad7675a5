// A non-owning view of an n-dimensional array: pointer, dtype, shape and element strides. Views
// never allocate and never free; whoever made the bytes owns them and must outlive the view.
// Sub-byte types (E2M1) are only described contiguously (two elements per byte along the last
// dimension).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

namespace deepinfer {

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  int64_t stride[kMaxDims] = {};  // in elements

  TensorView() = default;
  // A contiguous (row-major) view.
  TensorView(void* p, DType t, Shape s) : data(p), dtype(t), shape(s) {
    int64_t st = 1;
    for (int i = s.ndim - 1; i >= 0; --i) {
      stride[i] = st;
      st *= s.dim[i];
    }
  }

  int64_t numel() const { return shape.numel(); }
  uint64_t nbytes() const { return dtype_bytes(dtype, uint64_t(numel())); }
  bool contiguous() const {
    int64_t st = 1;
    for (int i = shape.ndim - 1; i >= 0; --i) {
      if (shape.dim[i] != 1 && stride[i] != st) return false;
      st *= shape.dim[i];
    }
    return true;
  }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Row `i` of the first dimension, as a view of the rest.
  TensorView row(int64_t i) const {
    DI_CHECK(shape.ndim >= 1 && i >= 0 && i < shape.dim[0], "row ", i, " of ", shape.str());
    DI_CHECK(dtype_bits(dtype) >= 8, "row() of a sub-byte tensor");
    TensorView v;
    v.dtype = dtype;
    v.data = static_cast<char*>(data) + i * stride[0] * (dtype_bits(dtype) / 8);
    v.shape.ndim = shape.ndim - 1;
    for (int d = 1; d < shape.ndim; ++d) {
      v.shape.dim[d - 1] = shape.dim[d];
      v.stride[d - 1] = stride[d];
    }
    return v;
  }
};

}  // namespace deepinfer
