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

}  // namespace deepinfer
