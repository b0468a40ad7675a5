// CSA2 attention of one layer (V41_SPEC.md §5, §12): query path, window KV, sparse attention over
// the window and the selected compressed rows, output projection. The compressor and the indexer
// live in compressor.cpp and indexer.cpp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/region_timer.h"
#include "kernels/attention.h"
#include "kernels/linear.h"
#include "kernels/quant.h"
#include "kv/kv_cache.h"
#include "model/model_impl.h"

namespace deepinfer {

void Model::Impl::attention(int l, Step& st, const float* u, float* out) {
  ArenaScope scope(arena);
  const LayerWeights& W = ck.layers[size_t(l)];
  const LayerRole& role = roles[size_t(l)];
  const RopeTable& rope = role.ratio > 0 ? rope_compressed : rope_window;
  const int64_t N = st.N, H = c.n_heads, Dh = c.head_dim;
  const int64_t Q = c.q_lora_rank, Wn = c.window_size;

  // --- query (§5.1) and window KV (§5.2) ---
  ArenaVec<float> qr(size_t(N * Q), &arena), q(size_t(N * H * Dh), &arena);
  const int64_t wrow = window_kv_row_bytes(Dh);
  ArenaVec<float> kv(size_t(N * Dh), &arena);
  ArenaVec<uint8_t> kv_packed(size_t(N * wrow), &arena);
  query(l, st, rope, u, qr.data(), q.data());
  window_keys(l, st, rope, u, kv.data(), kv_packed.data());

  // --- compressor and indexer (§5.3-§6) ---
  if (role.kv_source) {
    DI_REGION("attn.compressor");
    compressor(l, st, u);
  }
  if (role.index_source) {
    DI_REGION("attn.indexer");
    indexer(l, st, u, qr.data());
  }

  // --- sparse attention (§5.5, §5.6, §12.2) ---
  ArenaVec<float> o(size_t(N * H * Dh), &arena);
  {
    DI_REGION("attn.sparse");
    const float scale = float(std::pow(double(Dh), -0.5));
    const int64_t K = c.index_topk;
    ContextShard& cx = *opt.parallel.context;
    cx.begin_attention(N, H, Dh);
    // Each sequence's window keys in position order (ring entries for [ws, s0), then the
    // chunk's rows), one after the other in win; then every query row on its own, spread over
    // the pool (a row's result does not depend on which thread computes it).
    const size_t n_seqs = st.batch->seqs.size();
    ArenaVec<int64_t> win_at(n_seqs + 1, 0, &arena), items(&arena);  // items: (seq, row)
    items.reserve(size_t(N));
    for (size_t s = 0; s < n_seqs; ++s) {
      const ForwardSeq& sq = st.batch->seqs[s];
      const int64_t s0 = sq.start_pos, ws = std::max<int64_t>(0, s0 - Wn + 1);
      win_at[s + 1] = win_at[s] + (s0 - ws + sq.n_tokens) * Dh;
      for (int64_t i = 0; i < sq.n_tokens; ++i) items.push_back(int64_t(s) << 32 | i);
    }
    ArenaVec<float> win(static_cast<size_t>(win_at[n_seqs]), &arena);
    for (size_t s = 0; s < n_seqs; ++s) {
      const ForwardSeq& sq = st.batch->seqs[s];
      const int64_t r0 = st.row0[s], s0 = sq.start_pos, T = sq.n_tokens;
      const int64_t ws = std::max<int64_t>(0, s0 - Wn + 1);
      float* w = &win[size_t(win_at[s])];
      for (int64_t p = ws; p < s0; ++p) {
        const uint8_t* e = st.kv->window_slot(l, sq.kv.slot, p % Wn);
        fp8_dequant(e, e + Dh, Dh, w + (p - ws) * Dh);
      }
      std::copy(&kv[size_t(r0 * Dh)], &kv[size_t((r0 + T) * Dh)], w + (s0 - ws) * Dh);
    }
    for_rows(int64_t(items.size()), [&](int64_t k) {
      thread_local std::vector<float> t_keys;  // reused: no allocation once large enough
      const size_t s = size_t(items[size_t(k)] >> 32);
      const int64_t i = items[size_t(k)] & 0xffffffff;
      const ForwardSeq& sq = st.batch->seqs[s];
      const int64_t s0 = sq.start_pos, ws = std::max<int64_t>(0, s0 - Wn + 1);
      const int64_t row = st.row0[s] + i, p = s0 + i;
      const int64_t first = std::max<int64_t>(0, p - Wn + 1);
      // One rank takes the window, every rank the listed compressed rows it holds.
      const int64_t nw = cx.attends_window() ? p - first + 1 : 0;
      const int64_t nc = role.ratio > 0 ? st.topk_n[size_t(row)] : 0;
      if (t_keys.size() < size_t((nw + nc) * Dh)) t_keys.resize(size_t((nw + nc) * Dh));
      const float* w = &win[size_t(win_at[s])];
      if (nw) std::copy(w + (first - ws) * Dh, w + (p - ws + 1) * Dh, t_keys.begin());
      int64_t nk = nw;
      for (int64_t j = 0; j < nc; ++j) {
        const int32_t cr = st.topk[size_t(row * K + j)];
        if (!owns_row(st, role.kv_from, cr)) continue;
        const uint8_t* e = st.kv->cmp_row(role.kv_from, sq.kv, cr);
        fp4c_dequant(e, e + Dh / 2, Dh, &t_keys[size_t(nk++ * Dh)]);
      }
      cx.attend(row, {&q[size_t(row * H * Dh)], t_keys.data(), nk, W.attn_sink.f32(), H, Dh, scale,
                      bf16, exact, &o[size_t(row * H * Dh)]});
    });
    for (size_t s = 0; s < n_seqs; ++s) {
      const ForwardSeq& sq = st.batch->seqs[s];
      const int64_t r0 = st.row0[s], s0 = sq.start_pos;
      const int64_t real = st.real_rows(s);
      // Snapshots (prefix caching), before the ring moves on: entries of positions before the
      // chunk from the ring, the chunk's own from its rows, each at its ring index.
      for (const WindowSave& w : st.batch->saves) {
        if (size_t(w.seq) != s) continue;
        for (int64_t p = std::max<int64_t>(0, w.boundary - Wn); p < w.boundary; ++p)
          std::copy_n(p >= s0 ? &kv_packed[size_t((r0 + p - s0) * wrow)]
                              : st.kv->window_slot(l, sq.kv.slot, p % Wn),
                      wrow, st.kv->snapshot_window(l, w.snap, p % Wn));
      }
      // Ring update after every query of the chunk has read it (§12.2): real rows only.
      for (int64_t i = std::max<int64_t>(0, real - Wn); i < real; ++i)
        std::copy_n(&kv_packed[size_t((r0 + i) * wrow)], wrow,
                    st.kv->window_slot(l, sq.kv.slot, (s0 + i) % Wn));
    }
    cx.end_attention(W.attn_sink.f32(), exact, o.data());
    round(o.data(), N * H * Dh);
  }
  dump(st, l, "attn.o", o.data(), {N, H, Dh});

  output(l, st, rope, o.data(), out);
}

void Model::Impl::query(int l, Step& st, const RopeTable& rope, const float* u, float* qr,
                        float* q) {
  DI_REGION("attn.q");
  const LayerWeights& W = weights(l);
  const PreparedLayer& P = lin[size_t(l)];
  const int64_t N = st.N;
  project(P.wq_a, u, N, qr, &W.q_norm);
  project(P.wq_b, qr, N, q);
  rope_rows(st, rope, q, c.n_heads, c.head_dim);
  dump(st, l, "attn.q", q, {N, c.n_heads, c.head_dim});
}

void Model::Impl::window_keys(int l, Step& st, const RopeTable& rope, const float* u, float* kv,
                              uint8_t* packed) {
  DI_REGION("attn.kv");
  const LayerWeights& W = weights(l);
  const int64_t N = st.N, Dh = c.head_dim, wrow = window_kv_row_bytes(Dh);
  project(lin[size_t(l)].wkv, u, N, kv, &W.kv_norm);
  rope_rows(st, rope, kv, 1, Dh);
  for (int64_t i = 0; i < N; ++i) {
    uint8_t* pk = packed + i * wrow;
    act_quant(kv + i * Dh, Dh, pk, pk + Dh);
    fp8_dequant(pk, pk + Dh, Dh, kv + i * Dh);
  }
  dump(st, l, "attn.kv", kv, {N, Dh});
}

void Model::Impl::output(int l, Step& st, const RopeTable& rope, float* o, float* out) {
  DI_REGION("attn.out");
  ArenaScope scope(arena);
  const PreparedLayer& P = lin[size_t(l)];
  const int64_t N = st.N, H = c.n_heads, Dh = c.head_dim, G = c.o_groups, Ro = c.o_lora_rank;
  rope_rows(st, rope, o, H, Dh, true);
  ArenaVec<float> a(size_t(N * G * Ro), &arena);
  const int64_t group_in = H * Dh / G;
  for (int64_t g = 0; g < G; ++g)
    linear(P.wo_a, {o + g * group_in, N, H * Dh, a.data() + g * Ro, G * Ro, g * Ro, Ro, exact});
  round(a.data(), N * G * Ro);
  project(P.wo_b, a.data(), N, out);
  dump(st, l, "attn.out", out, {N, c.dim});
}

}  // namespace deepinfer
