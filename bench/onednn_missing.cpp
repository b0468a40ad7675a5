// Built when oneDNN is not available: the comparisons report nothing.
#include "core/error.h"
#include "onednn_matmul.h"

namespace deepinfer::bench {

struct OnednnMatmul::Impl {};
OnednnMatmul::OnednnMatmul(int64_t, int64_t, int64_t) {
  throw Error("this build has no oneDNN (install libdnnl-dev and reconfigure)");
}
OnednnMatmul::~OnednnMatmul() = default;
int OnednnMatmul::add_weight(const float*) {
  return 0;
}
void OnednnMatmul::run(int) {}
const float* OnednnMatmul::output() const {
  return nullptr;
}
bool onednn_available() {
  return false;
}
void onednn_set_threads(int) {}
double onednn_peak_gflops(int) {
  return 0;
}

}  // namespace deepinfer::bench
