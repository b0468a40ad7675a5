#include "kernels/linear.h"

namespace deepinfer {

void linear_quant(const Weight& w, const LinearArgs& a) {
  linear_quant_ref(w, a);
}
void linear_dense(const Weight& w, const LinearArgs& a) {
  linear_dense_ref(w, a);
}

}  // namespace deepinfer
