#include "kernels/moe_routing.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/elementwise.h"

namespace deepinfer {

void route_sqrtsoftplus(const RouteArgs& a) {
  constexpr int64_t kMaxExperts = 4096;
  DI_CHECK(a.E <= kMaxExperts && a.k >= 1 && a.k <= a.E);
  float sc[kMaxExperts], biased[kMaxExperts];
  int32_t order[kMaxExperts];
  for (int64_t e = 0; e < a.E; ++e) {
    const float s = a.logits[e] / a.gate_temp;
    sc[e] = f32(std::sqrt(double(f32(softplus_d(s)))));
    biased[e] = sc[e] + a.bias[e];
    order[e] = int32_t(e);
  }
  std::partial_sort(order, order + a.k, order + a.E, [&](int32_t x, int32_t y) {
    return biased[x] != biased[y] ? biased[x] > biased[y] : x < y;
  });
  double sum = 0;
  for (int64_t i = 0; i < a.k; ++i) sum += sc[order[i]];
  const float denom = f32(sum) + 1e-20f;
  std::sort(order, order + a.k);
  for (int64_t i = 0; i < a.k; ++i) {
    float w = sc[order[i]];
    if (a.normalise && a.k > 1) w = w / denom;
    a.ids[i] = order[i];
    a.weights[i] = w * a.route_scale;
  }
}

}  // namespace deepinfer
