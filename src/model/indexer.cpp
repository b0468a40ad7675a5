// The indexer of an index source (V41_SPEC.md §6, §12.4): scores every visible compressed row
// for each query, applies the candidate-block filter, and publishes the top-k list that this
// layer and the consumers after it attend to.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/indexer.h"
#include "kernels/linear.h"
#include "kernels/quant.h"
#include "kernels/rope.h"
#include "model/model_impl.h"

namespace deepinfer {

void Model::Impl::indexer(int l, Step& st, const float* u, const float* qr) {
  const LayerWeights& W = ck.layers[size_t(l)];
  const LayerRole& role = roles[size_t(l)];
  const int64_t N = st.N, Hi = c.index_n_heads, Di = c.index_head_dim, R = c.rope_head_dim;
  const int64_t K = c.index_topk, r = role.ratio;
  const std::string L = "L" + std::to_string(l) + ".";
  std::vector<float> cs(static_cast<size_t>(R));

  // Queries (§6.2): QLin, RoPE per head, fp4-I.
  std::vector<float> qi(size_t(N * Hi * Di)), w(size_t(N * Hi));
  linear_quant(W.idx_wq_b, qr, N, qi.data(), exact);
  round(qi.data(), N * Hi * Di);
  for (int64_t i = 0; i < N; ++i) {
    rope_angles(rope_compressed, st.pos[size_t(i)], cs.data());
    for (int64_t h = 0; h < Hi; ++h)
      rope_rotate(&qi[size_t(i * Hi * Di + h * Di + Di - R)], cs.data(), R, false);
  }
  round(qi.data(), N * Hi * Di);
  for (int64_t i = 0; i < N; ++i) fp4i_qdq(&qi[size_t(i * Hi * Di)], Hi * Di);
  // Head weights: bf16 linear, then the fp32 constant Di^-1/2 * Hi^-1/2.
  linear_dense(W.idx_weights_proj, u, N, w.data(), exact);
  round(w.data(), N * Hi);
  const float wscale = float(std::pow(double(Di), -0.5) * std::pow(double(Hi), -0.5));
  for (auto& v : w) v *= wscale;
  round(w.data(), N * Hi);

  st.topk.resize(size_t(N * K));
  st.topk_n.assign(size_t(N), 0);
  st.topk_width.assign(size_t(N), 0);
  if (role.candidate_source) {
    st.cand.assign(size_t(N * c.candidate_topk_blocks), 0);
    st.cand_n.assign(size_t(N), -1);
  }
  std::vector<float> keys, scores;
  std::vector<uint8_t> mask;
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
    keys.resize(size_t(T * Di));
    for (int64_t t = 0; t < T; ++t) {
      const uint8_t* e = st.kv->idx_row(keys_layer, sq.kv, t);
      fp4i_dequant(e, e + Di / 2, Di, &keys[size_t(t * Di)]);
    }
    scores.resize(static_cast<size_t>(T));
    mask.resize(static_cast<size_t>(T));
    for (int64_t i = 0; i < sq.n_tokens; ++i) {
      const int64_t row = r0 + i, p = s0 + i;
      const int64_t visible = std::min(T, (p + 1) / r);
      IndexerScoreArgs a{&qi[size_t(row * Hi * Di)],
                         &w[size_t(row * Hi)],
                         keys.data(),
                         T,
                         visible,
                         Hi,
                         Di,
                         bf16,
                         exact,
                         scores.data()};
      indexer_scores(a);
      const int64_t Ck = c.candidate_topk_blocks, Cb = c.candidate_block_size;
      if (role.candidate_source) {
        candidate_mask(scores.data(), T, visible, Cb, Ck, mask.data());
        int32_t n = 0;
        for (int64_t b = 0; b * Cb < T; ++b)
          if (mask[size_t(b * Cb)]) st.cand[size_t(row * Ck + n++)] = int32_t(b);
        st.cand_n[size_t(row)] = n;
      } else if (role.candidate_consumer && !st.cand_n.empty() && st.cand_n[size_t(row)] >= 0) {
        std::fill(mask.begin(), mask.end(), uint8_t(0));
        for (int32_t j = 0; j < st.cand_n[size_t(row)]; ++j) {
          const int64_t b = st.cand[size_t(row * Ck + j)];
          for (int64_t t = b * Cb; t < std::min(T, (b + 1) * Cb); ++t) mask[size_t(t)] = 1;
        }
        for (int64_t t = 0; t < T; ++t)
          if (!mask[size_t(t)]) scores[size_t(t)] = -INFINITY;
      }
      st.topk_n[size_t(row)] =
          int32_t(topk_rows(scores.data(), visible, K, &st.topk[size_t(row * K)]));
      st.topk_width[size_t(row)] = int32_t(std::min(K, T));
    }
  }
  if (st.dump) {
    int64_t width = 0;
    for (int64_t i = 0; i < N; ++i) width = std::max<int64_t>(width, st.topk_width[size_t(i)]);
    std::vector<int32_t> list(size_t(N * width), -1);
    for (int64_t i = 0; i < N; ++i)
      for (int32_t j = 0; j < st.topk_n[size_t(i)]; ++j)
        list[size_t(i * width + j)] = st.topk[size_t(i * K + j)];
    dump_i32(st, L + "attn.topk", list.data(), {N, width});
  }
}

}  // namespace deepinfer
