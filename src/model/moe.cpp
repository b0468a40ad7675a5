// Mixture of experts (V41_SPEC.md §8): router, routed experts grouped by expert (each expert's
// weights are read once per step for all rows routed to it), shared expert, and the combine in
// ascending expert id with the shared expert last.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/region_timer.h"
#include "dist/serial.h"
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
  const PreparedLayer& P = lin[size_t(l)];
  const int64_t N = st.N, D = c.dim, F = c.moe_inter_dim, E = c.n_routed_experts;
  const int64_t k = c.n_activated_experts;
  const float limit = float(c.swiglu_limit);

  // Router (fp32 linear over the bf16 input, §8.1).
  std::vector<float> logits(size_t(N * E));
  std::vector<int32_t> ids(size_t(N * k));
  std::vector<float> weights(size_t(N * k));
  {
    DI_REGION("moe.router");
    linear(P.gate, v, N, logits.data(), exact);
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

  // Experts over rows of `src`: dst_e[n_e, D] = w2(swiglu(w1 x, w3 x) * weight) for each
  // expert e with rows. The w1/w3 linears of all of them run as one batch of calls, then the w2
  // linears (one pass of the thread pool each when the rows are few, as in decode).
  struct ExpertJob {
    const PreparedExpert* ex;
    const std::vector<int64_t>* rows;
    const float* row_weights;  // null: weight 1
    float* dst;
    std::vector<float> xg, g, u;
  };
  auto run_experts = [&](std::vector<ExpertJob>& jobs, const float* src /*[*, D]*/) {
    std::vector<LinearCall> calls;
    for (ExpertJob& jb : jobs) {
      const int64_t n = int64_t(jb.rows->size());
      jb.xg.resize(size_t(n * D));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = (*jb.rows)[size_t(i)];
        std::copy(src + r * D, src + (r + 1) * D, &jb.xg[size_t(i * D)]);
      }
      jb.g.resize(size_t(n * F));
      jb.u.resize(size_t(n * F));
      calls.push_back({&jb.ex->w1, {jb.xg.data(), n, D, jb.g.data(), F, 0, -1, exact}});
      calls.push_back({&jb.ex->w3, {jb.xg.data(), n, D, jb.u.data(), F, 0, -1, exact}});
    }
    linear_many(calls);
    calls.clear();
    for (ExpertJob& jb : jobs) {
      const int64_t n = int64_t(jb.rows->size());
      round(jb.g.data(), n * F);
      round(jb.u.data(), n * F);
      for (int64_t i = 0; i < n; ++i)
        swiglu(&jb.g[size_t(i * F)], &jb.u[size_t(i * F)], F, limit,
               jb.row_weights ? jb.row_weights[i] : 1.0f);
      round(jb.g.data(), n * F);
      calls.push_back({&jb.ex->w2, {jb.g.data(), n, F, jb.dst, D, 0, -1, exact}});
    }
    linear_many(calls);
    for (ExpertJob& jb : jobs) round(jb.dst, int64_t(jb.rows->size()) * D);
  };

  // The routed experts this rank holds, grouped by expert (each expert's weights are read once
  // for all its rows), over rows xs [nr, D] routed by rid/rwt [nr, k]. slots[i, j] receives row
  // i's j-th expert (ascending id) when this rank holds it, and stays zero otherwise.
  auto routed = [&](const float* xs, int64_t nr, const int32_t* rid, const float* rwt,
                    float* slots /*[nr, k, D]*/) {
    DI_REGION("moe.experts");
    std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(E)),
        slot_of(static_cast<size_t>(E));
    for (int64_t i = 0; i < nr; ++i)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = rid[i * k + j];
        if (e < ck.expert_begin || e >= ck.expert_end) continue;
        rows_of[size_t(e)].push_back(i);
        slot_of[size_t(e)].push_back(i * k + j);
      }
    std::vector<std::vector<float>> rw(static_cast<size_t>(E)), y(static_cast<size_t>(E));
    std::vector<ExpertJob> jobs;
    for (int64_t e = ck.expert_begin; e < ck.expert_end; ++e) {
      const auto& rows = rows_of[size_t(e)];
      if (rows.empty()) continue;
      for (int64_t sl : slot_of[size_t(e)]) rw[size_t(e)].push_back(rwt[sl]);
      y[size_t(e)].resize(rows.size() * size_t(D));
      jobs.push_back({&P.experts[size_t(e - ck.expert_begin)],
                      &rows,
                      rw[size_t(e)].data(),
                      y[size_t(e)].data(),
                      {},
                      {},
                      {}});
    }
    run_experts(jobs, xs);
    for (int64_t e = ck.expert_begin; e < ck.expert_end; ++e)
      for (size_t i = 0; i < rows_of[size_t(e)].size(); ++i)
        std::copy(&y[size_t(e)][i * size_t(D)], &y[size_t(e)][(i + 1) * size_t(D)],
                  &slots[slot_of[size_t(e)][i] * D]);
  };

  std::vector<float> expert_out(size_t(N * k * D), 0.0f);  // [N, k, D]
  dist::Group* ep = opt.parallel.ep;
  if (!ep) {
    routed(v, N, ids.data(), weights.data(), expert_out.data());
  } else if (!opt.parallel.ep_dispatch) {
    // Every member has the same rows: each fills the slots of its experts, and the sum over
    // the group (one term per slot non-zero) gives every rank the single-rank slots exactly.
    routed(v, N, ids.data(), weights.data(), expert_out.data());
    DI_REGION("comm.moe_all_reduce");
    ep->all_reduce(expert_out.data(), expert_out.size());
  } else {
    // Members bring different rows: gather everyone's rows and routes, run the local experts on
    // all of them, and return each member its rows' slots with a reduce-scatter.
    std::vector<uint8_t> mine;
    {
      dist::Writer w;
      w.put_vector(std::span<const float>(v, size_t(N * D)));
      w.put_vector(ids);
      w.put_vector(weights);
      mine = w.take();
    }
    std::vector<std::vector<uint8_t>> parts;
    {
      DI_REGION("comm.moe_dispatch");
      parts = ep->all_gather_v(mine);
    }
    std::vector<float> xs, ws;
    std::vector<int32_t> rs;
    std::vector<int64_t> count;
    for (const auto& part : parts) {
      dist::Reader r(part, "expert dispatch message");
      const auto pv = r.get_vector<float>();
      const auto pi = r.get_vector<int32_t>();
      const auto pw = r.get_vector<float>();
      r.expect_end();
      count.push_back(int64_t(pi.size()) / k);
      xs.insert(xs.end(), pv.begin(), pv.end());
      rs.insert(rs.end(), pi.begin(), pi.end());
      ws.insert(ws.end(), pw.begin(), pw.end());
    }
    const int64_t n_all = int64_t(rs.size()) / k;
    const int64_t n_max = *std::max_element(count.begin(), count.end());
    std::vector<float> slots(size_t(n_all * k * D), 0.0f);
    routed(xs.data(), n_all, rs.data(), ws.data(), slots.data());
    // Pad each member's rows to n_max for the reduce-scatter.
    std::vector<float> padded(size_t(int64_t(parts.size()) * n_max * k * D), 0.0f),
        back(size_t(n_max * k * D));
    int64_t at = 0;
    for (size_t pr = 0; pr < parts.size(); ++pr) {
      std::copy_n(&slots[size_t(at * k * D)], count[pr] * k * D,
                  &padded[size_t(int64_t(pr) * n_max * k * D)]);
      at += count[pr];
    }
    {
      DI_REGION("comm.moe_combine");
      ep->reduce_scatter(padded.data(), size_t(n_max * k * D), back.data());
    }
    std::copy_n(back.data(), N * k * D, expert_out.data());
  }
  // Shared expert on every row.
  std::vector<float> shared(size_t(N * D));
  {
    DI_REGION("moe.shared");
    std::vector<int64_t> all(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) all[size_t(i)] = i;
    std::vector<ExpertJob> jobs{{&P.shared, &all, nullptr, shared.data(), {}, {}, {}}};
    run_experts(jobs, v);
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
