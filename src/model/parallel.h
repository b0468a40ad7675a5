// How one rank shares the model with others: two strategies the model asks instead of looking at
// rank counts (engine/parallel.cpp builds them once from the RankLayout). The base classes are
// the single-rank case. Every collective keeps results bit-identical to a single rank in fp32
// numerics: partial sums travel as the terms a single rank would add, in its order.
#pragma once

#include <cstdint>
#include <memory>

#include "ranks/group.h"

namespace deepinfer {

struct SparseAttnArgs;

// The routed experts' rows. The model routes its rows, fills the slots of the experts this rank
// holds for the rows dispatch() names, and combine() completes every one of its rows' slots.
// Base: every expert is here.
class ExpertExchange {
 public:
  struct Rows {
    const float* x;        // [n, D]
    const int32_t* ids;    // [n, k] routes
    const float* weights;  // [n, k]
    int64_t n;
    float* slots;  // [n, k, D], zeroed; this rank's experts fill theirs
  };
  virtual ~ExpertExchange() = default;
  virtual bool all_local() const { return true; }
  virtual Rows dispatch(const Rows& mine, int64_t k, int64_t dim) { return mine; }
  virtual void combine(const Rows& mine, int64_t k, int64_t dim) {}
};
// Experts split over ranks with the same rows: the slots are summed with one all-reduce.
std::shared_ptr<ExpertExchange> static_moe(ranks::Group& g);
// Experts split over ranks with different rows (data parallelism): everyone's rows are gathered
// to the experts and the slots go back with a reduce-scatter.
std::shared_ptr<ExpertExchange> ep_dispatch(ranks::Group& g);

// Where a sequence's compressed KV and index keys live and how attention over them comes
// together. Base: all of them are here.
class ContextShard {
 public:
  virtual ~ContextShard() = default;
  // Ranks whose candidate lists are merged (all_gather lays them side by side).
  virtual int parts() const { return 1; }
  virtual void all_gather(const void* mine, size_t bytes, void* all);
  // Does this rank hold KV block `block` of a sequence?
  virtual bool owns_block(int64_t block) const { return true; }
  // Does this rank attend over the sliding window (one rank of a group does)?
  virtual bool attends_window() const { return true; }
  // Attention of `rows` rows over the keys this rank holds, row by row; end_attention leaves
  // the complete results in the rows' outputs.
  virtual void begin_attention(int64_t rows, int64_t heads, int64_t dim) {}
  virtual void attend(int64_t row, const SparseAttnArgs& a);
  virtual void end_attention(const float* sink, bool exact, float* out) {}
};
// Context parallelism: block i of every sequence on group rank i mod size; replica rank 0 takes
// the window; the attention partials are merged exactly over the group.
std::shared_ptr<ContextShard> cp_shard(ranks::Group& g);

struct ModelParallel {
  std::shared_ptr<ExpertExchange> experts = std::make_shared<ExpertExchange>();
  std::shared_ptr<ContextShard> context = std::make_shared<ContextShard>();
  // Engram tables sharded by rows over this group (ranks with the same tokens): each rank reads
  // only its rows and the lookups are summed. Null: every rank reads the rows it needs.
  ranks::Group* engram = nullptr;
};

}  // namespace deepinfer
