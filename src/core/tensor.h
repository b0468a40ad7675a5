// The shape of an n-dimensional array (at most kMaxDims dimensions).
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
  std::string str() const {  // "[2, 3]"
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(dim[i]);
    return s + "]";
  }
};

}  // namespace deepinfer
