#include "core/tensor.h"

namespace deepinfer {

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(dim[i]);
  }
  return s + "]";
}

TensorView TensorView::row(int64_t i) const {
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

}  // namespace deepinfer
