// Mixture of experts (V41_SPEC.md §8): router, routed experts grouped by expert (each expert's
// weights are read once per step for all rows routed to it), shared expert, and the combine in
// ascending expert id with the shared expert last.
#include <algorithm>

#include "core/region_timer.h"
#include "kernels/elementwise.h"
#include "kernels/moe_routing.h"
#include "model/model_impl.h"

namespace deepinfer {

namespace {

// Rows per task of the row copies, the combine and the output rounding: fewer rows (decode) run
// on the calling thread.
constexpr int64_t kCopyRows = 16;

}  // namespace

void Model::Impl::moe(int l, Step& st, const float* v, float* out) {
  ArenaScope scope(arena);
  const LayerWeights& W = weights(l);
  const PreparedLayer& P = lin[size_t(l)];
  // A draft stage has its own expert count and top-k, and every one of its experts here.
  const bool stage = l >= c.n_layers;
  const int64_t N = st.N, D = c.dim, F = c.moe_inter_dim;
  const int64_t E = stage ? c.dspark_experts() : c.n_routed_experts;
  const int64_t k = stage ? c.dspark_topk() : c.n_activated_experts;
  const int64_t e_begin = stage ? 0 : ck.expert_begin, e_end = stage ? E : ck.expert_end;
  ExpertExchange all_here;
  const float limit = float(c.swiglu_limit);

  // Router (fp32 linear over the bf16 input, §8.1).
  ArenaVec<float> logits(size_t(N * E), &arena);
  ArenaVec<int32_t> ids(size_t(N * k), &arena);
  ArenaVec<float> weights(size_t(N * k), &arena);
  {
    DI_REGION("moe.router");
    linear(P.gate, v, N, logits.data(), exact);
    // Image rows select with bias_vl (the routing weights stay unbiased); draft stages see text.
    const float* const* img =
        !stage && !st.batch->image_embeds.empty() ? st.batch->image_embeds.data() : nullptr;
    for_rows(N, [&](int64_t i) {
      route_sqrtsoftplus({&logits[size_t(i * E)],
                          img && img[i] ? W.gate_bias_vl.f32() : W.gate_bias.f32(), E, k,
                          float(c.gate_temp), float(c.route_scale), c.norm_topk_prob,
                          &ids[size_t(i * k)], &weights[size_t(i * k)]});
    });
  }

  // Experts over rows of `src`: dst_e[n_e, D] = w2(swiglu(w1 x, w3 x) * weight) for each
  // expert e with rows. The w1/w3 linears of all of them run as one batch of calls, then the w2
  // linears (one pass of the thread pool each when the rows are few, as in decode).
  struct ExpertJob {
    const PreparedExpert* ex;
    const int64_t* rows;  // [n] rows of the source; null: rows 0 .. n-1
    int64_t n;
    const float* row_weights;  // null: weight 1
    float* dst;                // [n, D]
  };
  auto run_experts = [&](std::span<const ExpertJob> jobs, const float* src /*[*, D]*/) {
    ArenaScope scope(arena);
    int64_t total = 0;
    bool gather = false, qlin = true;
    for (const ExpertJob& jb : jobs) {
      total += jb.n;
      gather |= jb.rows != nullptr;
      qlin &= jb.ex->w1.weight().quant_input && jb.ex->w3.weight().quant_input;
    }
    // QLin experts read their rows of src through pointers; other weights from a gathered copy.
    const bool by_pointer = gather && qlin;
    // Per row of the jobs, in job order: its source row and its weight.
    float* const g = arena_array<float>(arena, size_t(total * F));
    float* const u = arena_array<float>(arena, size_t(total * F));
    float* const xg =
        gather && !by_pointer ? arena_array<float>(arena, size_t(total * D)) : nullptr;
    const float** const x_row = arena_array<const float*>(arena, size_t(total));
    float* const rw = arena_array<float>(arena, size_t(total));
    ArenaVec<LinearCall> calls(&arena);
    calls.reserve(2 * jobs.size());
    int64_t at = 0;
    for (const ExpertJob& jb : jobs) {
      for (int64_t i = 0; i < jb.n; ++i) {
        x_row[at + i] = src + (jb.rows ? jb.rows[i] : i) * D;
        rw[at + i] = jb.row_weights ? jb.row_weights[i] : 1.0f;
      }
      const float* x = xg ? xg + at * D : src;
      const float* const* xr = by_pointer ? x_row + at : nullptr;
      calls.push_back({&jb.ex->w1, {x, jb.n, D, g + at * F, F, 0, -1, exact, bf16, xr}});
      calls.push_back({&jb.ex->w3, {x, jb.n, D, u + at * F, F, 0, -1, exact, bf16, xr}});
      at += jb.n;
    }
    if (xg)
      for_rows(
          total, [&](int64_t i) { std::copy_n(x_row[i], D, xg + i * D); }, kCopyRows);
    linear_many(calls);
    calls.clear();
    at = 0;
    for (const ExpertJob& jb : jobs) {
      calls.push_back({&jb.ex->w2, {g + at * F, jb.n, F, jb.dst, D, 0, -1, exact, bf16}});
      at += jb.n;
    }
    // Each row's SwiGLU (a double exp per value) over the pool, and the rounding of its output
    // (the linears rounded its inputs).
    for_rows(total, [&](int64_t i) {
      float* gi = g + i * F;
      swiglu(gi, u + i * F, F, limit, rw[i]);
      round(gi, F);
    });
    linear_many(calls);  // (rounding its outputs)
  };

  // The routed experts this rank holds, grouped by expert (each expert's weights are read once
  // for all its rows), over rows xs [nr, D] routed by rid/rwt [nr, k]. slots[i, j] receives row
  // i's j-th expert (ascending id) when this rank holds it, and stays zero otherwise. With every
  // expert here, `kept` [nr·k, D] holds the outputs instead (row where[i·k + j] of it), not
  // copied into slots.
  auto routed = [&](const float* xs, int64_t nr, const int32_t* rid, const float* rwt,
                    float* slots /*[nr, k, D]*/, float* kept, int64_t* where) {
    DI_REGION("moe.experts");
    ArenaScope scope(arena);
    // Counting sort of the (row, slot) pairs by expert, rows ascending within an expert.
    ArenaVec<int64_t> first(size_t(E + 1), 0, &arena), fill(&arena);
    for (int64_t i = 0; i < nr * k; ++i)
      if (rid[i] >= e_begin && rid[i] < e_end) ++first[size_t(rid[i] + 1)];
    for (int64_t e = 0; e < E; ++e) first[size_t(e + 1)] += first[size_t(e)];
    fill.assign(first.begin(), first.end() - 1);
    const int64_t n_mine = first[size_t(E)];
    ArenaVec<int64_t> rows(size_t(n_mine), &arena), slot(size_t(n_mine), &arena);
    ArenaVec<float> rw(size_t(n_mine), &arena);
    float* const y = kept ? kept : arena_array<float>(arena, size_t(n_mine * D));
    for (int64_t j = 0; j < nr * k; ++j) {  // row j / k's slot j % k
      const int32_t e = rid[j];
      if (e < e_begin || e >= e_end) continue;
      const int64_t at = fill[size_t(e)]++;
      rows[size_t(at)] = j / k;
      slot[size_t(at)] = j;
      rw[size_t(at)] = rwt[j];
    }
    ArenaVec<ExpertJob> jobs(&arena);
    for (int64_t e = e_begin; e < e_end; ++e) {
      const int64_t b = first[size_t(e)], n = first[size_t(e + 1)] - b;
      if (n == 0) continue;
      jobs.push_back(
          {&P.experts[size_t(e - e_begin)], &rows[size_t(b)], n, &rw[size_t(b)], y + b * D});
    }
    run_experts(jobs, xs);
    if (kept)
      for (int64_t i = 0; i < n_mine; ++i) where[slot[size_t(i)]] = i;
    else
      for_rows(
          n_mine, [&](int64_t i) { std::copy_n(y + i * D, D, &slots[slot[size_t(i)] * D]); },
          kCopyRows);
  };

  ExpertExchange& ex = stage ? all_here : *opt.parallel.experts;
  // With every expert here the routed outputs stay where the experts wrote them (slot s of row i
  // is row where[i·k + s] of them); else in [N, k, D] slots, zeroed for the other ranks' experts.
  const bool local = ex.all_local() && e_begin == 0 && e_end == E;
  float* const expert_out = arena_array<float>(arena, size_t(N * k * D));
  int64_t* const where = local ? arena_array<int64_t>(arena, size_t(N * k)) : nullptr;
  if (local) {
    routed(v, N, ids.data(), weights.data(), nullptr, expert_out, where);
  } else {
    std::fill_n(expert_out, N * k * D, 0.0f);
    const ExpertExchange::Rows mine{v, ids.data(), weights.data(), N, expert_out};
    const ExpertExchange::Rows rows = ex.dispatch(mine, k, D);
    routed(rows.x, rows.n, rows.ids, rows.weights, rows.slots, nullptr, nullptr);
    ex.combine(mine, k, D);
  }
  // Shared expert on every row.
  float* const shared = arena_array<float>(arena, size_t(N * D));
  {
    DI_REGION("moe.shared");
    const ExpertJob job{&P.shared, nullptr, N, nullptr, shared};
    run_experts({&job, 1}, v);
  }
  // Combine (§8.3): fp32, ascending expert id, shared last, one rounding.
  for_rows(
      N,
      [&](int64_t i) {
        thread_local std::vector<const float*> slot_row;  // reused: no allocation once sized
        slot_row.resize(size_t(k));
        for (int64_t j = 0; j < k; ++j)
          slot_row[size_t(j)] = expert_out + (local ? where[i * k + j] : i * k + j) * D;
        for (int64_t d = 0; d < D; ++d) {
          float acc = 0;
          for (int64_t j = 0; j < k; ++j) acc += slot_row[size_t(j)][d];
          out[i * D + d] = acc + shared[i * D + d];
        }
        round(out + i * D, D);
      },
      kCopyRows);
}

}  // namespace deepinfer
