// Manifold-constrained hyper-connections (V41_SPEC.md §7): the residual stream is M copies of a
// D-vector; each sublayer reads a weighted collapse of the copies (pre) and writes back a mix
// of its output and the copies (post, comb). Per token, fp32 results at each step of §7.1 (sums
// of a few terms in double, rounded once). hc_pre/hc_post return fp32; callers round them to the
// activation dtype.
#pragma once

#include <cstdint>

#include "kernels/linear.h"

namespace deepinfer {

constexpr int64_t kMaxHcMult = 16;  // the most copies the kernels take

struct HcParams {
  const PreparedLinear* fn;  // F32 [(2+M)M, M*D]
  const float* base;         // [(2+M)M]
  const float* scale;        // [3]: pre, post, comb
  int64_t M, D;
  float norm_eps, hc_eps;
  int sinkhorn_iters;
  bool exact;  // the projection by `fn` summed in double (else its linear)
};

// The mixes of n tokens: x [n, M, D] (a token's stream is [M, D]), pre [n, M], post [n, M],
// comb [n, M, M] (row j, column k). Each token's results depend on that token only; the
// projection weights are read once for all of them.
void hc_mixes_rows(const HcParams& p, const float* x, int64_t n, float* pre, float* post,
                   float* comb);
// Sinkhorn normalisation of c [M, M] in place (§7.1 step 4), iters >= 1.
void sinkhorn(float* c, int64_t M, int iters, float eps);
// out[D] = Σ_c pi_c · x_c (fp32, copies in order).
void hc_pre(const float* x, const float* pi, int64_t M, int64_t D, float* out);
// out[k] = post_k · y + Σ_j comb[j, k] · x_j for each output copy k. out: [M, D] (not x).
void hc_post(const float* y, const float* x, const float* post, const float* comb, int64_t M,
             int64_t D, float* out);

}  // namespace deepinfer
