// MoE router (V41_SPEC.md §8.1): sqrt(softplus) scores in fp32, a bias that only steers the
// selection, weights from the unbiased scores, normalised over the chosen experts and scaled.
#pragma once

#include <cstdint>

namespace deepinfer {

struct RouteArgs {
  const float* logits;  // [E] gate outputs (before gate_temp)
  const float* bias;    // [E]
  int64_t E, k;
  float gate_temp, route_scale;
  bool normalise;
  int32_t* ids;    // [k] chosen experts, ascending id
  float* weights;  // [k] their weights, same order
};

void route_sqrtsoftplus(const RouteArgs& a);

}  // namespace deepinfer
