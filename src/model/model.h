// The DeepSeek-V4.1 text model (V41_SPEC.md §4-§12): weights from a Checkpoint, one forward pass
// over a ForwardBatch of sequences, caches in a KvCache. The model computes; it does not know
// where requests come from or how tokens are sampled, and it writes KV only at the rows and
// slots the batch names.
//
// Numerics: Numerics::Bf16 follows the spec's contract (bf16 activations and caches, fp32 where
// it says); Numerics::Fp32 keeps every fp8/fp4 quantization but holds activations in fp32.
// Every reduction has a fixed order (kernels/reduce.h), so a token's logits are bit-identical
// whatever else is in the batch and however its prompt was chunked.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/npy.h"
#include "kv/kv_cache.h"
#include "ranks/group.h"

namespace deepinfer {

// The input of one model step (DESIGN.md §1, §4.5). Built by the runner from the scheduler's
// output, read by Model::forward. Plain data: nothing here owns KV bytes or knows about requests.
//
// A step holds several sequences, each a run of consecutive tokens at positions
// [start_pos, start_pos + n_tokens): a prompt chunk starting anywhere (start_pos > 0 included) or
// one decode token. Tokens of all sequences are flattened into `tokens` in sequence order.
// Rows [n_tokens - n_padding, n_tokens) of a sequence are placeholders (prefill buckets): they are
// computed like any row but write no state and are seen by no real token.
struct ForwardSeq {
  int64_t start_pos = 0;  // position of the sequence's first token in this step
  int64_t n_tokens = 0;   // rows of this sequence in the step (real + padding)
  int64_t n_padding = 0;  // trailing placeholder rows
  SeqKv kv;               // its slot and block table
  // Logits are produced for rows [logits_from, n_tokens - n_padding) of this sequence
  // (n_tokens - n_padding for none, n_tokens - n_padding - 1 for the last real token).
  int64_t logits_from = 0;
  // Prefix caching: before the step, the slot's rings and Engram history come from this KV-cache
  // snapshot (taken at start_pos); -1: none.
  int32_t restore = -1;
  // Speculative decoding: before the step, the slot's state is put back from its backup
  // (`rollback`: drafts of the previous step were rejected) and then backed up (`backup`: this
  // step verifies drafts).
  bool rollback = false, backup = false;
};

// Prefix caching: snapshot `snap` takes the rings and Engram history of sequence `seq` (an index
// into ForwardBatch::seqs) as they stand after position `boundary` - 1, which the sequence's
// rows of this step cover (start_pos < boundary <= start_pos + real rows).
struct WindowSave {
  int32_t seq = 0;
  int64_t boundary = 0;
  int32_t snap = 0;
};

struct ForwardBatch {
  std::vector<int32_t> tokens;  // [total rows]
  // Image-span rows (docs/vision.md): empty, or [total rows] with the row's embedding (dim
  // values, Model::encode_image's rows or the span delimiters) for rows of an image span and null
  // for text. Image rows route with bias_vl and are dead to Engram (gate 0, no n-gram reaches
  // across them).
  std::vector<const float*> image_embeds;
  std::vector<ForwardSeq> seqs;   // in the order their rows appear in `tokens`
  std::vector<WindowSave> saves;  // taken in this order (a later one may reuse a snapshot)

  int64_t n_rows() const { return int64_t(tokens.size()); }
  int64_t n_logit_rows() const {
    int64_t n = 0;
    for (const auto& s : seqs) n += s.n_tokens - s.n_padding - s.logits_from;
    return n;
  }
};

// --- parallelism ---
// How one rank shares the model with others: two strategies the model asks instead of looking at
// rank counts (engine/parallel.cpp builds them once from the RankLayout). Without a group they are
// the single-rank case. Every collective keeps results bit-identical to a single rank in fp32
// numerics: partial sums travel as the terms a single rank would add, in its order.
struct SparseAttnArgs;

// The routed experts' rows. The model routes its rows, fills the slots of the experts this rank
// holds for the rows dispatch() names, and combine() completes every one of its rows' slots.
// No group: every expert is here. A group, dispatch = false: experts split over ranks with the
// same rows, the slots are summed with one all-reduce. dispatch = true: experts split over ranks
// with different rows (data parallelism), everyone's rows are gathered to the experts and the
// slots go back with a reduce-scatter.
class ExpertExchange {
 public:
  struct Rows {
    const float* x;        // [n, D]
    const int32_t* ids;    // [n, k] routes
    const float* weights;  // [n, k]
    int64_t n;
    float* slots;  // [n, k, D], zeroed; this rank's experts fill theirs
  };
  explicit ExpertExchange(ranks::Group* g = nullptr, bool dispatch = false)
      : g_(g), dispatch_(dispatch) {}
  bool all_local() const { return !g_; }
  Rows dispatch(const Rows& mine, int64_t k, int64_t dim);
  void combine(const Rows& mine, int64_t k, int64_t dim);

 private:
  ranks::Group* g_;
  bool dispatch_;
  std::vector<float> xs_, ws_, slots_;  // dispatch: everyone's rows
  std::vector<int32_t> ids_;
  std::vector<int64_t> count_;  // dispatch: each member's row count
};

// Where a sequence's compressed KV and index keys live and how attention over them comes
// together. No group: all of them are here. A group (context parallelism): block i of every
// sequence on group rank i mod size; replica rank 0 takes the window; the attention partials are
// merged exactly over the group.
class ContextShard {
 public:
  explicit ContextShard(ranks::Group* g = nullptr) : g_(g) {}
  // Ranks whose candidate lists are merged (all_gather lays them side by side).
  int parts() const { return g_ ? g_->size() : 1; }
  void all_gather(const void* mine, size_t bytes, void* all);
  // Does this rank hold KV block `block` of a sequence?
  bool owns_block(int64_t block) const { return !g_ || block % g_->size() == g_->rank(); }
  // Does this rank attend over the sliding window (one rank of a group does)?
  bool attends_window() const { return !g_ || g_->rank() == 0; }
  // Attention of `rows` rows over the keys this rank holds, row by row (attend runs for
  // different rows at once, on the pool's threads); end_attention leaves the complete results
  // in the rows' outputs.
  void begin_attention(int64_t rows, int64_t heads, int64_t dim);
  void attend(int64_t row, const SparseAttnArgs& a);
  // attend() leaves partial statistics, not the row's output, until end_attention.
  bool partial() const { return g_ != nullptr; }
  void end_attention(const float* sink, bool exact, float* out);

 private:
  ranks::Group* g_;
  int64_t rows_ = 0, heads_ = 0, dim_ = 0, psize_ = 0;
  std::vector<double> partial_, all_;
};

struct ModelParallel {
  std::shared_ptr<ExpertExchange> experts = std::make_shared<ExpertExchange>();
  std::shared_ptr<ContextShard> context = std::make_shared<ContextShard>();
  // Engram tables sharded by rows over this group (ranks with the same tokens): each rank reads
  // only its rows and the lookups are summed. Null: every rank reads the rows it needs.
  ranks::Group* engram = nullptr;
};

// --- the model ---

struct ImageJob;  // one image's progress through the vision tower (model/vision.cpp)

enum class Numerics { Bf16, Fp32 };

struct ModelOptions {
  Numerics numerics = Numerics::Bf16;
  ModelParallel parallel;
  // Reproduce the public demo's decode-time index-key sharing (V41_SPEC.md §6.8) instead of the
  // prefill semantics. For comparisons only.
  bool demo_decode_defect = false;
  // Engram compressed token map (raw id -> compressed id); empty = identity (no tokenizer).
  std::vector<int32_t> engram_token_map;
  // Prepare the DSpark draft head (the checkpoint must have one): forward calls then record the
  // taps it reads, and draft() runs it.
  bool dspark = false;
};

// The DSpark draft head (V41_SPEC.md §10.4, docs/numerics.md). After a forward call, each of its
// sequences keeps its first `kept` real rows (their positions enter the draft head's window
// rings, held in the KV cache's draft layers) and, given the token sampled after them, drafts
// block-size tokens from the position of its last kept row.
struct DraftSeq {
  int32_t seq = 0;     // index into the last forward call's ForwardBatch::seqs
  int64_t kept = 0;    // its first `kept` real rows are kept (>= 1 to draft)
  int32_t token = -1;  // the token sampled after them (the draft block's first); -1: only keep
};
struct DraftOutput {
  bool want_logits = false;       // also fill logits and confidence
  int slots = 0;                  // S: drafts wanted per sequence (0: all B)
  std::vector<int32_t> tokens;    // [drafting seqs, S]: greedy drafts, in DraftSeq order
  std::vector<float> logits;      // [drafting seqs, S, vocab]: each slot's logits, Markov bias in
  std::vector<float> confidence;  // [drafting seqs, S]
};

// Per-layer activation dumps (DESIGN.md §4.8) for debugging and layer-by-layer tests: each
// forward call's activations as .npy files <dir>/call<k>/<name>.npy (k = 0, 1, ...), names like
// "L3.attn.q" with the rows of one sequence first.
class NpyActivationDump {
 public:
  explicit NpyActivationDump(std::string dir) : dir_(std::move(dir)) {}
  void begin_call();     // at the start of every forward call that dumps
  template <typename T>  // float or int32_t
  void put(const std::string& name, const T* data, const std::vector<int64_t>& shape) {
    npy_write(call_dir_ + "/" + name + ".npy", data, shape);
  }

 private:
  std::string dir_, call_dir_;
  int calls_ = 0;
};

class Model {
 public:
  Model(const Checkpoint& ck, ModelOptions opt);
  ~Model();

  const ModelConfig& config() const;
  // Bytes of the linear weights repacked for the fast kernels at construction (the rest of the
  // weights stay mapped from the checkpoint).
  uint64_t prepared_weight_bytes() const;
  // The repacked buffers themselves, in layer order.
  std::vector<std::span<const uint8_t>> prepared_weight_spans() const;

  // Runs one step. `logits` receives [batch.n_logit_rows(), vocab] fp32 rows in sequence order.
  // Resets the sequence-slot state it needs when a sequence starts at position 0.
  void forward(const ForwardBatch& batch, KvCache& kv, float* logits);

  // The vision tower (docs/vision.md): present when the checkpoint has one.
  bool has_vision() const;
  // One image through the ViT and the aligner: patches bf16 [vit_h * vit_w, 3 p^2] (as
  // vision::preprocess makes them) -> out [ceil(vit_h / r) * ceil(vit_w / r), dim], the image
  // tokens' embeddings in reading order, in the activation dtype. Not concurrent with itself.
  void encode_image(const uint16_t* patches, int64_t vit_h, int64_t vit_w, std::vector<float>& out);
  // The same in stages (the patch embedding, each block, the aligner), for a caller that
  // interleaves other work: advance_image runs the next stage and returns true once `out` holds
  // the rows. The patches must outlive the job.
  std::shared_ptr<ImageJob> begin_image(const uint16_t* patches, int64_t vit_h, int64_t vit_w);
  bool advance_image(ImageJob& job, std::vector<float>& out);
  // The embedding of a span delimiter (vision::ImageTokenType kImageStart, kImageNewLine,
  // kImageEnd): dim values.
  const float* image_delimiter(int type) const;

  // The draft head: present when ModelOptions::dspark asked for it; B tokens per draft.
  bool has_draft_head() const;
  int draft_block_size() const;
  // Keeps rows of the last forward call and drafts (DraftSeq). The cache must be the one that
  // call used, with the draft layers (KvCacheOptions::draft_layers = n_mtp_layers). Once per
  // forward call when that call takes prefix-cache snapshots (a second call would copy ring
  // entries the first one already moved on); keeping the same rows again is harmless otherwise.
  void draft(std::span<const DraftSeq> seqs, KvCache& kv, DraftOutput& out);

  // Per-layer activation dumps of the next forward calls (nullptr to stop). Only for batches of
  // one sequence.
  void set_activation_sink(NpyActivationDump* sink);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer
