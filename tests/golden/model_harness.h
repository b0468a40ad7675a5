// Test helpers: synthetic checkpoints cached across test runs, and a driver that feeds sequences
// to Model::forward in chosen chunkings and batch compositions.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace deepinfer::testing {

// The checkpoint directory of `model` (weights seed `seed`), created once under the test cache.
// `model` is a preset name or `random-<config seed>` (io/tiny.h's random_tiny_config), with
// `+vision` for a vision tower and `@runtime` for the runtime layout (default: release).
std::string preset_dir(const std::string& model, uint64_t seed = 0);

struct LoadedModel {
  std::unique_ptr<Checkpoint> ck;
  std::unique_ptr<Model> model;
};
// With `dspark`, the model runs its draft head (the checkpoint must have one).
LoadedModel load_model(const std::string& preset, Numerics numerics, bool defect = false,
                       bool dspark = false);

// Logits of every position of `tokens`, fed as consecutive chunks of the given sizes (summing to
// the length) through a fresh cache slot, with the image-span rows' embeddings when given
// (ForwardBatch::image_embeds, one per token). Returns [n, vocab].
std::vector<float> run_chunks(Model& m, const std::vector<int32_t>& tokens,
                              const std::vector<int64_t>& chunks,
                              const std::vector<const float*>& image_embeds = {});
// One step holding several sequences at once: each sequence i is fed its chunk
// [starts[i], starts[i] + lens[i]) after earlier chunks were fed alone. Returns per sequence the
// logits of its rows in that step.
std::vector<std::vector<float>> run_batched(Model& m, const std::vector<std::vector<int32_t>>& seqs,
                                            const std::vector<int64_t>& prefix_lens);

// A sequence fed step by step through one cache slot. With a draft head, every fed row enters
// the draft rings.
class Session {
 public:
  Session(Model& m, int64_t max_tokens);
  // Feeds `tokens` as one chunk at the current position; returns their logits [n, vocab].
  std::vector<float> feed(const std::vector<int32_t>& tokens);
  // DSpark drafts from the last position fed, with `token` sampled there.
  void draft(int32_t token, DraftOutput& out);
  int64_t pos() const { return pos_; }

 private:
  Model& m_;
  std::vector<int32_t> blocks_;
  int64_t per_seq_ = 0, pos_ = 0, last_n_ = 0;
  std::unique_ptr<KvCache> kv_;
};

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed);
std::string run_command(const std::string& cmd);  // runs a shell command, throws on failure

}  // namespace deepinfer::testing
