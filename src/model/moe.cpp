// Mixture of experts (V41_SPEC.md §8): router, routed experts grouped by expert (each expert's
// weights are read once per step for all rows routed to it), shared expert, and the combine in
// ascending expert id with the shared expert last.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/region_timer.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/moe_routing.h"
#include "model/model_impl.h"

namespace deepinfer {

namespace {

// SwiGLU with the clamp of §8.2, in fp32, scaled by `weight`: a = weight * silu(g) * u.
void swiglu(float* g, const float* u, int64_t n, float limit, float weight) {
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i], ui = u[i];
    if (limit > 0) {
      gi = std::min(gi, limit);
      ui = std::max(-limit, std::min(ui, limit));
    }
    const float silu = f32(double(gi) * sigmoid_d(gi));
    g[i] = weight * (silu * ui);
  }
}

}  // namespace

void Model::Impl::moe(int l, Step& st, const float* v, float* out) {
  const LayerWeights& W = ck.layers[size_t(l)];
  const int64_t N = st.N, D = c.dim, F = c.moe_inter_dim, E = c.n_routed_experts;
  const int64_t k = c.n_activated_experts;
  const float limit = float(c.swiglu_limit);

  // Router (fp32 linear over the bf16 input, §8.1).
  std::vector<float> logits(size_t(N * E));
  std::vector<int32_t> ids(size_t(N * k));
  std::vector<float> weights(size_t(N * k));
  {
    DI_REGION("moe.router");
    linear_dense(W.gate, v, N, logits.data(), exact);
    for (int64_t i = 0; i < N; ++i) {
      RouteArgs a{&logits[size_t(i * E)],
                  W.gate_bias.f32(),
                  E,
                  k,
                  float(c.gate_temp),
                  float(c.route_scale),
                  c.norm_topk_prob,
                  &ids[size_t(i * k)],
                  &weights[size_t(i * k)]};
      route_sqrtsoftplus(a);
    }
  }

  // One expert over a set of rows: out_rows[n, D] = w2(swiglu(w1 x, w3 x) * weight).
  std::vector<float> xg, g, u, y;
  auto run_expert = [&](const ExpertWeights& ex, const std::vector<int64_t>& rows,
                        const float* row_weights, float* dst /*[n, D]*/) {
    const int64_t n = int64_t(rows.size());
    xg.resize(size_t(n * D));
    for (int64_t i = 0; i < n; ++i)
      std::copy(v + rows[size_t(i)] * D, v + (rows[size_t(i)] + 1) * D, &xg[size_t(i * D)]);
    g.resize(size_t(n * F));
    u.resize(size_t(n * F));
    linear_quant(ex.w1, xg.data(), n, g.data(), exact);
    linear_quant(ex.w3, xg.data(), n, u.data(), exact);
    round(g.data(), n * F);
    round(u.data(), n * F);
    for (int64_t i = 0; i < n; ++i)
      swiglu(&g[size_t(i * F)], &u[size_t(i * F)], F, limit, row_weights ? row_weights[i] : 1.0f);
    round(g.data(), n * F);
    linear_quant(ex.w2, g.data(), n, dst, exact);
    round(dst, n * D);
  };

  // Routed experts, grouped: expert_out[i, j] is row i's j-th expert (ascending id).
  std::vector<float> expert_out(size_t(N * k * D));
  {
    DI_REGION("moe.experts");
    std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(E));
    std::vector<std::vector<int64_t>> slot_of(static_cast<size_t>(E));
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < k; ++j) {
        rows_of[size_t(ids[size_t(i * k + j)])].push_back(i);
        slot_of[size_t(ids[size_t(i * k + j)])].push_back(i * k + j);
      }
    std::vector<float> rw;
    for (int64_t e = 0; e < E; ++e) {
      if (rows_of[size_t(e)].empty()) continue;
      const auto& rows = rows_of[size_t(e)];
      rw.resize(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) rw[i] = weights[size_t(slot_of[size_t(e)][i])];
      y.resize(rows.size() * size_t(D));
      run_expert(W.experts[size_t(e - ck.expert_begin)], rows, rw.data(), y.data());
      for (size_t i = 0; i < rows.size(); ++i)
        std::copy(&y[i * size_t(D)], &y[(i + 1) * size_t(D)],
                  &expert_out[size_t(slot_of[size_t(e)][i] * D)]);
    }
  }
  // Shared expert on every row.
  std::vector<float> shared(size_t(N * D));
  {
    DI_REGION("moe.shared");
    std::vector<int64_t> all(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) all[size_t(i)] = i;
    run_expert(W.shared, all, nullptr, shared.data());
  }
  // Combine (§8.3): fp32, ascending expert id, shared last, one rounding.
  for (int64_t i = 0; i < N; ++i)
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0;
      for (int64_t j = 0; j < k; ++j) acc += expert_out[size_t((i * k + j) * D + d)];
      acc += shared[size_t(i * D + d)];
      out[i * D + d] = acc;
    }
  round(out, N * D);
}

}  // namespace deepinfer
