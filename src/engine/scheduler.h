// The scheduler: which tokens of which requests run in the next step (rule at the top of
// scheduler.cpp). It owns the waiting and running queues, the token budgets, chunking, buckets and
// preemption, and the block bookkeeping of every sequence; it never touches tensors.
//
// Its output, SchedOutput, is a plain struct that describes a step completely for the runner and
// for follower ranks that replay it: per scheduled sequence the step's input tokens, positions,
// padding, whether its last row is sampled, and the change to its block table since the previous
// step (blocks appended, or a fresh table after admission or preemption).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/request.h"
#include "grammar/grammar.h"
#include "kv/block_pool.h"

namespace deepinfer {

// A request in flight: its tokens (prompt then generated), how many the model has computed, and
// the KV it holds. Owned by the Scheduler; the Sampler reads its history.
struct Sequence {
  Request req;
  uint64_t arrival = 0;         // admission order (FCFS)
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t num_prompt = 0;
  int64_t num_computed = 0;     // tokens whose KV is in the cache
  std::vector<int32_t> blocks;  // block table
  int32_t slot = -1;            // fixed-state slot while running, -1 while waiting
  size_t blocks_sent = 0;       // blocks already announced to the runner (0: it starts afresh)
  std::vector<TopLogprobs> logprobs;
  FinishReason finish = FinishReason::None;
  std::string stop_text;
  std::unique_ptr<grammar::Matcher> matcher;  // with a grammar: where the output stands in it
  // Prefix caching: chain hashes of its full blocks, how many leading blocks are in the cache
  // (taken from it, or entered once computed), and the snapshot its next step starts from.
  std::vector<uint64_t> block_hashes;
  size_t blocks_cached = 0;
  int32_t restore = -1;
  // Speculative decoding: this step's drafts, and whether its slot state goes back to the
  // backup taken before the previous step (drafts were rejected: their rows are recomputed).
  std::vector<int32_t> drafts;
  bool rollback = false;
  int64_t drafted = 0, accepted = 0;
  // DSpark: the draft head's block for the sequence's newest token (empty: none), which the
  // engine sets after each step and the next decode step proposes from.
  std::vector<int32_t> model_drafts;
  // Back-off while drafts keep missing: verify steps in a row that accepted nothing, and decode
  // steps left before the next drafts (Scheduler::note_acceptance).
  int32_t spec_misses = 0, spec_pause = 0, spec_pause_len = 0;
  // Images: the embedding of each prompt position of an image span (null for text), into
  // image_rows or the model's delimiters, and a key of it (0 for text) that the prefix cache's
  // block hashes take in (the span's token ids do not tell images apart).
  std::vector<float> image_rows;
  std::vector<const float*> image_at;
  std::vector<uint64_t> image_keys;

  bool running() const { return slot >= 0; }

  int64_t num_generated() const { return int64_t(tokens.size()) - num_prompt; }
  // Tokens still to compute before the next token can be sampled.
  int64_t num_pending() const { return int64_t(tokens.size()) - num_computed; }
};

struct SchedulerConfig {
  int32_t max_num_seqs = 16;
  int64_t max_num_batched_tokens = 2048;  // rows per step, padding included
  int64_t max_num_prefill_tokens = 2048;  // prompt rows per step
  int64_t max_model_len = 4096;           // prompt + generated tokens per request
  int64_t block_tokens = 64;
  int64_t prefill_bucket = 0;     // pad prompt chunks to this many rows (0 = off)
  bool prompt_as_decode = false;  // prompt rows laid out as decode rows (one per step)
  // Speculative decoding: up to this many drafts per decode step (0: off), from the model's
  // draft head (`dspark`, Sequence::model_drafts) or by n-gram lookup (matching the last
  // n <= ngram_max tokens earlier in the sequence).
  int32_t num_speculative_tokens = 0;
  int32_t ngram_max = 3;
  bool dspark = false;
};

struct SchedSeq {
  uint64_t seq_id = 0;
  int32_t slot = -1;
  int64_t start_pos = 0;
  std::vector<int32_t> tokens;      // this step's real input tokens
  int64_t n_padding = 0;            // placeholder rows after them
  bool reset_blocks = false;        // the block table starts afresh with new_blocks
  std::vector<int32_t> new_blocks;  // appended to the block table
  bool sample = false;              // the last real row's logits pick the next token
  bool decode = false;              // the sequence's only pending token (else a prompt chunk)
  // Prefix caching: the slot state to start from (a cache hit; -1: none), and the snapshots to
  // take at the block boundaries this step's rows complete.
  int32_t restore = -1;
  // Speculative decoding: the last `n_drafts` tokens are drafts, and every row from the last
  // real token's on is sampled; `backup`: back the slot state up first (drafts to verify);
  // `rollback`: put it back first (the previous step's drafts were rejected).
  int32_t n_drafts = 0;
  bool backup = false, rollback = false;
  struct Save {
    int64_t boundary = 0;
    int32_t snap = 0, unused = 0;
  };
  std::vector<Save> saves;
  // Image-span rows: the embedding of positions [0, image_len) (null for text), or null.
  const float* const* image_at = nullptr;
  int64_t image_len = 0;
};

struct SchedOutput {
  std::vector<SchedSeq> seqs;
  std::vector<uint64_t> released;  // sequences whose block tables the runner may drop
  bool empty() const { return seqs.empty(); }
};

// splitmix64's finaliser: the prefix cache's block hashes and the sampler's counter-based draws.
inline uint64_t splitmix_finalise(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Prefix caching (DESIGN.md §1): full KV blocks stay cached after their sequences end, keyed by a
// hash chain of the tokens up to their end, and a new sequence whose prompt starts with cached
// blocks takes them (shared, read-only, reference-counted in the BlockPool) instead of computing
// them again. Pure bookkeeping: the Scheduler moves blocks, the model moves bytes.
//
// A V4.1 sequence's state at a position is more than its blocks: the window rings of every layer
// and the Engram n-gram history live in its slot. So a block boundary can only be resumed from
// when a snapshot of that slot state was taken there (the compressor carry is empty at a block
// boundary: blocks hold whole compressed groups). Snapshots are taken when a block completes and
// kept in a fixed number of KV-cache snapshot buffers, least recently used first out; a hit is
// the longest run of cached blocks from the start whose last block still has its snapshot.
//
// Blocks nobody holds stay in the pool's free queue and go, least recently released first, when
// the pool needs blocks; their entries (and snapshots) are dropped then. Entries are matched on
// the parent's hash and the block's own tokens, so a hash collision cannot give wrong content.
// One cache serves one engine: the model, its numerics and its Engram map never change under it.
class PrefixCache {
 public:
  // Blocks of `block_tokens` tokens in `n_pools` pools (context-parallel ranks: block i of a
  // sequence in pool i mod n_pools) of `blocks_per_pool` blocks; `num_snapshots` 0: disabled.
  PrefixCache(int64_t block_tokens, int32_t n_pools, int32_t blocks_per_pool,
              int32_t num_snapshots);
  bool enabled() const { return !snap_owner_.empty(); }

  // Appends the chain hashes of the full blocks of `tokens` not yet in `hashes` (hash i covers
  // tokens [0, (i + 1) * block_tokens)). `keys` (non-zero at image-span positions) enter the
  // hash too, so that spans of different images never share blocks.
  void extend_hashes(std::span<const int32_t> tokens, std::vector<uint64_t>* hashes,
                     std::span<const uint64_t> keys = {}) const;

  struct Hit {
    std::vector<int32_t> blocks;  // block i in pool i mod n_pools
    int32_t snapshot = -1;        // the slot state after the last of them
  };
  // The longest cached prefix of `tokens` made of blocks 0 .. n - 1 with a snapshot after block
  // n - 1, at most `max_blocks` long; `hashes` as extend_hashes made them. The caller must hold
  // the blocks before the pool hands out another block.
  Hit lookup(std::span<const int32_t> tokens, std::span<const uint64_t> hashes, int64_t max_blocks);

  // A snapshot buffer for the state after a block about to complete (the least recently used,
  // whatever it held); the caller adds the block with publish() once the step that fills it ran.
  int32_t take_snapshot();
  // Enters block `index` of a sequence (`block` in its pool, full, its tokens `block_tokens`) with
  // the snapshot taken after it; false (the snapshot is freed) when an equal block is cached.
  bool publish(std::span<const uint64_t> hashes, size_t index, std::span<const int32_t> tokens,
               int32_t block, int32_t snapshot);
  // The pool is reusing `block` of pool `pool`: forgets what it held.
  void evict(int32_t pool, int32_t block);

 private:
  struct Entry {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    int32_t block = -1, snapshot = -1;
  };

  int64_t block_tokens_;
  int32_t n_pools_, blocks_per_pool_;
  std::unordered_map<uint64_t, Entry> entries_;  // by chain hash
  std::vector<std::optional<uint64_t>> key_of_;  // [pool * blocks_per_pool + block] -> entry key
  std::vector<std::optional<uint64_t>> snap_owner_;  // [snapshot] -> entry key
  std::vector<uint64_t> snap_used_;                  // [snapshot] last use (0: never)
  uint64_t tick_ = 0;
};

struct SchedulerStats {
  int64_t preemptions = 0;
  int32_t peak_blocks_used = 0;
  // Prefix caching: admissions that looked the prompt up, those that found a cached prefix, and
  // the tokens they did not compute.
  int64_t prefix_queries = 0, prefix_hits = 0, prefix_hit_tokens = 0;
  // Speculative decoding: steps that verified drafts, drafts proposed, drafts accepted.
  int64_t spec_steps = 0, spec_drafted = 0, spec_accepted = 0;
};

class Scheduler {
 public:
  // `num_blocks` per context-parallel rank, `cp` ranks.
  // One sequence slot per running sequence (max_num_seqs). `num_snapshots` > 0: prefix caching
  // with that many slot-state snapshots (PrefixCache).
  Scheduler(const SchedulerConfig& cfg, int32_t num_blocks, int32_t cp = 1,
            int32_t num_snapshots = 0);

  // Queues a request (with a grammar, its sequence gets a matcher); returns "" or the reason it
  // can never run (too long for the model or pool).
  std::string add(Request req);
  // The reason add() would refuse `req`, without queueing it ("" when it would not).
  std::string check(const Request& req) const;
  // With allow_prefill false only decode rows run (data-parallel ranks that voted against a
  // prefill step).
  // `out` is overwritten; reusing one object from step to step keeps its buffers.
  void schedule(SchedOutput& out, bool allow_prefill = true);
  // True when some sequence has prompt (or recomputation) rows pending.
  bool wants_prefill() const;
  // After the model ran `out`: advances computed counts and appends the tokens picked. The i-th
  // sampling sequence of `out` (in order) gets the next `counts[i]` tokens of `sampled`: with
  // drafts, those accepted and then the model's own (fewer than n_drafts + 1: some rejected, and
  // its rows are computed again). Returns those sequences in the same order (valid until the
  // next call).
  const std::vector<Sequence*>& update(const SchedOutput& out, const std::vector<int32_t>& sampled,
                                       const std::vector<int32_t>& counts);
  // Ends a sequence (stop condition, abort): frees its blocks and slot.
  void finish(Sequence* s, FinishReason why);
  bool abort(RequestId id);  // false if unknown or already finished
  Sequence* find(RequestId id);
  // Finished sequences are handed out once and then forgotten.
  std::vector<std::unique_ptr<Sequence>> take_finished() { return std::exchange(finished_, {}); }
  // Whether the next decode step of `s` may take drafts (speculation on, no stop strings, not
  // paused), the tail a rejection leaves aside.
  bool may_draft(const Sequence& s) const {
    return cfg_.num_speculative_tokens > 0 && s.req.params.stop.empty() && s.spec_pause == 0;
  }

  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int32_t blocks_used() const;
  int32_t blocks_total() const { return int32_t(pools_.size()) * pools_[0].num_blocks(); }
  const SchedulerStats& stats() const { return stats_; }

 private:
  // The tokens of KV a sequence's blocks plus the free ones it can reach would hold; allocation
  // of the blocks missing for `tokens` (they must be free).
  int64_t room(const Sequence* s) const;
  BlockPool& pool_of(size_t block_index) { return pools_[block_index % pools_.size()]; }
  void grow_blocks(Sequence* s, int64_t tokens);
  // Gives a sequence's blocks back (and forgets what its next step was to restore).
  void release_blocks(Sequence* s);
  // A running sequence stops running: its blocks and slot go back.
  void release(Sequence* s);
  void preempt(Sequence* s);
  // Prefix caching: a waiting sequence takes the cached blocks its tokens start with (false:
  // none; release_blocks gives them back when it is not admitted after all).
  bool take_hit(Sequence* s);
  // Speculative decoding: up to `n` drafts for `s` into s->drafts.
  void propose(Sequence* s, int64_t n);
  // After a verify step of `s` that accepted `accepted` drafts: drafting pauses after
  // kMissesBeforePause verify steps in a row accepted none, for 1, 2, 4, ... 64 decode steps,
  // each further miss doubling the pause, until a draft stands again.
  void note_acceptance(Sequence* s, int64_t accepted);
  // The snapshots and cache entries of the blocks that `q`'s rows of `s` complete.
  void plan_saves(Sequence* s, SchedSeq& q, size_t q_index, SchedOutput& out);

  SchedulerConfig cfg_;
  // KV blocks of a context-parallel group: one pool per CP rank, all of the same size. A
  // sequence's i-th block lives on rank i mod cp (block ids are local to that rank's pool), so its
  // compressed KV is spread evenly and the group holds cp times the context of one rank.
  std::vector<BlockPool> pools_;
  PrefixCache cache_;
  // Blocks completed by the step being scheduled, entered in the cache once it ran.
  struct Pending {
    Sequence* seq;
    size_t index;     // block index in the sequence
    int32_t snap;     // -1: its snapshot went to a later block of the same step
    size_t q, saves;  // its save: out.seqs[q].saves[saves]
  };
  std::vector<Pending> pending_;
  std::vector<int32_t> free_slots_;
  uint64_t next_arrival_ = 0;
  std::unordered_map<RequestId, std::unique_ptr<Sequence>> seqs_;
  std::deque<Sequence*> waiting_;   // FCFS by arrival
  std::vector<Sequence*> running_;  // FCFS by arrival
  std::vector<uint64_t> released_;
  std::vector<std::unique_ptr<Sequence>> finished_;
  SchedulerStats stats_;
  // Per-step working lists, kept for their capacity.
  std::vector<std::pair<Sequence*, int64_t>> picked_;  // sequence, real rows
  std::vector<Sequence*> order_, sampled_seqs_;
};

}  // namespace deepinfer
