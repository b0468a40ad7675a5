// The DSpark draft head (V41_SPEC.md §10.4; the reference's computation in docs/numerics.md):
// the kept rows of the last forward call enter each stage's window ring (keys projected from the
// backbone's taps), then a block of B slots (the sampled token, then the noise id) runs through
// the window-only stages, attending to the ring and to the whole block, and the last stage's
// norm, the backbone's head and the Markov head give the drafts one slot after the other.
#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/region_timer.h"
#include "kernels/attention.h"
#include "kernels/hyper.h"
#include "kernels/quant.h"
#include "kernels/reduce.h"
#include "model/model_impl.h"

namespace deepinfer {

void Model::Impl::draft_attention(int l, Step& st, const float* u, float* out) {
  ArenaScope scope(arena);
  const LayerWeights& W = weights(l);
  const int64_t N = st.N, H = c.n_heads, Dh = c.head_dim, Q = c.q_lora_rank;
  const int64_t Wn = c.window_size, B = c.dspark_block_size, wrow = window_kv_row_bytes(Dh);
  ArenaVec<float> qr(size_t(N * Q), &arena), q(size_t(N * H * Dh), &arena);
  ArenaVec<float> kv(size_t(N * Dh), &arena), o(size_t(N * H * Dh), &arena);
  ArenaVec<uint8_t> packed(size_t(N * wrow), &arena);
  query(l, st, rope_window, u, qr.data(), q.data());
  window_keys(l, st, rope_window, u, kv.data(), packed.data());
  {
    DI_REGION("attn.sparse");
    const float scale = float(std::pow(double(Dh), -0.5));
    // Each draft's keys: ring slots 0 .. min(W, p + 1) - 1 in slot order, then the block's B
    // keys (no mask); then its B rows, every row of every draft on its own task.
    const size_t n = draft_slot.size();
    const size_t stride = size_t((Wn + B) * Dh);  // per draft: at most W ring keys, then B
    // Draft d's block follows position st.pos[d * B] - 1.
    auto ring_keys = [&](size_t d) { return std::min(Wn, st.pos[d * size_t(B)]); };
    ArenaVec<float> keys(n * stride, &arena);
    for (size_t d = 0; d < n; ++d) {
      const int64_t nr = ring_keys(d);
      float* kd = &keys[d * stride];
      for (int64_t j = 0; j < nr; ++j) {
        const uint8_t* e = st.kv->window_slot(l, draft_slot[d], j);
        fp8_dequant(e, e + Dh, Dh, kd + j * Dh);
      }
      std::copy_n(&kv[size_t(int64_t(d) * B * Dh)], B * Dh, kd + nr * Dh);
    }
    for_rows(int64_t(n) * B, [&](int64_t i) {
      const size_t d = size_t(i / B);
      sparse_attention({&q[size_t(i * H * Dh)], &keys[d * stride], ring_keys(d) + B,
                        W.attn_sink.f32(), H, Dh, scale, bf16, exact, &o[size_t(i * H * Dh)]});
    });
    round(o.data(), N * H * Dh);
  }
  output(l, st, rope_window, o.data(), out);
}

void Model::Impl::draft(std::span<const DraftSeq> seqs, KvCache& kv, DraftOutput& out) {
  DI_REQUIRE(opt.dspark, "this model was built without its draft head (ModelOptions::dspark)");
  arena.reset();
  const int64_t D = c.dim, M = c.hc_mult, Dh = c.head_dim;
  const int64_t nT = int64_t(c.dspark_target_layer_ids.size()), B = c.dspark_block_size;
  const int64_t V = c.vocab_size, R = c.dspark_markov_rank, wrow = window_kv_row_bytes(Dh);
  DI_CHECK(seqs.empty() || step.row0.size() == fw_seqs.size(),
           "draft() needs a forward call first");
  DI_REQUIRE(
      kv.num_layers() >= c.n_layers + c.n_mtp_layers,
      "draft(): the KV cache has no rings for the draft head (KvCacheOptions::draft_layers)");

  // --- the kept rows into every stage's ring (with the snapshots of this call's saves) ---
  Step& ss = seed_step;
  ss.kv = &kv;
  ss.pos.clear();
  ss.row0.clear();  // per DraftSeq: its first row among the kept rows
  ArenaVec<float> tin(&arena);
  for (const DraftSeq& d : seqs) {
    DI_CHECK(d.seq >= 0 && size_t(d.seq) < fw_seqs.size(), "draft of sequence ", d.seq);
    const ForwardSeq& q = fw_seqs[size_t(d.seq)];
    DI_CHECK(d.kept >= (d.token >= 0 ? 1 : 0) && d.kept <= q.n_tokens - q.n_padding, "sequence ",
             d.seq, " keeps ", d.kept, " rows");
    DI_CHECK(d.token < V, "draft token ", d.token);
    ss.row0.push_back(int64_t(ss.pos.size()));
    const int64_t r0 = step.row0[size_t(d.seq)];  // the last call's rows
    for (int64_t i = 0; i < d.kept; ++i) ss.pos.push_back(q.start_pos + i);
    tin.insert(tin.end(), &taps[size_t(r0 * nT * D)], &taps[size_t((r0 + d.kept) * nT * D)]);
  }
  const int64_t n = int64_t(ss.pos.size());
  ss.N = n;
  {
    DI_REGION("draft.seed");
    ArenaVec<float> main_x(size_t(n * D), &arena), kvs(size_t(n * Dh), &arena);
    ArenaVec<uint8_t> packed(size_t(n * wrow), &arena);
    if (n > 0) project(main_proj, tin.data(), n, main_x.data(), &ck.dspark.main_norm);
    for (int k = 0; k < c.n_mtp_layers; ++k) {
      const int l = c.n_layers + k;
      if (n > 0) window_keys(l, ss, rope_window, main_x.data(), kvs.data(), packed.data());
      for (size_t i = 0; i < seqs.size(); ++i) {
        const ForwardSeq& q = fw_seqs[size_t(seqs[i].seq)];
        advance_ring(l, kv, q.kv.slot, q.start_pos, seqs[i].kept,
                     &packed[size_t(ss.row0[i] * wrow)], fw_saves, seqs[i].seq);
      }
    }
  }

  // --- the draft block: B slots per drafting sequence ---
  Step& ds = draft_step;
  ds.kv = &kv;
  ds.pos.clear();
  draft_slot.clear();
  ArenaVec<int32_t> tokens(&arena);
  for (const DraftSeq& d : seqs) {
    if (d.token < 0) continue;
    const ForwardSeq& q = fw_seqs[size_t(d.seq)];
    const int64_t p = q.start_pos + d.kept - 1;
    draft_slot.push_back(q.kv.slot);
    for (int64_t i = 0; i < B; ++i) {
      tokens.push_back(i == 0 ? d.token : int32_t(c.dspark_noise_token_id));
      ds.pos.push_back(p + 1 + i);
    }
  }
  const int64_t nd = int64_t(draft_slot.size()), NB = nd * B;
  // Slots whose drafts are wanted: all B run through the stages (they attend to each other), the
  // head only reads the first S of each block.
  const int64_t S = out.slots > 0 ? std::min<int64_t>(out.slots, B) : B, NS = nd * S;
  ds.N = NB;
  out.tokens.resize(size_t(NS));
  out.logits.resize(out.want_logits ? size_t(NS * V) : 0);
  out.confidence.resize(out.want_logits ? size_t(NS) : 0);
  if (NB == 0) return;
  Stream b(NB, M, D, &arena);
  embed_rows(tokens.data(), b, NB);
  for (int k = 0; k < c.n_mtp_layers; ++k) block(c.n_layers + k, ds, b);

  DI_REGION("draft.head");
  // Per wanted slot: the collapsed stream, then its Markov embedding (the confidence head's
  // input), and the collapsed stream normed (the head's input).
  const int64_t DR = D + R;
  ArenaVec<float> cin(size_t(NS * DR), &arena), h(size_t(NS * D), &arena);
  ArenaVec<float> logits_tmp(out.want_logits ? 0 : size_t(NS * V), &arena);
  for (int64_t d = 0; d < nd; ++d)
    for (int64_t i = 0; i < S; ++i) {
      const int64_t row = d * B + i;
      float* hid = &cin[size_t((d * S + i) * DR)];
      hc_pre(&b.x[size_t(row * M * D)], &b.pi[size_t(row * M)], M, D, hid);
      round(hid, D);
      std::copy_n(hid, D, &h[size_t((d * S + i) * D)]);
    }
  round_norm(h.data(), NS, D, ck.dspark.norm);
  float* logits = out.want_logits ? out.logits.data() : logits_tmp.data();
  linear(head, h.data(), NS, logits, exact);
  // The Markov head, slot after slot: slot i's bias comes from the token before it (the sampled
  // token for slot 0, then the previous slot's draft); the draft is the biased logits' argmax.
  ArenaVec<float> bias(size_t(nd * V), &arena);
  for (int64_t i = 0; i < S; ++i) {
    for (int64_t d = 0; d < nd; ++d) {
      const int32_t prev = i == 0 ? tokens[size_t(d * B)] : out.tokens[size_t(d * S + i - 1)];
      const uint16_t* e = ck.dspark.markov_embed.bf16() + int64_t(prev) * R;
      for (int64_t r = 0; r < R; ++r) cin[size_t((d * S + i) * DR + D + r)] = bf16_to_f32(e[r]);
    }
    // Row d of this call reads slot i's embedding of draft d.
    linear(markov_head, {&cin[size_t(i * DR + D)], nd, S * DR, bias.data(), V, 0, -1, exact});
    for (int64_t d = 0; d < nd; ++d) {
      float* row = logits + (d * S + i) * V;
      for (int64_t v = 0; v < V; ++v) row[v] += bias[size_t(d * V + v)];
      out.tokens[size_t(d * S + i)] = int32_t(argmax(row, V));
    }
  }
  if (out.want_logits) linear(confidence, cin.data(), NS, out.confidence.data(), exact);
}

}  // namespace deepinfer
