// The indexer of an index source (V41_SPEC.md §6, §12.4): scores every visible compressed row
// for each query, applies the candidate-block filter, and publishes the top-k list that this
// layer and the consumers after it attend to.
#include <algorithm>
#include <cmath>

#include "kernels/indexer.h"
#include "kernels/linear.h"
#include "kernels/quant.h"
#include "model/model_impl.h"

namespace deepinfer {

void Model::Impl::indexer(int l, Step& st, const float* u, const float* qr) {
  ArenaScope scope(arena);
  const PreparedLayer& P = lin[size_t(l)];
  const LayerRole& role = roles[size_t(l)];
  const int64_t N = st.N, Hi = c.index_n_heads, Di = c.index_head_dim;
  const int64_t K = c.index_topk, r = role.ratio;

  // Queries (§6.2): QLin, RoPE per head, fp4-I.
  ArenaVec<float> qi(size_t(N * Hi * Di), &arena), w(size_t(N * Hi), &arena);
  project(P.idx_wq_b, qr, N, qi.data());
  rope_rows(st, rope_compressed, qi.data(), Hi, Di);
  for (int64_t i = 0; i < N; ++i) fp4i_qdq(&qi[size_t(i * Hi * Di)], Hi * Di);
  // Head weights: bf16 linear, then the fp32 constant Di^-1/2 * Hi^-1/2.
  project(P.idx_weights_proj, u, N, w.data());
  const float wscale = float(std::pow(double(Di), -0.5) * std::pow(double(Hi), -0.5));
  for (auto& v : w) v *= wscale;
  round(w.data(), N * Hi);

  st.topk.resize(size_t(N * K));
  st.topk_n.assign(size_t(N), 0);
  if (role.candidate_source) {
    st.cand.assign(size_t(N * c.candidate_topk_blocks), 0);
    st.cand_n.assign(size_t(N), -1);
  }
  const int64_t Ck = c.candidate_topk_blocks, Cb = c.candidate_block_size;
  // This rank's candidates: per row the best compressed rows it holds and, at the candidate
  // source, the best candidate blocks it holds ((-inf, max) padding). They are merged over the
  // context-parallel group below; a single rank merges its own lists with the same code.
  const ScoredId pad{-INFINITY, INT32_MAX};
  ArenaVec<ScoredId> top_local(size_t(N * K), pad, &arena), blk_local(&arena), work(&arena);
  if (role.candidate_source) blk_local.assign(size_t(N * Ck), pad);
  ArenaVec<int64_t> rows_of_seq(static_cast<size_t>(N), 0, &arena);  // T of each row's sequence
  ArenaVec<int64_t> own(&arena);  // rows of the sequence this rank holds, ascending
  ArenaVec<float> keys(&arena), scores(&arena);
  ArenaVec<uint8_t> kept(&arena);
  for (size_t s = 0; s < st.batch->seqs.size(); ++s) {
    const ForwardSeq& sq = st.batch->seqs[s];
    const int64_t r0 = st.row0[s], s0 = sq.start_pos;
    const int64_t T = (s0 + st.real_rows(s)) / r;  // rows that exist after this call's groups
    if (T == 0) continue;                          // §6.7: nothing to select
    // Which keys this layer scores: its KV source's (prefill semantics, §6.8), or, reproducing
    // the demo's decode path, whichever key owner last published keys.
    int keys_layer = role.keys_from;
    const bool decode = sq.n_tokens == 1 && sq.n_padding == 0 && s0 > 0;
    if (opt.demo_decode_defect && decode && st.kv->last_key_layer(sq.kv.slot) >= 0)
      keys_layer = st.kv->last_key_layer(sq.kv.slot);
    own.clear();
    for (int64_t t = 0; t < T; ++t)
      if (owns_row(st, keys_layer, t)) own.push_back(t);
    const int64_t n_own = int64_t(own.size());
    keys.resize(size_t(n_own * Di));
    for (int64_t k = 0; k < n_own; ++k) {
      const uint8_t* e = st.kv->idx_row(keys_layer, sq.kv, own[size_t(k)]);
      fp4i_dequant(e, e + Di / 2, Di, &keys[size_t(k * Di)]);
    }
    scores.resize(static_cast<size_t>(n_own));
    work.resize(size_t(std::max<int64_t>(n_own, 1)));
    for (int64_t i = 0; i < sq.n_tokens; ++i) {
      const int64_t row = r0 + i, p = s0 + i;
      rows_of_seq[size_t(row)] = T;
      const int64_t visible = std::min(T, (p + 1) / r);
      const int64_t vis_own =
          std::lower_bound(own.begin(), own.end(), visible) - own.begin();  // held and visible
      indexer_scores({&qi[size_t(row * Hi * Di)], &w[size_t(row * Hi)], keys.data(), n_own, vis_own,
                      Hi, Di, bf16, exact, scores.data()});
      if (role.candidate_source) {
        // Block scores (max over the block; held rows come in whole blocks), the block of the
        // newest visible row forced in, the best Ck finite ones.
        int64_t nb = 0;
        for (int64_t k = 0; k < n_own;) {
          const int32_t b = int32_t(own[size_t(k)] / Cb);
          float bs = -INFINITY;
          for (; k < n_own && own[size_t(k)] / Cb == b; ++k) bs = std::max(bs, scores[size_t(k)]);
          if (visible > 0 && b == (visible - 1) / Cb) bs = INFINITY;
          work[size_t(nb++)] = {bs, b};
        }
        select_top(work.data(), nb, Ck, &blk_local[size_t(row * Ck)]);
      } else if (role.candidate_consumer && !st.cand_n.empty() && st.cand_n[size_t(row)] >= 0) {
        kept.assign(size_t((T + Cb - 1) / Cb), 0);
        for (int32_t j = 0; j < st.cand_n[size_t(row)]; ++j)
          kept[size_t(st.cand[size_t(row * Ck + j)])] = 1;
        for (int64_t k = 0; k < n_own; ++k)
          if (!kept[size_t(own[size_t(k)] / Cb)]) scores[size_t(k)] = -INFINITY;
      }
      for (int64_t k = 0; k < vis_own; ++k)
        work[size_t(k)] = {scores[size_t(k)], int32_t(own[size_t(k)])};
      select_top(work.data(), vis_own, K, &top_local[size_t(row * K)]);
    }
  }
  // Merge over the context-parallel group: the global best are among the ranks' local best.
  auto merge = [&](ArenaVec<ScoredId>& local, int64_t width, auto&& store) {
    ContextShard& cx = *opt.parallel.context;
    const int n_parts = cx.parts();
    ArenaVec<ScoredId> all(size_t(n_parts) * local.size(), &arena);
    cx.all_gather(local.data(), local.size() * sizeof(ScoredId), all.data());
    ArenaVec<ScoredId> cand(size_t(n_parts * width), &arena), best(size_t(n_parts * width), &arena);
    for (int64_t i = 0; i < N; ++i) {
      for (int pr = 0; pr < n_parts; ++pr)
        std::copy_n(&all[size_t((int64_t(pr) * N + i) * width)], width, &cand[size_t(pr * width)]);
      const int64_t n = select_top(cand.data(), n_parts * width, width, best.data());
      std::sort(best.begin(), best.begin() + n,
                [](const ScoredId& x, const ScoredId& y) { return x.id < y.id; });
      store(i, best.data(), n);
    }
  };
  if (role.candidate_source)
    merge(blk_local, Ck, [&](int64_t i, const ScoredId* b, int64_t n) {
      st.cand_n[size_t(i)] = rows_of_seq[size_t(i)] > 0 ? int32_t(n) : -1;
      for (int64_t j = 0; j < n; ++j) st.cand[size_t(i * Ck + j)] = b[j].id;
    });
  merge(top_local, K, [&](int64_t i, const ScoredId* b, int64_t n) {
    st.topk_n[size_t(i)] = int32_t(n);
    for (int64_t j = 0; j < n; ++j) st.topk[size_t(i * K + j)] = b[j].id;
  });
  if (st.dump) {
    int64_t width = 0;
    for (int64_t i = 0; i < N; ++i) width = std::max(width, std::min(K, rows_of_seq[size_t(i)]));
    ArenaVec<int32_t> list(size_t(N * width), -1, &arena);
    for (int64_t i = 0; i < N; ++i)
      for (int32_t j = 0; j < st.topk_n[size_t(i)]; ++j)
        list[size_t(i * width + j)] = st.topk[size_t(i * K + j)];
    dump(st, l, "attn.topk", list.data(), {N, width});
  }
}

}  // namespace deepinfer
