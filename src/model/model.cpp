#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/dtype.h"
#include "core/region_timer.h"
#include "kernels/elementwise.h"
#include "kernels/hyper.h"
#include "kernels/quant.h"
#include "model/model_impl.h"

namespace deepinfer {

Model::Impl::Impl(const Checkpoint& ck_, ModelOptions opt_)
    : ck(ck_),
      c(ck_.config()),
      opt(std::move(opt_)),
      bf16(opt.numerics == Numerics::Bf16),
      exact(opt.numerics == Numerics::Fp32) {
  roles = layer_roles(c);
  rope_window = make_rope_table(c.rope_head_dim, c.rope_theta, 0, 1, c.beta_fast, c.beta_slow);
  rope_compressed = make_rope_table(c.rope_head_dim, c.compress_rope_theta, c.original_seq_len,
                                    c.rope_factor, c.beta_fast, c.beta_slow);
  if (!c.engram_layer_ids.empty()) {
    const std::vector<int64_t> ids(c.engram_layer_ids.begin(), c.engram_layer_ids.end());
    engram = make_engram_tables(ids, c.engram_max_ngram_size, c.engram_n_heads, c.engram_vocab_size,
                                c.engram_compressed_vocab_size);
    check_engram_num_embeddings(engram, c.engram_num_embeddings);
    // A token map's compressed ids are checked where the tokenizer builds it
    // (runtime/load_engine.cpp); here only that it covers every id the model can see.
    DI_REQUIRE(opt.engram_token_map.empty() || int64_t(opt.engram_token_map.size()) >= c.vocab_size,
               ck.dir(), ": the Engram token map covers ", opt.engram_token_map.size(),
               " ids, the vocabulary has ", c.vocab_size);
    if (opt.engram_token_map.empty())
      DI_REQUIRE(c.engram_compressed_vocab_size == c.vocab_size, ck.dir(),
                 ": the checkpoint has no tokenizer, so the Engram token map is the identity and "
                 "engram_compressed_vocab_size (",
                 c.engram_compressed_vocab_size, ") must equal vocab_size (", c.vocab_size, ")");
    const int64_t M = c.hc_mult, D = c.dim;
    for (int l : c.engram_layer_ids) {
      const LayerWeights& W = ck.layers[size_t(l)];
      std::vector<float>& om = engram_omega.emplace_back(size_t(M * D));
      for (int64_t i = 0; i < M * D; ++i)
        om[size_t(i)] = bf16_to_f32(W.engram_q.bf16()[i]) * bf16_to_f32(W.engram_k.bf16()[i]);
    }
  }
  if (opt.parallel.experts->all_local())
    DI_REQUIRE(ck.expert_begin == 0 && ck.expert_end == c.n_routed_experts, ck.dir(),
               ": the model needs every routed expert loaded (or expert parallelism)");
  if (ck.has_vision)
    for (const Weight* w : {&ck.vision.image_start, &ck.vision.image_newline, &ck.vision.image_end})
      for (int64_t d = 0; d < c.dim; ++d) image_delims.push_back(bf16_to_f32(w->bf16()[d]));
  // The linear weights repacked for the fast kernels.
  auto prep = [&](PreparedLinear& dst, const Weight& w) {
    dst = PreparedLinear(w);
    prepared_bytes += dst.packed_bytes();
    if (dst.present()) prepared.push_back(&dst);
    ck.release_resident(w);  // the kernels read the repacked copy
  };
  auto prep_layer = [&](PreparedLayer& P, const LayerWeights& W) {
    prep(P.wq_a, W.wq_a);
    prep(P.wq_b, W.wq_b);
    prep(P.wkv, W.wkv);
    prep(P.wo_a, W.wo_a);
    prep(P.wo_b, W.wo_b);
    prep(P.cmp_wkv, W.cmp_wkv);
    prep(P.cmp_wgate, W.cmp_wgate);
    prep(P.idx_wq_b, W.idx_wq_b);
    prep(P.idx_weights_proj, W.idx_weights_proj);
    prep(P.idx_wk, W.idx_wk);
    prep(P.gate, W.gate);
    prep(P.hc_attn_fn, W.hc_attn_fn);
    prep(P.hc_ffn_fn, W.hc_ffn_fn);
    prep(P.engram_wkv, W.engram_wkv);
    auto prep_expert = [&](PreparedExpert& dst, const ExpertWeights& e) {
      prep(dst.w1, e.w1);
      prep(dst.w2, e.w2);
      prep(dst.w3, e.w3);
    };
    P.experts.resize(W.experts.size());
    for (size_t e = 0; e < W.experts.size(); ++e) prep_expert(P.experts[e], W.experts[e]);
    prep_expert(P.shared, W.shared);
  };
  DI_REQUIRE(!opt.dspark || ck.has_dspark, ck.dir(),
             ": the checkpoint has no DSpark draft head (config dspark_block_size and "
             "n_mtp_layers > 0, and the mtp.* tensors)");
  // Sized once: `prepared` points into it.
  lin.resize(size_t(c.n_layers + (opt.dspark ? c.n_mtp_layers : 0)));
  for (int l = 0; l < c.n_layers; ++l) prep_layer(lin[size_t(l)], ck.layers[size_t(l)]);
  prep(head, ck.head);
  if (opt.dspark) {
    for (int k = 0; k < c.n_mtp_layers; ++k)
      prep_layer(lin[size_t(c.n_layers + k)], ck.dspark.stages[size_t(k)]);
    prep(main_proj, ck.dspark.main_proj);
    prep(markov_head, ck.dspark.markov_head);
    prep(confidence, ck.dspark.confidence);
  }
}

// Values per task of the elementwise passes over the pool (a smaller pass runs on the caller).
constexpr int64_t kPassChunk = int64_t(1) << 15;
// The hyper-connection steps of a forward call of at least kHcChunkRows rows run in chunks of
// kHcRows rows (Model::Impl::block).
constexpr int64_t kHcRows = 8, kHcChunkRows = 32;

void Model::Impl::round(float* x, int64_t n) const {
  if (!bf16) return;
  ThreadPool::global().parallel_for(
      (n + kPassChunk - 1) / kPassChunk, 1, [&](int64_t b, int64_t e) {
        round_bf16_inplace(x + b * kPassChunk, std::min(n, e * kPassChunk) - b * kPassChunk);
      });
}

void Model::Impl::rope_rows(const Step& st, const RopeTable& t, float* x, int64_t n_heads,
                            int64_t head_dim, bool inverse) {
  const int64_t R = c.rope_head_dim;
  for_rows(st.N, [&](int64_t i) {
    thread_local std::vector<float> cs;  // reused: no allocation once large enough
    cs.resize(size_t(R));
    // The rotated parts of a row are scattered (one per head, head_dim apart) past what the
    // hardware prefetchers follow: those two rows ahead are fetched while this one turns (a
    // 512-token prefill's rotations waited on them for 24 ms, 10 so).
    if (i + 2 < st.N)
      for (int64_t h = 0; h < n_heads; ++h)
        for (int64_t e = 0; e < R; e += 16)
          __builtin_prefetch(x + ((i + 2) * n_heads + h) * head_dim + head_dim - R + e, 1);
    rope_angles(t, st.pos[size_t(i)], cs.data());
    for (int64_t h = 0; h < n_heads; ++h) {
      float* tail = x + (i * n_heads + h) * head_dim + head_dim - R;
      rope_rotate(tail, cs.data(), R, inverse);
      if (bf16) round_bf16_inplace(tail, R);  // (the rest of the row is bf16 already)
    }
  });
}

void Model::Impl::round_norm(float* x, int64_t n, int64_t d, const Weight& w) const {
  ThreadPool::global().parallel_for(n, std::max<int64_t>(1, kPassChunk / d),
                                    [&](int64_t b, int64_t e) {
                                      float* xb = x + b * d;
                                      round(xb, (e - b) * d);
                                      rmsnorm(xb, e - b, d, w.bf16(), float(c.norm_eps));
                                      round(xb, (e - b) * d);
                                    });
}

void Model::Impl::project(const PreparedLinear& w, const float* x, int64_t n, float* y,
                          const Weight* norm) {
  linear(w, x, n, y, exact, bf16 && !norm);  // (the rounding as the kernels' tasks end)
  if (norm) round_norm(y, n, w.rows(), *norm);
}

void Model::Impl::prepare_step(Step& st, const ForwardBatch& batch, KvCache& kv) {
  st.batch = &batch;
  st.kv = &kv;
  st.N = batch.n_rows();
  // Earlier calls' artefacts must not leak into this one; the vectors keep their capacity.
  for (std::vector<int64_t>* v : {&st.engram_ids, &st.pos, &st.row0}) v->clear();
  for (std::vector<int32_t>* v : {&st.topk, &st.topk_n, &st.cand, &st.cand_n}) v->clear();
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const ForwardSeq& q = batch.seqs[s];
    DI_CHECK(q.n_tokens >= 1 && q.n_padding >= 0 && q.n_padding < q.n_tokens && q.start_pos >= 0);
    DI_CHECK(q.logits_from >= 0 && q.logits_from <= q.n_tokens - q.n_padding);
    DI_CHECK(q.kv.slot >= 0 && q.kv.slot < kv.max_seqs(), "slot ", q.kv.slot);
    DI_CHECK(kv.capacity_tokens(q.kv.n_blocks) >= q.start_pos + q.n_tokens - q.n_padding,
             "sequence ", s, " has blocks for ", kv.capacity_tokens(q.kv.n_blocks),
             " tokens, needs ", q.start_pos + q.n_tokens - q.n_padding);
    st.row0.push_back(int64_t(st.pos.size()));
    for (int64_t i = 0; i < q.n_tokens; ++i) st.pos.push_back(q.start_pos + i);
    if (q.start_pos == 0) kv.last_key_layer(q.kv.slot) = -1;
    if (q.restore >= 0) kv.restore_snapshot(q.restore, q.kv.slot);
    if (q.rollback) kv.restore_slot(q.kv.slot);
    if (q.backup) kv.backup_slot(q.kv.slot);
  }
  for (const WindowSave& w : batch.saves) {
    DI_CHECK(w.seq >= 0 && size_t(w.seq) < batch.seqs.size(), "snapshot of sequence ", w.seq);
    const ForwardSeq& q = batch.seqs[size_t(w.seq)];
    DI_CHECK(w.boundary > q.start_pos && w.boundary <= q.start_pos + q.n_tokens - q.n_padding,
             "snapshot at ", w.boundary, " outside the sequence's rows");
  }
  DI_CHECK(int64_t(st.pos.size()) == st.N, "rows of the sequences (", st.pos.size(),
           ") != tokens (", st.N, ")");
  for (int32_t t : batch.tokens)
    DI_REQUIRE(t >= 0 && t < c.vocab_size, "token id ", t, " is outside the vocabulary [0, ",
               c.vocab_size, ")");
  st.dump = sink != nullptr && batch.seqs.size() == 1;
  if (st.dump) sink->begin_call();
}

void Model::Impl::engram_ids(Step& st) {
  DI_REGION("model.engram_hash");
  if (c.engram_layer_ids.empty()) return;
  const int64_t NC = engram.n_cols, LE = engram.n_layers, hist_max = engram.ngram_max - 1;
  st.engram_ids.assign(size_t(st.N * LE * NC), 0);
  auto map = [&](int32_t t) -> int64_t {
    return opt.engram_token_map.empty() ? t : opt.engram_token_map[size_t(t)];
  };
  const int64_t pad = map(int32_t(c.engram_pad_id));
  ArenaVec<int64_t> chunk(&arena);
  for (size_t s = 0; s < st.batch->seqs.size(); ++s) {
    const ForwardSeq& q = st.batch->seqs[s];
    const int64_t r0 = st.row0[s];
    chunk.resize(size_t(q.n_tokens));
    const auto& img = st.batch->image_embeds;
    for (int64_t i = 0; i < q.n_tokens; ++i)
      chunk[size_t(i)] = !img.empty() && img[size_t(r0 + i)]
                             ? kEngramDead  // an image row blocks the n-grams reaching it
                             : map(st.batch->tokens[size_t(r0 + i)]);
    int64_t* hist = st.kv->engram_history(q.kv.slot);
    const int64_t n_hist = std::min(q.start_pos, hist_max);
    // The history holds the last n_hist ids, oldest first, at the front of the buffer.
    engram_hash_ids(
        engram, chunk, std::span<const int64_t>(hist, size_t(n_hist)), q.start_pos, pad,
        std::span<int64_t>(st.engram_ids.data() + r0 * LE * NC, size_t(q.n_tokens * LE * NC)));
    const int64_t real = q.n_tokens - q.n_padding;
    // Snapshots: the history after position b - 1 holds the ids of [b - n, b), n = min(b,
    // hist_max), oldest first: from the old history before start_pos, then from the chunk.
    for (const WindowSave& w : st.batch->saves) {
      if (size_t(w.seq) != s) continue;
      int64_t* dst = st.kv->snapshot_history(w.snap);
      for (int64_t p = w.boundary - std::min(w.boundary, hist_max), k = 0; p < w.boundary; ++p)
        dst[k++] =
            p >= q.start_pos ? chunk[size_t(p - q.start_pos)] : hist[n_hist - (q.start_pos - p)];
    }
    engram_update_history(engram, std::span<int64_t>(hist, size_t(hist_max)), n_hist,
                          std::span<const int64_t>(chunk.data(), size_t(real)));
  }
}

// Engram (V41_SPEC.md §9.5): before its block, each Engram layer looks up the table rows its
// n-gram hashes name, projects them into per-copy keys and one value, and adds the value to each
// copy of the stream through that copy's own gate.
void Model::Impl::engram_layer(int l, Step& st, float* x) {
  ArenaScope scope(arena);
  const LayerWeights& W = ck.layers[size_t(l)];
  const int z = c.engram_index(l);
  const int64_t N = st.N, M = c.hc_mult, D = c.dim, Dm = c.engram_head_dim;
  const int64_t NC = engram.n_cols, LE = engram.n_layers, rows = W.engram_table.rows();
  const float eps = float(c.norm_eps);

  // Table rows (exact bf16 values); ids past the table read as zero (ev starts zeroed). Sharded
  // over a group, each rank reads only the rows of its slice and the sum over the group (one
  // non-zero term per row) completes every lookup exactly.
  ranks::Group* shard = opt.parallel.engram;
  const int64_t lo = shard ? rows * shard->rank() / shard->size() : 0;
  const int64_t hi = shard ? rows * (shard->rank() + 1) / shard->size() : rows;
  ArenaVec<float> ev(size_t(N * NC * Dm), &arena);
  for_rows(N, [&](int64_t i) {
    for (int64_t col = 0; col < NC; ++col) {
      const int64_t id = st.engram_ids[size_t((i * LE + z) * NC + col)];
      if (id >= lo && id < hi) weight_row(W.engram_table, id, &ev[size_t((i * NC + col) * Dm)]);
    }
  });
  if (shard) {
    DI_REGION("comm.engram_lookup");
    shard->all_reduce(ev.data(), ev.size());
  }
  float* kv = arena_array<float>(arena, size_t(N * (M + 1) * D));  // written in full
  project(lin[size_t(l)].engram_wkv, ev.data(), N, kv);

  const float inv_sqrt_d = float(std::pow(double(D), -0.5));
  DI_CHECK(M <= kMaxHcMult, "hc_mult ", M, " above ", kMaxHcMult);
  const std::vector<float>& omega = engram_omega[size_t(z)];
  for_rows(N, [&](int64_t i) {
    // Image rows have gate 0: they pass through.
    if (!st.batch->image_embeds.empty() && st.batch->image_embeds[size_t(i)]) return;
    const float* V = &kv[size_t((i * (M + 1) + M) * D)];
    float rh[kMaxHcMult], rk[kMaxHcMult];  // the RMS of every copy and of its key, at once
    rms_inv_rows(x + i * M * D, M, D, D, eps, rh);
    rms_inv_rows(&kv[size_t(i * (M + 1) * D)], M, D, D, eps, rk);
    for (int64_t cpy = 0; cpy < M; ++cpy) {
      float* h = x + (i * M + cpy) * D;
      const float* Kc = &kv[size_t((i * (M + 1) + cpy) * D)];
      const float* om = &omega[size_t(cpy * D)];
      const float rc = rh[cpy] * rk[cpy];
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += double(h[d]) * om[d] * Kc[d];
      const float delta = (f32(dot) * rc) * inv_sqrt_d;
      const float mag = f32(std::sqrt(std::max(double(std::fabs(delta)), double(1e-6f))));
      const float gate = f32(sigmoid_d(std::copysign(mag, delta)));  // the sign of ±0 is kept
      for (int64_t d = 0; d < D; ++d) h[d] = f32(double(h[d]) + double(gate) * V[d]);
      round(h, D);
    }
  });
}

void Model::Impl::embed_rows(const int32_t* tokens, Stream& b, int64_t N,
                             const float* const* image) {
  const int64_t M = c.hc_mult, D = c.dim, MD = M * D;
  for_rows(N, [&](int64_t i) {
    const uint16_t* e = ck.embed.bf16() + int64_t(tokens[i]) * D;
    for (int64_t cpy = 0; cpy < M; ++cpy)
      for (int64_t d = 0; d < D; ++d)
        b.x[size_t(i * MD + cpy * D + d)] = image && image[i] ? image[i][d] : bf16_to_f32(e[d]);
    b.pi[size_t(i * M)] = 1.0f;
  });
}

void Model::Impl::collapse(Stream& b, const float* xs, const float* pre, const Weight& norm,
                           int64_t r0, int64_t r1) {
  const int64_t M = c.hc_mult, D = c.dim, MD = M * D;
  for_rows(r1 - r0, [&](int64_t k) {
    const int64_t i = r0 + k;
    hc_pre(xs + i * MD, pre + i * M, M, D, &b.u[size_t(i * D)]);
  });
  round_norm(&b.u[size_t(r0 * D)], r1 - r0, D, norm);
}

void Model::Impl::block(int l, Step& st, Stream& b) {
  const int64_t N = st.N, M = c.hc_mult, D = c.dim, MD = M * D;
  const bool stage = l >= c.n_layers;
  const LayerWeights& W = weights(l);
  const PreparedLayer& P = lin[size_t(l)];
  const float eps = float(c.norm_eps);
  const HcParams hca(&P.hc_attn_fn, W.hc_attn_base.f32(), W.hc_attn_scale.f32(), M, D, eps,
                     float(c.hc_eps), c.hc_sinkhorn_iters, exact);
  const HcParams hcf(&P.hc_ffn_fn, W.hc_ffn_base.f32(), W.hc_ffn_scale.f32(), M, D, eps,
                     float(c.hc_eps), c.hc_sinkhorn_iters, exact);
  // The hyper-connection steps of rows [r0, r1). From kHcChunkRows rows on, a step runs over
  // chunks of kHcRows rows on the pool, each chunk's work done while its rows of the stream are
  // in this core's L2 (one read of the stream where the mixes, the RMS and the collapse read it
  // each; the expand's output mixed as it is written); below, over all rows at once, each part
  // spread over the pool (a few rows' projection split by tiles).
  auto hc_step = [&](auto&& fn) {
    if (N < kHcChunkRows) return fn(0, N);
    ThreadPool::global().parallel_for(N, kHcRows, [&](int64_t r0, int64_t r1) { fn(r0, r1); });
  };
  // The sublayer's output b.y spread back over the copies of xs into dst.
  auto expand = [&](const float* xs, const float* post, const float* comb, float* dst, int64_t r0,
                    int64_t r1) {
    for_rows(r1 - r0, [&](int64_t k) {
      const int64_t i = r0 + k;
      hc_post(&b.y[size_t(i * D)], xs + i * MD, post + i * M, comb + i * M * M, M, D, dst + i * MD);
      if (bf16) round_bf16_inplace(dst + i * MD, MD);  // while the row is in cache
    });
  };
  // The mixes of xs and the sublayer's input b.u: the copies collapsed with `pi`, round-normed.
  auto mix_collapse = [&](const HcParams& hp, const float* xs, float* pre, float* post, float* comb,
                          const float* pi, const Weight& norm, int64_t r0, int64_t r1) {
    hc_mixes_rows(hp, xs + r0 * MD, r1 - r0, pre + r0 * M, post + r0 * M, comb + r0 * M * M);
    collapse(b, xs, pi, norm, r0, r1);
  };
  {
    DI_REGION("model.hc");
    hc_step([&](int64_t r0, int64_t r1) {
      mix_collapse(hca, b.x.data(), b.pre_a.data(), b.post_a.data(), b.comb_a.data(), b.pi.data(),
                   W.attn_norm, r0, r1);
    });
  }
  dump(st, l, "attn.u", b.u.data(), {N, D});
  if (stage)
    draft_attention(l, st, b.u.data(), b.y.data());
  else
    attention(l, st, b.u.data(), b.y.data());
  {
    DI_REGION("model.hc");
    // The FFN collapses with the attention's pre coefficients (§7.3).
    hc_step([&](int64_t r0, int64_t r1) {
      expand(b.x.data(), b.post_a.data(), b.comb_a.data(), b.x1.data(), r0, r1);
      mix_collapse(hcf, b.x1.data(), b.pre_f.data(), b.post_f.data(), b.comb_f.data(),
                   b.pre_a.data(), W.ffn_norm, r0, r1);
    });
  }
  dump(st, l, "hc.x1", b.x1.data(), {N, M, D});
  dump(st, l, "ffn.v", b.u.data(), {N, D});
  moe(l, st, b.u.data(), b.y.data());
  dump(st, l, "ffn.out", b.y.data(), {N, D});
  {
    DI_REGION("model.hc");
    hc_step([&](int64_t r0, int64_t r1) {
      expand(b.x1.data(), b.post_f.data(), b.comb_f.data(), b.x2.data(), r0, r1);
    });
  }
  dump(st, l, "hc.x2", b.x2.data(), {N, M, D});
  std::swap(b.x, b.x2);
  std::swap(b.pi, b.pre_f);
}

void Model::Impl::forward(const ForwardBatch& batch, KvCache& kv, float* logits) {
  arena.reset();  // nothing of the previous call is alive
  Step& st = step;
  prepare_step(st, batch, kv);
  const int64_t N = st.N, M = c.hc_mult, D = c.dim, MD = M * D;
  engram_ids(st);
  Stream b(N, M, D, &arena);
  {
    DI_REGION("model.embed");
    DI_REQUIRE(batch.image_embeds.empty() || int64_t(batch.image_embeds.size()) == N,
               "forward: image_embeds has ", batch.image_embeds.size(), " rows, expected ", N);
    embed_rows(batch.tokens.data(), b, N,
               batch.image_embeds.empty() ? nullptr : batch.image_embeds.data());
  }
  const int64_t n_taps = opt.dspark ? int64_t(c.dspark_target_layer_ids.size()) : 0;
  taps.resize(size_t(N * n_taps * D));
  for (int l = 0, t = 0; l < c.n_layers; ++l) {
    if (c.is_engram_layer(l)) {
      DI_REGION("model.engram");
      engram_layer(l, st, b.x.data());
      dump(st, l, "engram.x", b.x.data(), {N, M, D});
    }
    if (t < n_taps && c.dspark_target_layer_ids[size_t(t)] == l) {
      // The draft head's tap: the mean of the stream's copies entering the block (summed in
      // double or float as the numerics say), rounded once.
      auto mean = [&](auto sum, const float* xi) {
        for (int64_t cpy = 0; cpy < M; ++cpy) sum += xi[cpy * D];
        return float(sum / decltype(sum)(M));
      };
      for (int64_t i = 0; i < N; ++i)
        for (int64_t d = 0; d < D; ++d) {
          const float* xi = &b.x[size_t(i * MD + d)];
          taps[size_t((i * n_taps + t) * D + d)] = exact ? mean(0.0, xi) : mean(0.0f, xi);
        }
      ++t;
    }
    block(l, st, b);
  }
  round(taps.data(), int64_t(taps.size()));  // each tap is rounded once
  if (opt.dspark) {  // what draft() needs of this call, which may outlive the batch
    fw_seqs.assign(batch.seqs.begin(), batch.seqs.end());
    fw_saves.assign(batch.saves.begin(), batch.saves.end());
  }
  // Final collapse with the last FFN's pre, final norm, fp32 head on the rows that want logits.
  DI_REGION("model.head");
  collapse(b, b.x.data(), b.pi.data(), ck.norm, 0, N);
  dump(st, -1, "final.h", b.u.data(), {N, D});
  ArenaVec<float> h(&arena);
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    // Rows [logits_from, real rows) of the sequence, which lie one after the other in u.
    const float* rows = b.u.data() + st.row0[s] * D;
    h.insert(h.end(), rows + batch.seqs[s].logits_from * D, rows + st.real_rows(s) * D);
  }
  const int64_t n_logits = int64_t(h.size()) / D;
  if (n_logits > 0) linear(head, h.data(), n_logits, logits, exact);
  if (st.dump && n_logits == N) dump(st, -1, "logits", logits, {N, c.vocab_size});
}

void NpyActivationDump::begin_call() {
  call_dir_ = dir_ + "/call" + std::to_string(calls_++);
  std::filesystem::create_directories(call_dir_);
}

Model::Model(const Checkpoint& ck, ModelOptions opt)
    : impl_(std::make_unique<Impl>(ck, std::move(opt))) {}
Model::~Model() = default;
const ModelConfig& Model::config() const {
  return impl_->c;
}
uint64_t Model::prepared_weight_bytes() const {
  return impl_->prepared_bytes;
}
std::vector<std::span<const uint8_t>> Model::prepared_weight_spans() const {
  std::vector<std::span<const uint8_t>> out;
  for (const PreparedLinear* p : impl_->prepared) out.push_back(p->packed_span());
  return out;
}
void Model::forward(const ForwardBatch& batch, KvCache& kv, float* logits) {
  impl_->forward(batch, kv, logits);
}
bool Model::has_draft_head() const {
  return impl_->opt.dspark;
}
int Model::draft_block_size() const {
  return impl_->opt.dspark ? impl_->c.dspark_block_size : 0;
}
void Model::draft(std::span<const DraftSeq> seqs, KvCache& kv, DraftOutput& out) {
  impl_->draft(seqs, kv, out);
}
void Model::set_activation_sink(NpyActivationDump* sink) {
  impl_->sink = sink;
}

}  // namespace deepinfer
