// Internals of Model shared by its source files (model.cpp, attention.cpp, moe.cpp, dspark.cpp).
// Not part of the public interface.
#pragma once

#include "core/arena.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/engram_hash.h"
#include "kernels/linear.h"
#include "kernels/rope.h"
#include "model/model.h"

namespace deepinfer {

// fn(i) for every row i < n, rows spread over the thread pool in tasks of rows_per_task (each
// row's result is computed alone, so the split changes nothing; up to one task's rows run on the
// calling thread).
template <typename F>
void for_rows(int64_t n, F&& fn, int64_t rows_per_task = 1) {
  ThreadPool::global().parallel_for(n, rows_per_task, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) fn(i);
  });
}

// Per-step state shared between layers of one forward call: row metadata and the artefacts that
// producer layers publish for later layers of the same step (the top-k lists of the most recent
// index source, the candidate blocks of the candidate source). Passed explicitly, never static.
struct Step {
  const ForwardBatch* batch = nullptr;
  KvCache* kv = nullptr;
  int64_t N = 0;              // rows
  std::vector<int64_t> pos;   // [N] absolute position of each row
  std::vector<int64_t> row0;  // [n_seqs] first row of each sequence
  // Engram hash ids of every row: [N, L_E, NC].
  std::vector<int64_t> engram_ids;
  // Published by index sources: per row, the compressed rows to attend (ascending), width K.
  std::vector<int32_t> topk;    // [N, K]
  std::vector<int32_t> topk_n;  // [N]
  // Published by the candidate source: per row, the kept blocks (ascending), width Ck; -1 count
  // when nothing was published for the row.
  std::vector<int32_t> cand;    // [N, Ck]
  std::vector<int32_t> cand_n;  // [N]
  bool dump = false;            // activation dumps requested for this call

  int64_t real_rows(size_t s) const {
    const ForwardSeq& q = batch->seqs[s];
    return q.n_tokens - q.n_padding;
  }
};

// The linear weights of one layer repacked for the fast kernels (kernels/linear.h), built once
// at construction; absent weights stay absent.
struct PreparedExpert {
  PreparedLinear w1, w2, w3;
};
struct PreparedLayer {
  PreparedLinear wq_a, wq_b, wkv, wo_a, wo_b;
  PreparedLinear cmp_wkv, cmp_wgate, idx_wq_b, idx_weights_proj, idx_wk;
  PreparedLinear gate, hc_attn_fn, hc_ffn_fn, engram_wkv;
  std::vector<PreparedExpert> experts;
  PreparedExpert shared;
};

struct Model::Impl {
  Impl(const Checkpoint& ck, ModelOptions opt);

  // The hyper-connection stream of N rows through the blocks: the copies x [N, M, D] (x1/x2 the
  // halves' outputs), a sublayer's input u and output y [N, D], the pre-mix pi carried to the
  // next block and each half's mixes.
  struct Stream {
    Stream(int64_t N, int64_t M, int64_t D, Arena* a) : arena(a) {
      for (ArenaVec<float>* v : {&x, &x1, &x2}) v->resize(size_t(N * M * D));
      for (ArenaVec<float>* v : {&u, &y}) v->resize(size_t(N * D));
      for (ArenaVec<float>* v : {&pi, &pre_a, &post_a, &pre_f, &post_f}) v->resize(size_t(N * M));
      for (ArenaVec<float>* v : {&comb_a, &comb_f}) v->resize(size_t(N * M * M));
    }
    Arena* arena;
    ArenaVec<float> x{arena}, x1{arena}, x2{arena}, u{arena}, y{arena}, pi{arena}, pre_a{arena},
        post_a{arena}, comb_a{arena}, pre_f{arena}, post_f{arena}, comb_f{arena};
  };

  const Checkpoint& ck;
  const ModelConfig& c;
  ModelOptions opt;
  bool bf16;
  bool exact;  // sums in double, rounded once (fp32 numerics); else the canonical fp32 orders
  std::vector<LayerRole> roles;
  RopeTable rope_window, rope_compressed;
  EngramTables engram;
  std::vector<std::vector<float>> engram_omega;  // per Engram layer: [M, D] q_weight ⊙ k_weight
  NpyActivationDump* sink = nullptr;
  std::vector<PreparedLayer> lin;  // [n_layers], then the draft stages with the draft head
  PreparedLinear head;
  // The DSpark draft head's linears (model/dspark.cpp), prepared when opt.dspark asks for it.
  PreparedLinear main_proj, markov_head, confidence;
  std::vector<float> taps;  // [N, nT * D]: the last forward call's taps (rows of its batch)
  // The last forward call's sequences and snapshot saves (`step` keeps its row metadata).
  std::vector<ForwardSeq> fw_seqs;
  std::vector<WindowSave> fw_saves;
  Step seed_step;                   // the kept rows entering the draft rings
  Step draft_step;                  // the draft block's rows
  std::vector<int32_t> draft_slot;  // per draft sequence: its KV slot
  // The vision tower's linears (model/vision.cpp), prepared on the first image.
  std::vector<PreparedLinear> vision_lin;
  std::vector<float> vision_patch_w;  // [Dv, 3 p^2]: the patch embedding's weight as floats
  std::vector<float> image_delims;    // [3, D]: image_start, image_newline, image_end
  uint64_t prepared_bytes = 0;
  std::vector<const PreparedLinear*> prepared;  // every present one, in construction order
  // Every per-step buffer: sublayers allocate on it under an ArenaScope (core/arena.h), and the
  // step's row metadata keeps its capacity from call to call, so a step of a shape seen before
  // makes no heap allocation.
  Arena arena;
  Step step;

  void round(float* x, int64_t n) const;
  // Rotates the RoPE tails of x [N, n_heads, head_dim] by the angles of each row's position
  // (inverse: back) and rounds them; the rest of x must be rounded already (every caller passes
  // a projection's or the attention's rounded output).
  void rope_rows(const Step& st, const RopeTable& t, float* x, int64_t n_heads, int64_t head_dim,
                 bool inverse = false);
  // x [n, d] rounded, RMS-normed with `w` (kernels/elementwise.h) and rounded again.
  void round_norm(float* x, int64_t n, int64_t d, const Weight& w) const;
  // y [n, w.rows()] = w applied to x [n, w.cols()], rounded, or (with `norm`) round-normed.
  void project(const PreparedLinear& w, const float* x, int64_t n, float* y,
               const Weight* norm = nullptr);
  // Does this rank hold compressed row `row` of `layer`?
  bool owns_row(const Step& st, int layer, int64_t row) const {
    return opt.parallel.context->owns_block(row * roles[size_t(layer)].ratio /
                                            st.kv->block_tokens());
  }
  // Activation `name` of layer `layer` (-1: none) to the sink, when this call dumps; builds
  // nothing otherwise.
  template <typename T>
  void dump(const Step& st, int layer, const char* name, const T* data,
            std::initializer_list<int64_t> shape) const {
    if (st.dump) sink->put(layer < 0 ? name : str_cat("L", layer, ".", name), data, shape);
  }

  // Backbone layer l, or draft stage l - n_layers.
  const LayerWeights& weights(int l) const {
    return l < c.n_layers ? ck.layers[size_t(l)] : ck.dspark.stages[size_t(l - c.n_layers)];
  }

  void forward(const ForwardBatch& batch, KvCache& kv, float* logits);
  void draft(std::span<const DraftSeq> seqs, KvCache& kv, DraftOutput& out);
  // Embedding rows of `tokens` replicated into the copies, pre-mix one-hot on copy 0.
  // Image rows (image[i] non-null) take their embedding from there.
  void embed_rows(const int32_t* tokens, Stream& b, int64_t N, const float* const* image = nullptr);
  // b.u rows [r0, r1) = norm(hc_pre(xs, pre)), rounded as the spec says.
  void collapse(Stream& b, const float* xs, const float* pre, const Weight& norm, int64_t r0,
                int64_t r1);
  // Block l (backbone layer or draft stage) on the stream, with the single-pass hc schedule.
  void block(int l, Step& st, Stream& b);
  void prepare_step(Step& st, const ForwardBatch& batch, KvCache& kv);
  void engram_ids(Step& st);

  // Sublayers. Inputs/outputs are [N, ...] row-major fp32 arrays.
  void engram_layer(int l, Step& st, float* x /*[N, M, D]*/);
  void attention(int l, Step& st, const float* u /*[N, D]*/, float* out /*[N, D]*/);
  void compressor(int l, Step& st, const float* u);
  void indexer(int l, Step& st, const float* u, const float* qr /*[N, Q]*/);
  void moe(int l, Step& st, const float* v /*[N, D]*/, float* out /*[N, D]*/);
  // The attention half's parts (attention.cpp), for backbone layers and draft stages: the query
  // qr [N, Q] and q [N, H, Dh]; the window keys kv [N, Dh] (fp8 values) and their packed rows;
  // the output projection of o [N, H, Dh] (rotated back in place).
  void query(int l, Step& st, const RopeTable& rope, const float* u, float* qr, float* q);
  void window_keys(int l, Step& st, const RopeTable& rope, const float* u, float* kv,
                   uint8_t* packed);
  void output(int l, Step& st, const RopeTable& rope, float* o, float* out);
  // Layer l's window ring of the sequence in `slot`, whose rows for positions [s0, s0 + n) are
  // the packed `rows`: the snapshots in `saves` of sequence `seq` whose boundary lies in those
  // rows take their entries, then the ring takes the rows.
  void advance_ring(int l, KvCache& kv, int32_t slot, int64_t s0, int64_t n, const uint8_t* rows,
                    std::span<const WindowSave> saves, int32_t seq);
  // The draft stage l's attention: queries of the draft block over the stage's ring and the
  // block's own keys (docs/numerics.md).
  void draft_attention(int l, Step& st, const float* u, float* out);
};

}  // namespace deepinfer
