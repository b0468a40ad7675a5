// The compressor of a KV source (V41_SPEC.md §5.3, §5.4, §6.1, §12.3): pools each complete group
// of r tokens into a latent, derives the index key from the pre-RoPE latent (key owners), then
// rotates and fp4-quantizes the latent into the compressed-KV cache. Partial groups wait in the
// sequence's carry (fp32) until their last token arrives.
#include <algorithm>

#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/linear.h"
#include "kernels/quant.h"
#include "kernels/rope.h"
#include "kv/kv_cache.h"
#include "model/model_impl.h"

namespace deepinfer {

void Model::Impl::compressor(int l, Step& st, const float* u) {
  ArenaScope scope(arena);
  const LayerWeights& W = ck.layers[size_t(l)];
  const PreparedLayer& P = lin[size_t(l)];
  const LayerRole& role = roles[size_t(l)];
  const int64_t N = st.N, Dh = c.head_dim, R = c.rope_head_dim, Di = c.index_head_dim;
  const int64_t r = role.ratio;
  ArenaVec<float> cs(static_cast<size_t>(R), &arena);

  // Per-token projections. r = 1: the latent itself (bf16 linear, norm). r > 1: fp32 k and gate.
  ArenaVec<float> k(size_t(N * Dh), &arena), g(&arena);
  linear(P.cmp_wkv, u, N, k.data(), exact);
  if (r == 1) {
    round_norm(k.data(), N, Dh, W.cmp_norm);
  } else {
    g.resize(size_t(N * Dh));
    linear(P.cmp_wgate, u, N, g.data(), exact);
  }

  ArenaVec<uint8_t> cmp_scratch(static_cast<size_t>(compressed_kv_row_bytes(Dh)), &arena),
      idx_scratch(static_cast<size_t>(index_key_row_bytes(Di)), &arena);
  ArenaVec<float> latent(static_cast<size_t>(Dh), &arena), key(static_cast<size_t>(Di), &arena),
      dump_cmp(&arena), dump_idx(&arena);
  for (size_t s = 0; s < st.batch->seqs.size(); ++s) {
    const ForwardSeq& sq = st.batch->seqs[s];
    const int64_t r0 = st.row0[s], s0 = sq.start_pos, real = st.real_rows(s);
    const int64_t j_begin = s0 / r, j_end = (s0 + real) / r;
    float* carry = r > 1 ? st.kv->carry(l, sq.kv.slot) : nullptr;  // [r, 2, Dh]
    for (int64_t j = j_begin; j < j_end; ++j) {
      const bool owned = owns_row(st, l, j);
      if (r == 1) {
        std::copy_n(&k[size_t((r0 + j - s0) * Dh)], Dh, latent.begin());
      } else {
        // Rows of group j: positions j*r .. j*r + r - 1, from the carry when before this call.
        const float* kr[64];
        const float* gr[64];
        DI_CHECK(r <= 64, "compress ratio ", r, " above 64");
        for (int64_t t = 0; t < r; ++t) {
          const int64_t p = j * r + t;
          if (p < s0) {
            kr[t] = carry + (p % r) * 2 * Dh;
            gr[t] = kr[t] + Dh;
          } else {
            kr[t] = &k[size_t((r0 + p - s0) * Dh)];
            gr[t] = &g[size_t((r0 + p - s0) * Dh)];
          }
        }
        // Per channel: softmax of the gates over the group's tokens, then the weighted sum.
        // fp32 results at each step; sums over the group in double.
        for (int64_t d = 0; d < Dh; ++d) {
          float mx = gr[0][d];
          for (int64_t t = 1; t < r; ++t) mx = std::max(mx, gr[t][d]);
          float e[64];
          double sum = 0;
          for (int64_t t = 0; t < r; ++t) sum += (e[t] = exp_f(gr[t][d] - mx));
          const float es = f32(sum);
          double pooled = 0;
          for (int64_t t = 0; t < r; ++t) pooled += double(kr[t][d]) * (e[t] / es);
          latent[size_t(d)] = f32(pooled);
        }
        round_norm(latent.data(), 1, Dh, W.cmp_norm);  // cast to bf16 before the norm
      }
      // The angles of the group's first position, for the index key and the latent.
      rope_angles(rope_compressed, j * r, cs.data());
      // Index key from the pre-RoPE latent (§6.1).
      if (role.key_owner) {
        project(P.idx_wk, latent.data(), 1, key.data(), &W.idx_k_norm);
        rope_rotate(key.data() + Di - R, cs.data(), R, false);
        round(key.data(), Di);
        // Every rank computes the row; its context-parallel owner stores it.
        uint8_t* dst = owned ? st.kv->idx_row(l, sq.kv, j) : idx_scratch.data();
        fp4i_quant(key.data(), Di, dst, dst + Di / 2);
        if (st.dump) {
          fp4i_dequant(dst, dst + Di / 2, Di, key.data());
          dump_idx.insert(dump_idx.end(), key.begin(), key.end());
        }
      }
      // RoPE at the group's first position, fp4-C, append (§5.4).
      rope_rotate(latent.data() + Dh - R, cs.data(), R, false);
      round(latent.data(), Dh);
      uint8_t* dst = owned ? st.kv->cmp_row(l, sq.kv, j) : cmp_scratch.data();
      fp4c_quant(latent.data(), Dh, dst, dst + Dh / 2);
      if (st.dump) {
        fp4c_dequant(dst, dst + Dh / 2, Dh, latent.data());
        dump_cmp.insert(dump_cmp.end(), latent.begin(), latent.end());
      }
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

}  // namespace deepinfer
