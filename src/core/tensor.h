// A non-owning view of an n-dimensional array: pointer, dtype, shape and element strides.
// Views never allocate and never free; whoever made the bytes (a mapped checkpoint, a buffer
// arena, a KV pool) owns them and must outlive the view. Sub-byte types (E2M1) are only
// described contiguously (two elements per byte along the last dimension).
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace deepinfer {

constexpr int kMaxDims = 6;

struct Shape {
  int ndim = 0;
  int64_t dim[kMaxDims] = {};

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    DI_CHECK(dims.size() <= size_t(kMaxDims), "too many dims");
    for (int64_t d : dims) dim[ndim++] = d;
  }
  int64_t operator[](int i) const { return dim[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dim[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    return ndim == o.ndim && std::equal(dim, dim + ndim, o.dim);
  }
  std::string str() const;  // "[2, 3]"
};

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
  TensorView(const void* p, DType t, Shape s) : TensorView(const_cast<void*>(p), t, s) {}

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
  TensorView row(int64_t i) const;
};

}  // namespace deepinfer
