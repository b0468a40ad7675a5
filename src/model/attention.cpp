// CSA2 attention of one layer (V41_SPEC.md §5, §6, §12): query path, window KV, the compressor of
// a KV source, the indexer of an index source, sparse attention over the window and the selected
// compressed rows, output projection.
#include <algorithm>
#include <cmath>

#include "core/region_timer.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/indexer.h"
#include "kernels/quant.h"
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
  // (Written in full by the projections: not zeroed.)
  float* qr = arena_array<float>(arena, size_t(N * Q));
  float* q = arena_array<float>(arena, size_t(N * H * Dh));
  float* kv = arena_array<float>(arena, size_t(N * Dh));
  const int64_t wrow = window_kv_row_bytes(Dh);
  ArenaVec<uint8_t> kv_packed(size_t(N * wrow), &arena);
  query(l, st, rope, u, qr, q);
  window_keys(l, st, rope, u, kv, kv_packed.data());

  // --- compressor and indexer (§5.3-§6) ---
  if (role.kv_source) compressor(l, st, u);
  if (role.index_source) indexer(l, st, u, qr);

  // --- sparse attention (§5.5, §5.6, §12.2) ---
  float* o = arena_array<float>(arena, size_t(N * H * Dh));  // every row written by attend()
  {
    DI_REGION("attn.sparse");
    const float scale = float(std::pow(double(Dh), -0.5));
    const int64_t K = c.index_topk;
    ContextShard& cx = *opt.parallel.context;
    cx.begin_attention(N, H, Dh);
    // Each sequence's window keys in position order (ring entries for [ws, s0), then the
    // chunk's rows), one after the other in win, row by row over the pool; then every query row
    // on its own, spread over the pool (a row's result does not depend on which thread computes
    // it).
    const size_t n_seqs = st.batch->seqs.size();
    // Window positions [first_pos(p), p] reach the position p.
    auto first_pos = [&](int64_t p) { return std::max<int64_t>(0, p - Wn + 1); };
    ArenaVec<int64_t> win_at(n_seqs + 1, 0, &arena);
    for (size_t s = 0; s < n_seqs; ++s) {
      const ForwardSeq& sq = st.batch->seqs[s];
      win_at[s + 1] = win_at[s] + (sq.start_pos - first_pos(sq.start_pos) + sq.n_tokens) * Dh;
    }
    // Where the attention runs on AMX tiles the keys go to it as bf16 (half the bytes, no
    // conversion there): the window's once per sequence, each compressed row as it is gathered.
    // A sequence or row with a value the tiles do not take exactly goes as fp32.
    const bool k16 = !exact && attention_bf16_keys(bf16);
    const int64_t n_wrows = win_at[n_seqs] / Dh;
    float* const win = arena_array<float>(arena, size_t(win_at[n_seqs]));  // written in full
    uint16_t* const win16 = k16 ? arena_array<uint16_t>(arena, size_t(win_at[n_seqs])) : nullptr;
    uint8_t* const wrow_ok = arena_array<uint8_t>(arena, size_t(n_wrows));
    for_rows(
        n_wrows,
        [&](int64_t r) {
          const size_t s = size_t(std::upper_bound(win_at.begin(), win_at.end(), r * Dh) -
                                  win_at.begin() - 1);  // the row's sequence
          const ForwardSeq& sq = st.batch->seqs[s];
          const int64_t s0 = sq.start_pos, p = first_pos(s0) + r - win_at[s] / Dh;
          float* w = win + r * Dh;
          if (p < s0) {
            const uint8_t* e = st.kv->window_slot(l, sq.kv.slot, p % Wn);
            fp8_dequant(e, e + Dh, Dh, w);
          } else {
            std::copy_n(&kv[size_t((st.row0[s] + p - s0) * Dh)], Dh, w);
          }
          if (k16) wrow_ok[r] = attention_keys_to_bf16(w, Dh, win16 + r * Dh);
        },
        8);
    ArenaVec<uint8_t> win16_ok(n_seqs, 0, &arena);
    for (size_t s = 0; k16 && s < n_seqs; ++s)
      win16_ok[s] = std::all_of(wrow_ok + win_at[s] / Dh, wrow_ok + win_at[s + 1] / Dh,
                                [](uint8_t ok) { return ok != 0; });
    // With several queries of a sequence in the step (a prefill), the compressed rows their
    // lists name are decoded to bf16 once, into `cmp16` (slot cmp_slot[cmp_at[s] + row] of
    // sequence s, -1 for rows no list names; cmp_ok: exact as bf16), instead of once per query
    // that lists them.
    const bool shared_rows = k16 && role.ratio > 0 && N > int64_t(n_seqs);
    ArenaVec<int64_t> cmp_at(shared_rows ? n_seqs + 1 : 0, 0, &arena);
    for (size_t s = 0; shared_rows && s < n_seqs; ++s) {
      int64_t rows = 0;
      for (int64_t i = st.row0[s]; i < st.row0[s] + st.batch->seqs[s].n_tokens; ++i)
        for (int64_t j = 0; j < st.topk_n[size_t(i)]; ++j)
          rows = std::max<int64_t>(rows, st.topk[size_t(i * K + j)] + 1);
      cmp_at[s + 1] = cmp_at[s] + rows;
    }
    int32_t* const cmp_slot = arena_array<int32_t>(arena, size_t(shared_rows ? cmp_at.back() : 0));
    std::fill_n(cmp_slot, shared_rows ? cmp_at.back() : 0, -1);
    ArenaVec<int64_t> slot_row(&arena);  // per slot: its sequence's offset plus its row
    slot_row.reserve(size_t(shared_rows ? cmp_at.back() : 0));
    for (size_t s = 0; shared_rows && s < n_seqs; ++s)
      for (int64_t i = st.row0[s]; i < st.row0[s] + st.batch->seqs[s].n_tokens; ++i)
        for (int64_t j = 0; j < st.topk_n[size_t(i)]; ++j) {
          const int32_t cr = st.topk[size_t(i * K + j)];
          int32_t& slot = cmp_slot[cmp_at[s] + cr];
          if (slot >= 0 || !owns_row(st, role.kv_from, cr)) continue;
          slot = int32_t(slot_row.size());
          slot_row.push_back(cmp_at[s] + cr);
        }
    const int64_t n_slots = int64_t(slot_row.size());
    uint16_t* const cmp16 = arena_array<uint16_t>(arena, size_t(n_slots * Dh));
    uint8_t* const cmp_ok = arena_array<uint8_t>(arena, size_t(n_slots));
    for_rows(
        n_slots,
        [&](int64_t slot) {
          thread_local std::vector<float> t_dec;  // reused: no allocation once large enough
          t_dec.resize(size_t(Dh));
          const int64_t at = slot_row[size_t(slot)];
          const size_t s =
              size_t(std::upper_bound(cmp_at.begin(), cmp_at.end(), at) - cmp_at.begin() - 1);
          const uint8_t* e = st.kv->cmp_row(role.kv_from, st.batch->seqs[s].kv, at - cmp_at[s]);
          fp4c_dequant(e, e + Dh / 2, Dh, t_dec.data());
          cmp_ok[slot] = attention_keys_to_bf16(t_dec.data(), Dh, cmp16 + slot * Dh);
        },
        8);
    // The window's rows and the compressed slots in pairs of consecutive rows, both alignments
    // (pairs[par] pair p: rows 2p + par and 2p + par + 1), for the tiles' value products
    // (SparseAttnArgs::key_pairs). Each array ends in two unused pairs, so that pairs of two
    // arrays never look like one run.
    auto pairs_of = [&](const uint16_t* rows, int64_t n, uint16_t** pairs) {
      for (int par = 0; par < 2; ++par) {
        const int64_t np = std::max<int64_t>(0, (n - par) / 2);
        pairs[par] = arena_array<uint16_t>(arena, size_t((np + 2) * 2 * Dh));
        for_rows((np + 15) / 16,
                 [&](int64_t b) {
                   const int64_t p0 = b * 16, m = std::min<int64_t>(16, np - p0);
                   pair_key_rows(rows + (2 * p0 + par) * Dh, m, Dh, pairs[par] + p0 * 2 * Dh);
                 },
                 1);
      }
    };
    // (Only where several queries of a sequence share the rows: a prefill.)
    const bool paired = k16 && N > int64_t(n_seqs) && attention_key_pairs(bf16);
    uint16_t* win_pairs[2] = {};
    uint16_t* cmp_pairs[2] = {};
    if (paired) pairs_of(win16, n_wrows, win_pairs);
    if (paired && shared_rows) pairs_of(cmp16, n_slots, cmp_pairs);
    // The pair that starts at row r of `pairs`.
    auto pair_at = [&](uint16_t* const* pairs, int64_t r) -> const uint16_t* {
      return pairs[r & 1] + (r >> 1) * 2 * Dh;
    };
    for_rows(N, [&](int64_t row) {
      // Reused: no allocation once large enough.
      thread_local std::vector<float> t_keys, t_row;
      thread_local std::vector<uint16_t> t_keys16;
      thread_local std::vector<const uint16_t*> t_ptrs, t_pairs;
      const size_t s = size_t(std::upper_bound(st.row0.begin(), st.row0.end(), row) -
                              st.row0.begin() - 1);  // the row's sequence
      const ForwardSeq& sq = st.batch->seqs[s];
      const int64_t p = st.pos[size_t(row)], ws = first_pos(sq.start_pos), first = first_pos(p);
      // One rank takes the window, every rank the listed compressed rows it holds.
      const int64_t nw = cx.attends_window() ? p - first + 1 : 0;
      const int64_t nc = role.ratio > 0 ? st.topk_n[size_t(row)] : 0;
      // The row's keys into `keys` from the window `w` of its sequence, then each listed
      // compressed row it holds through put(row, destination); -1 when put fails.
      auto gather = [&](auto* keys, const auto* w, auto&& put) -> int64_t {
        if (nw) std::copy(w + (first - ws) * Dh, w + (p - ws + 1) * Dh, keys);
        int64_t nk = nw;
        for (int64_t j = 0; j < nc; ++j) {
          const int32_t cr = st.topk[size_t(row * K + j)];
          if (!owns_row(st, role.kv_from, cr)) continue;
          if (!put(cr, keys + nk++ * Dh)) return -1;
        }
        return nk;
      };
      auto entry = [&](int32_t cr) { return st.kv->cmp_row(role.kv_from, sq.kv, cr); };
      SparseAttnArgs a{
          &q[size_t(row * H * Dh)], nullptr, -1, W.attn_sink.f32(), H, Dh, scale, bf16, exact,
          o + row * H * Dh};
      if (k16 && win16_ok[s] && (nc == 0 || shared_rows)) {
        // The keys by pointer (the tiles read runs of them in place): the window's rows, then the
        // listed compressed rows this rank holds.
        if (t_ptrs.size() < size_t(nw + nc)) t_ptrs.resize(size_t(nw + nc));
        if (t_pairs.size() < size_t(nw + nc)) t_pairs.resize(size_t(nw + nc));
        int64_t nk = 0;
        for (int64_t t = 0; t < nw; ++t, ++nk) {
          const int64_t r = win_at[s] / Dh + first - ws + t;  // its row of win16
          t_ptrs[size_t(nk)] = win16 + r * Dh;
          if (paired) t_pairs[size_t(nk)] = pair_at(win_pairs, r);
        }
        bool ok = true;
        for (int64_t j = 0; j < nc && ok; ++j) {
          const int32_t cr = st.topk[size_t(row * K + j)];
          if (!owns_row(st, role.kv_from, cr)) continue;
          const int32_t slot = cmp_slot[cmp_at[s] + cr];
          ok = cmp_ok[slot] != 0;
          t_ptrs[size_t(nk)] = cmp16 + slot * Dh;
          if (paired) t_pairs[size_t(nk)] = pair_at(cmp_pairs, slot);
          ++nk;
        }
        if (ok) {
          a.key_rows = t_ptrs.data();
          a.key_pairs = paired ? t_pairs.data() : nullptr;
          a.nk = nk;
        }
      }
      if (k16 && win16_ok[s] && a.nk < 0) {
        if (t_keys16.size() < size_t((nw + nc) * Dh)) t_keys16.resize(size_t((nw + nc) * Dh));
        t_row.resize(size_t(Dh));
        a.keys_bf16 = t_keys16.data();
        a.nk = gather(t_keys16.data(), win16 + win_at[s], [&](int32_t cr, uint16_t* dst) {
          if (shared_rows) {
            const int32_t slot = cmp_slot[cmp_at[s] + cr];
            std::copy_n(cmp16 + slot * Dh, Dh, dst);
            return cmp_ok[slot] != 0;
          }
          const uint8_t* e = entry(cr);
          fp4c_dequant(e, e + Dh / 2, Dh, t_row.data());
          return attention_keys_to_bf16(t_row.data(), Dh, dst);
        });
      }
      if (a.nk < 0) {  // fp32 keys
        if (t_keys.size() < size_t((nw + nc) * Dh)) t_keys.resize(size_t((nw + nc) * Dh));
        a.keys = t_keys.data();
        a.keys_bf16 = nullptr;
        a.key_rows = nullptr;
        a.key_pairs = nullptr;
        a.nk = gather(t_keys.data(), win + win_at[s], [&](int32_t cr, float* dst) {
          const uint8_t* e = entry(cr);
          fp4c_dequant(e, e + Dh / 2, Dh, dst);
          return true;
        });
      }
      cx.attend(row, a);
      if (!cx.partial()) round(a.out, H * Dh);  // while the row is in cache
    });
    // Ring update after every query of the chunk has read it (§12.2): real rows only.
    for (size_t s = 0; s < n_seqs; ++s)
      advance_ring(l, *st.kv, st.batch->seqs[s].kv.slot, st.batch->seqs[s].start_pos,
                   st.real_rows(s), &kv_packed[size_t(st.row0[s] * wrow)], st.batch->saves,
                   int32_t(s));
    cx.end_attention(W.attn_sink.f32(), exact, o);
    if (cx.partial()) round(o, N * H * Dh);
  }
  dump(st, l, "attn.o", o, {N, H, Dh});

  output(l, st, rope, o, out);
}

void Model::Impl::advance_ring(int l, KvCache& kv, int32_t slot, int64_t s0, int64_t n,
                               const uint8_t* rows, std::span<const WindowSave> saves,
                               int32_t seq) {
  const int64_t Wn = c.window_size, wrow = window_kv_row_bytes(c.head_dim);
  // Snapshots (prefix caching), before the ring moves on: entries of positions before s0 from
  // the ring, the rows' own from the rows, each at its ring index.
  for (const WindowSave& w : saves) {
    if (w.seq != seq || w.boundary > s0 + n) continue;
    for (int64_t p = std::max<int64_t>(0, w.boundary - Wn); p < w.boundary; ++p)
      std::copy_n(p >= s0 ? rows + (p - s0) * wrow : kv.window_slot(l, slot, p % Wn), wrow,
                  kv.snapshot_window(l, w.snap, p % Wn));
  }
  for (int64_t i = std::max<int64_t>(0, n - Wn); i < n; ++i)
    std::copy_n(rows + i * wrow, wrow, kv.window_slot(l, slot, (s0 + i) % Wn));
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
  for_rows(N, [&](int64_t i) {
    uint8_t* pk = packed + i * wrow;
    act_quant(kv + i * Dh, Dh, pk, pk + Dh);
    fp8_dequant(pk, pk + Dh, Dh, kv + i * Dh);
  });
  dump(st, l, "attn.kv", kv, {N, Dh});
}

void Model::Impl::output(int l, Step& st, const RopeTable& rope, float* o, float* out) {
  DI_REGION("attn.out");
  ArenaScope scope(arena);
  const PreparedLayer& P = lin[size_t(l)];
  const int64_t N = st.N, H = c.n_heads, Dh = c.head_dim, G = c.o_groups, Ro = c.o_lora_rank;
  rope_rows(st, rope, o, H, Dh, true);
  float* a = arena_array<float>(arena, size_t(N * G * Ro));  // written in full by wo_a
  const int64_t group_in = H * Dh / G;
  ArenaVec<LinearCall> calls(&arena);  // group g: its inputs, rows [g·Ro, (g+1)·Ro) of wo_a
  calls.reserve(size_t(G));
  for (int64_t g = 0; g < G; ++g)
    calls.push_back(
        {&P.wo_a, {o + g * group_in, N, H * Dh, a + g * Ro, G * Ro, g * Ro, Ro, exact, bf16}});
  linear_many(calls);
  project(P.wo_b, a, N, out);
  dump(st, l, "attn.out", out, {N, c.dim});
}

// The compressor of a KV source (V41_SPEC.md §5.3, §5.4, §6.1, §12.3): pools each complete group
// of r tokens into a latent, derives the index key from the pre-RoPE latent (key owners), then
// rotates and fp4-quantizes the latent into the compressed-KV cache. Partial groups wait in the
// sequence's carry (fp32) until their last token arrives.
void Model::Impl::compressor(int l, Step& st, const float* u) {
  DI_REGION("attn.compressor");
  ArenaScope scope(arena);
  const LayerWeights& W = ck.layers[size_t(l)];
  const PreparedLayer& P = lin[size_t(l)];
  const LayerRole& role = roles[size_t(l)];
  const int64_t N = st.N, Dh = c.head_dim, R = c.rope_head_dim, Di = c.index_head_dim;
  const int64_t r = role.ratio;

  // Per-token projections. r = 1: the latent itself (bf16 linear, norm). r > 1: fp32 k and gate.
  ArenaVec<float> k(size_t(N * Dh), &arena), g(&arena);
  linear(P.cmp_wkv, u, N, k.data(), exact);
  if (r == 1) {
    round_norm(k.data(), N, Dh, W.cmp_norm);
  } else {
    g.resize(size_t(N * Dh));
    linear(P.cmp_wgate, u, N, g.data(), exact);
  }

  const int64_t cmp_bytes = compressed_kv_row_bytes(Dh), idx_bytes = index_key_row_bytes(Di);
  ArenaVec<float> dump_cmp(&arena), dump_idx(&arena);
  for (size_t s = 0; s < st.batch->seqs.size(); ++s) {
    const ForwardSeq& sq = st.batch->seqs[s];
    const int64_t r0 = st.row0[s], s0 = sq.start_pos, real = st.real_rows(s);
    const int64_t j_begin = s0 / r, j_end = (s0 + real) / r, ng = j_end - j_begin;
    float* carry = r > 1 ? st.kv->carry(l, sq.kv.slot) : nullptr;  // [r, 2, Dh]
    // The groups' latents lat [ng, Dh], index keys [ng, Di] and, for the rows another rank
    // stores, scratch rows; every group on its own over the pool.
    float* lat = arena_array<float>(arena, size_t(ng * Dh));
    float* key = arena_array<float>(arena, size_t(role.key_owner ? ng * Di : 0));
    float* ex = arena_array<float>(arena, size_t(r > 1 ? ng * r * Dh : 0));
    float* cs = arena_array<float>(arena, size_t(ng * R));
    uint8_t* cmp_tmp = arena_array<uint8_t>(arena, size_t(ng * cmp_bytes));
    uint8_t* idx_tmp = arena_array<uint8_t>(arena, size_t(role.key_owner ? ng * idx_bytes : 0));
    for_rows(ng, [&](int64_t q) {
      const int64_t j = j_begin + q;
      float* latent = lat + q * Dh;
      if (r == 1) {
        std::copy_n(&k[size_t((r0 + j - s0) * Dh)], Dh, latent);
        return;
      }
      // Rows of group j: positions j*r .. j*r + r - 1, from the carry when before this call.
      const float* kr[64];
      const float* gr[64];
      DI_CHECK(r <= 64, "compress ratio ", r, " above 64");
      for (int64_t t = 0, p = j * r; t < r; ++t, ++p) {
        kr[t] = p < s0 ? carry + (p % r) * 2 * Dh : &k[size_t((r0 + p - s0) * Dh)];
        gr[t] = p < s0 ? kr[t] + Dh : &g[size_t((r0 + p - s0) * Dh)];
      }
      // Per channel: softmax of the gates over the group's tokens, then the weighted sum.
      // fp32 results at each step; sums over the group in double. e [r, Dh]: the exponentials.
      float* e = ex + q * r * Dh;
      for (int64_t d = 0; d < Dh; ++d) {
        float mx = gr[0][d];
        for (int64_t t = 1; t < r; ++t) mx = std::max(mx, gr[t][d]);
        for (int64_t t = 0; t < r; ++t) e[t * Dh + d] = gr[t][d] - mx;
      }
      exp_f_n(e, r * Dh);
      for (int64_t d = 0; d < Dh; ++d) {
        double sum = 0;
        for (int64_t t = 0; t < r; ++t) sum += e[t * Dh + d];
        const float es = f32(sum);
        double pooled = 0;
        for (int64_t t = 0; t < r; ++t) pooled += double(kr[t][d]) * (e[t * Dh + d] / es);
        latent[d] = f32(pooled);
      }
    });
    if (r > 1) round_norm(lat, ng, Dh, W.cmp_norm);  // cast to bf16 before the norm
    // Index keys from the pre-RoPE latents (§6.1), one projection for all groups.
    if (role.key_owner) project(P.idx_wk, lat, ng, key, &W.idx_k_norm);
    for_rows(ng, [&](int64_t q) {
      const int64_t j = j_begin + q;
      const bool owned = owns_row(st, l, j);
      // The angles of the group's first position, for the index key and the latent.
      float* a = cs + q * R;
      rope_angles(rope_compressed, j * r, a);
      // v [dim] rotated at the group's first position, rounded, encoded into its cache row
      // (every rank computes the row; its context-parallel owner stores it), and for a dump
      // replaced by what the row holds.
      auto rotate_store = [&](float* v, int64_t dim, uint8_t* dst, auto quant, auto dequant) {
        rope_rotate(v + dim - R, a, R, false);
        round(v, dim);
        quant(v, dim, dst, dst + dim / 2);
        if (st.dump) dequant(dst, dst + dim / 2, dim, v);
      };
      if (role.key_owner)  // the index key, fp4-I
        rotate_store(key + q * Di, Di,
                     owned ? st.kv->idx_row(l, sq.kv, j) : idx_tmp + q * idx_bytes, fp4i_quant,
                     fp4i_dequant);
      // The latent, fp4-C, appended (§5.4).
      rotate_store(lat + q * Dh, Dh, owned ? st.kv->cmp_row(l, sq.kv, j) : cmp_tmp + q * cmp_bytes,
                   fp4c_quant, fp4c_dequant);
    });
    if (st.dump) {
      dump_cmp.insert(dump_cmp.end(), lat, lat + ng * Dh);
      if (role.key_owner) dump_idx.insert(dump_idx.end(), key, key + ng * Di);
    }
    // Tokens of the group still open after this call wait in the carry.
    if (r > 1)
      for (int64_t p = std::max(j_end * r, s0); p < s0 + real; ++p) {
        float* dst = carry + (p % r) * 2 * Dh;
        std::copy_n(&k[size_t((r0 + p - s0) * Dh)], Dh, dst);
        std::copy_n(&g[size_t((r0 + p - s0) * Dh)], Dh, dst + Dh);
      }
    if (role.key_owner && (j_end > j_begin || sq.n_tokens > 1))
      st.kv->last_key_layer(sq.kv.slot) = l;
  }
  if (st.dump) {
    dump(st, l, "attn.cmp", dump_cmp.data(), {int64_t(dump_cmp.size()) / Dh, Dh});
    if (role.key_owner)
      dump(st, l, "attn.idxk", dump_idx.data(), {int64_t(dump_idx.size()) / Di, Di});
  }
}

// The indexer of an index source (V41_SPEC.md §6, §12.4): scores every visible compressed row
// for each query, applies the candidate-block filter, and publishes the top-k list that this
// layer and the consumers after it attend to.
void Model::Impl::indexer(int l, Step& st, const float* u, const float* qr) {
  DI_REGION("attn.indexer");
  ArenaScope scope(arena);
  const PreparedLayer& P = lin[size_t(l)];
  const LayerRole& role = roles[size_t(l)];
  const int64_t N = st.N, Hi = c.index_n_heads, Di = c.index_head_dim;
  const int64_t K = c.index_topk, r = role.ratio;

  // Queries (§6.2): QLin, RoPE per head, fp4-I.
  float* qi = arena_array<float>(arena, size_t(N * Hi * Di));  // written in full
  float* w = arena_array<float>(arena, size_t(N * Hi));
  project(P.idx_wq_b, qr, N, qi);
  rope_rows(st, rope_compressed, qi, Hi, Di);
  for_rows(N, [&](int64_t i) { fp4i_qdq(&qi[size_t(i * Hi * Di)], Hi * Di); });
  // Head weights: bf16 linear, then the fp32 constant Di^-1/2 * Hi^-1/2.
  project(P.idx_weights_proj, u, N, w);
  const float wscale = float(std::pow(double(Di), -0.5) * std::pow(double(Hi), -0.5));
  for (int64_t i = 0; i < N * Hi; ++i) w[i] *= wscale;
  round(w, N * Hi);

  const int64_t Ck = c.candidate_topk_blocks, Cb = c.candidate_block_size;
  // This rank's candidates: per row the best compressed rows it holds and, at the candidate
  // source, the best candidate blocks it holds ((-inf, max) padding). They are merged over the
  // context-parallel group below; a single rank merges its own lists with the same code.
  const ScoredId pad{-INFINITY, INT32_MAX};
  ArenaVec<ScoredId> top_local(size_t(N * K), pad, &arena), blk_local(&arena);
  if (role.candidate_source) blk_local.assign(size_t(N * Ck), pad);
  ArenaVec<int64_t> rows_of_seq(static_cast<size_t>(N), 0, &arena);  // T of each row's sequence
  ArenaVec<int64_t> own(&arena);  // rows of the sequence this rank holds, ascending
  ArenaVec<float> keys(&arena);
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
    for_rows(n_own, [&](int64_t k) {
      const uint8_t* e = st.kv->idx_row(keys_layer, sq.kv, own[size_t(k)]);
      fp4i_dequant(e, e + Di / 2, Di, &keys[size_t(k * Di)]);
    });
    // Every query row on its own, spread over the pool (a row's scores and lists do not depend
    // on which thread computes them).
    for_rows(sq.n_tokens, [&](int64_t i) {
      thread_local std::vector<float> scores;  // reused: no allocation once large enough
      thread_local std::vector<ScoredId> work;
      thread_local std::vector<uint8_t> kept;
      scores.resize(static_cast<size_t>(n_own));
      work.resize(size_t(std::max<int64_t>(n_own, 1)));
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
        select_best(work.data(), nb, Ck, &blk_local[size_t(row * Ck)]);
      } else if (role.candidate_consumer && !st.cand_n.empty() && st.cand_n[size_t(row)] >= 0) {
        kept.assign(size_t((T + Cb - 1) / Cb), 0);
        for (int32_t j = 0; j < st.cand_n[size_t(row)]; ++j)
          kept[size_t(st.cand[size_t(row * Ck + j)])] = 1;
        for (int64_t k = 0; k < n_own; ++k)
          if (!kept[size_t(own[size_t(k)] / Cb)]) scores[size_t(k)] = -INFINITY;
      }
      for (int64_t k = 0; k < vis_own; ++k)
        work[size_t(k)] = {scores[size_t(k)], int32_t(own[size_t(k)])};
      select_best(work.data(), vis_own, K, &top_local[size_t(row * K)]);
    });
  }
  // Merge over the context-parallel group: the global best are among the ranks' local best,
  // published as `count` [N] ids of width `width` per row, ascending, in `ids` [N, width].
  auto merge = [&](ArenaVec<ScoredId>& local, int64_t width, std::vector<int32_t>& ids,
                   std::vector<int32_t>& count) {
    ids.resize(size_t(N * width));
    count.resize(size_t(N));
    ContextShard& cx = *opt.parallel.context;
    const int n_parts = cx.parts();
    ArenaVec<ScoredId> all(size_t(n_parts) * local.size(), &arena);
    cx.all_gather(local.data(), local.size() * sizeof(ScoredId), all.data());
    for_rows(N, [&](int64_t i) {
      thread_local std::vector<ScoredId> cand, best;  // reused: no allocation once large enough
      cand.resize(size_t(n_parts * width));
      best.resize(size_t(n_parts * width));
      for (int pr = 0; pr < n_parts; ++pr)
        std::copy_n(&all[size_t((int64_t(pr) * N + i) * width)], width, &cand[size_t(pr * width)]);
      const int64_t n = select_best(cand.data(), n_parts * width, width, best.data());
      count[size_t(i)] = int32_t(n);
      for (int64_t j = 0; j < n; ++j) ids[size_t(i * width + j)] = best[size_t(j)].id;
      sort_ids(&ids[size_t(i * width)], n);
    });
  };
  if (role.candidate_source) {
    merge(blk_local, Ck, st.cand, st.cand_n);
    for (int64_t i = 0; i < N; ++i)
      if (rows_of_seq[size_t(i)] == 0) st.cand_n[size_t(i)] = -1;  // nothing to select
  }
  merge(top_local, K, st.topk, st.topk_n);
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
