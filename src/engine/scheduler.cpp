// Scheduling rule. Every sequence has `num_computed` tokens catching up to `tokens.size()`; a step
// advances some of them, under a row budget (max_num_batched_tokens, bucket padding included), a
// prompt-row budget (max_num_prefill_tokens) and at most max_num_seqs running sequences:
//   1. running sequences with one pending token (decode rows) first, oldest arrival first, each
//      with up to num_speculative_tokens drafts after it (and, after a rejected draft, with the
//      accepted tokens it computes again; drafts only while those are at most that many);
//   2. then running sequences still catching up on their prompt, oldest first, each one chunk of
//      min(pending, remaining budgets, bucket size, what fits in the free KV blocks) rows (one row
//      with prompt-as-decode);
//   3. then waiting sequences, oldest first, admitted with such a chunk while a slot and the
//      budgets allow (after the prefix cache's hit, if any); admission stops at the first that
//      cannot start (strict FCFS), and a step that preempted admits nobody.
// A row is a decode row when it is its sequence's only pending token.
// A running sequence that cannot place even one token preempts the newest running sequence (its
// blocks are freed and it is recomputed later from its tokens), repeating until the token fits or
// it is itself the newest, in which case it is preempted. Waiting sequences hold no blocks and
// never preempt. A chunk's last row is sampled when it completes the sequence's pending tokens.
#include "engine/scheduler.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace deepinfer {

PrefixCache::PrefixCache(int64_t block_tokens, int32_t n_pools, int32_t blocks_per_pool,
                         int32_t num_snapshots)
    : block_tokens_(block_tokens),
      n_pools_(n_pools),
      blocks_per_pool_(blocks_per_pool),
      key_of_(size_t(n_pools) * size_t(blocks_per_pool)),
      snap_owner_(size_t(num_snapshots)),
      snap_used_(size_t(num_snapshots), 0) {}

void PrefixCache::extend_hashes(std::span<const int32_t> tokens, std::vector<uint64_t>* hashes,
                                std::span<const uint64_t> keys) const {
  const size_t B = size_t(block_tokens_);
  for (size_t i = hashes->size(); (i + 1) * B <= tokens.size(); ++i) {
    uint64_t h =
        splitmix_finalise((i ? (*hashes)[i - 1] : uint64_t(block_tokens_)) + 0x9e3779b97f4a7c15ull);
    for (size_t t = i * B; t < (i + 1) * B; ++t) {
      h = splitmix_finalise(h ^ uint32_t(tokens[t]));
      if (t < keys.size() && keys[t]) h = splitmix_finalise(h ^ keys[t]);
    }
    hashes->push_back(h);
  }
}

PrefixCache::Hit PrefixCache::lookup(std::span<const int32_t> tokens,
                                     std::span<const uint64_t> hashes, int64_t max_blocks) {
  Hit hit;
  if (!enabled()) return hit;
  const size_t B = size_t(block_tokens_);
  size_t usable = 0;  // blocks up to the deepest with a snapshot
  for (size_t i = 0; i < hashes.size() && int64_t(i) < max_blocks; ++i) {
    const auto it = entries_.find(hashes[i]);
    if (it == entries_.end()) break;
    const Entry& e = it->second;
    if (e.parent != (i ? hashes[i - 1] : 0) ||
        !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin() + long(i * B)))
      break;
    hit.blocks.push_back(e.block);
    if (e.snapshot >= 0) {
      usable = i + 1;
      hit.snapshot = e.snapshot;
    }
  }
  hit.blocks.resize(usable);
  if (usable) snap_used_[size_t(hit.snapshot)] = ++tick_;
  return hit;
}

int32_t PrefixCache::take_snapshot() {
  const auto it = std::min_element(snap_used_.begin(), snap_used_.end());
  const auto snap = int32_t(it - snap_used_.begin());
  // Whatever entry held it loses its snapshot (and stays, as a block without one).
  if (const auto owner = std::exchange(snap_owner_[size_t(snap)], std::nullopt))
    if (const auto e = entries_.find(*owner); e != entries_.end()) e->second.snapshot = -1;
  *it = ++tick_;
  return snap;
}

bool PrefixCache::publish(std::span<const uint64_t> hashes, size_t index,
                          std::span<const int32_t> tokens, int32_t block, int32_t snapshot) {
  const uint64_t key = hashes[index];
  const size_t slot = (index % size_t(n_pools_)) * size_t(blocks_per_pool_) + size_t(block);
  if (entries_.count(key) || key_of_[slot]) {
    if (snapshot >= 0) snap_used_[size_t(snapshot)] = 0;  // first to go
    return false;
  }
  const auto first = tokens.begin() + long(index * size_t(block_tokens_));
  entries_[key] = {index ? hashes[index - 1] : 0, {first, first + block_tokens_}, block, snapshot};
  key_of_[slot] = key;
  if (snapshot >= 0) snap_owner_[size_t(snapshot)] = key;
  return true;
}

void PrefixCache::evict(int32_t pool, int32_t block) {
  const size_t slot = size_t(pool) * size_t(blocks_per_pool_) + size_t(block);
  if (!enabled() || !key_of_[slot]) return;
  const auto it = entries_.find(*std::exchange(key_of_[slot], std::nullopt));
  DI_CHECK(it != entries_.end(), "prefix cache: block ", block, " keyed but not entered");
  if (it->second.snapshot >= 0) {
    snap_owner_[size_t(it->second.snapshot)].reset();
    snap_used_[size_t(it->second.snapshot)] = 0;
  }
  entries_.erase(it);
}

Scheduler::Scheduler(const SchedulerConfig& cfg, int32_t num_blocks, int32_t cp,
                     int32_t num_snapshots)
    : cfg_(cfg),
      pools_([&] {
        DI_REQUIRE(cp >= 1, "context-parallel size must be >= 1");
        return std::vector<BlockPool>(size_t(cp), BlockPool(num_blocks));
      }()),
      cache_(cfg.block_tokens, cp, num_blocks, num_snapshots) {
  DI_REQUIRE(cfg.max_num_seqs >= 1, "max_num_seqs must be >= 1");
  DI_REQUIRE(cfg.max_num_batched_tokens >= 1 && cfg.max_num_prefill_tokens >= 1,
             "max_num_batched_tokens and max_num_prefill_tokens must be >= 1");
  DI_REQUIRE(cfg.prefill_bucket == 0 || cfg.prefill_bucket <= cfg.max_num_batched_tokens,
             "prefill bucket (", cfg.prefill_bucket, ") exceeds max_num_batched_tokens (",
             cfg.max_num_batched_tokens, ")");
  for (int32_t s = cfg.max_num_seqs - 1; s >= 0; --s) free_slots_.push_back(s);
}

std::string Scheduler::check(const Request& req) const {
  const int64_t n_prompt = int64_t(req.prompt_ids.size());
  const int64_t total = n_prompt + req.params.max_tokens;
  if (total > cfg_.max_model_len)
    return str_cat("prompt (", n_prompt, " tokens) + max_tokens (", req.params.max_tokens,
                   ") = ", total, " exceeds max_model_len (", cfg_.max_model_len, ")");
  // Block i goes to context-parallel rank i mod cp and every rank has as many: the whole pool
  // is the limit.
  const int64_t blocks = (total + cfg_.block_tokens - 1) / cfg_.block_tokens;
  if (blocks > blocks_total())
    return str_cat("prompt + max_tokens = ", total, " tokens needs ", blocks,
                   " KV blocks but the whole pool has ", blocks_total());
  return {};
}

std::string Scheduler::add(Request req) {
  if (std::string e = check(req); !e.empty()) return e;
  DI_CHECK(!seqs_.count(req.id), "duplicate request id ", req.id);
  auto s = std::make_unique<Sequence>();
  s->arrival = next_arrival_++;
  s->tokens = req.prompt_ids;
  s->num_prompt = int64_t(req.prompt_ids.size());
  if (req.params.grammar) s->matcher = std::make_unique<grammar::Matcher>(req.params.grammar);
  s->req = std::move(req);
  waiting_.push_back(s.get());
  seqs_[s->req.id] = std::move(s);
  return "";
}

int32_t Scheduler::blocks_used() const {
  return std::accumulate(pools_.begin(), pools_.end(), 0,
                         [](int32_t n, const BlockPool& p) { return n + p.num_used(); });
}

int64_t Scheduler::room(const Sequence* s) const {
  // Blocks held, held + 1, ... come from pools i mod cp: after min_free full rounds every pool is
  // down by min_free; the last, partial round goes on while the next pool still has one.
  const size_t held = s->blocks.size(), cp = pools_.size();
  const int64_t min_free = std::ranges::min_element(pools_, {}, &BlockPool::num_free)->num_free();
  int64_t n = int64_t(held) + min_free * int64_t(cp);
  for (size_t k = 0; k < cp && pools_[(held + k) % cp].num_free() > min_free; ++k) ++n;
  return n * cfg_.block_tokens;
}

void Scheduler::grow_blocks(Sequence* s, int64_t tokens) {
  DI_CHECK(room(s) >= tokens, "growing without free blocks");
  while (int64_t(s->blocks.size()) * cfg_.block_tokens < tokens) {
    const size_t i = s->blocks.size();
    s->blocks.push_back(pool_of(i).allocate());
    cache_.evict(int32_t(i % pools_.size()), s->blocks.back());  // what it held is gone
  }
  stats_.peak_blocks_used = std::max(stats_.peak_blocks_used, blocks_used());
}

void Scheduler::release_blocks(Sequence* s) {
  // Last block first: a cached prefix loses its end before its start.
  for (size_t i = s->blocks.size(); i-- > 0;) pool_of(i).release(s->blocks[i]);
  s->blocks.clear();
  s->blocks_sent = 0;
  s->blocks_cached = 0;
  s->restore = -1;
  s->rollback = false;
}

void Scheduler::release(Sequence* s) {
  release_blocks(s);
  std::erase(running_, s);
  if (s->slot >= 0) free_slots_.push_back(s->slot);
  s->slot = -1;
  released_.push_back(s->req.id);
}

void Scheduler::preempt(Sequence* s) {
  release(s);
  s->num_computed = 0;
  ++stats_.preemptions;
  // Back into the waiting queue at its arrival position (it is older than later arrivals).
  waiting_.insert(
      std::ranges::find_if(waiting_, [&](Sequence* w) { return w->arrival > s->arrival; }), s);
}

bool Scheduler::take_hit(Sequence* s) {
  if (!cache_.enabled() || s->num_computed > 0) return false;
  cache_.extend_hashes(s->tokens, &s->block_hashes, s->image_keys);
  // At least the last token is computed: its logits pick the next one.
  const int64_t max_blocks = (int64_t(s->tokens.size()) - 1) / cfg_.block_tokens;
  PrefixCache::Hit hit = cache_.lookup(s->tokens, s->block_hashes, max_blocks);
  if (hit.blocks.empty()) return false;
  for (size_t i = 0; i < hit.blocks.size(); ++i) pool_of(i).ref(hit.blocks[i]);
  s->blocks = std::move(hit.blocks);
  s->blocks_cached = s->blocks.size();
  s->num_computed = int64_t(s->blocks.size()) * cfg_.block_tokens;
  s->restore = hit.snapshot;
  return true;
}

void Scheduler::plan_saves(Sequence* s, SchedSeq& q, size_t q_index, SchedOutput& out) {
  if (!cache_.enabled()) return;
  // Drafts are not the sequence's tokens yet: blocks they complete are entered (without a
  // snapshot) by the next step, once accepted.
  const int64_t B = cfg_.block_tokens, start = s->num_computed,
                end = start + int64_t(q.tokens.size()) - q.n_drafts;
  cache_.extend_hashes(std::span<const int32_t>(s->tokens.data(), size_t(end)), &s->block_hashes,
                       s->image_keys);
  for (size_t& i = s->blocks_cached; int64_t(i + 1) * B <= end; ++i) {  // i: blocks_cached
    if (int64_t(i + 1) * B <= start) {
      cache_.publish(s->block_hashes, i, s->tokens, s->blocks[i], -1);
      continue;
    }
    const int32_t snap = cache_.take_snapshot();
    // A snapshot taken twice in one step keeps the later block's state.
    for (Pending& p : pending_)
      if (p.snap == snap) p.snap = out.seqs[p.q].saves[p.saves].snap = -1;
    pending_.push_back({s, i, snap, q_index, q.saves.size()});
    q.saves.push_back({int64_t(i + 1) * B, snap});
  }
}

bool Scheduler::wants_prefill() const {
  return !waiting_.empty() || std::any_of(running_.begin(), running_.end(),
                                          [](const Sequence* s) { return s->num_pending() > 1; });
}

void Scheduler::propose(Sequence* s, int64_t n) {
  if (n <= 0) return;
  const std::vector<int32_t>& ref = s->req.params.draft_reference;
  const auto out = s->tokens.begin() + s->num_prompt;
  const size_t g = size_t(s->num_generated());
  if (g < ref.size() && std::equal(out, s->tokens.end(), ref.begin())) {
    s->drafts.assign(ref.begin() + long(g),
                     ref.begin() + long(std::min(ref.size(), g + size_t(n))));
    return;
  }
  if (cfg_.dspark) {
    const size_t k = std::min(s->model_drafts.size(), size_t(n));
    s->drafts.assign(s->model_drafts.begin(), s->model_drafts.begin() + long(k));
    return;
  }
  // The most recent earlier occurrence of the longest suffix (ngram_max tokens down to one),
  // and what followed it.
  const std::vector<int32_t>& t = s->tokens;
  const int64_t len = int64_t(t.size());
  for (int64_t k = std::min<int64_t>(cfg_.ngram_max, len - 1); k >= 1 && s->drafts.empty(); --k)
    for (int64_t i = len - k - 1; i >= 0; --i)
      if (std::equal(t.begin() + i, t.begin() + i + k, t.end() - k)) {
        const int64_t from = i + k;
        s->drafts.assign(t.begin() + from, t.begin() + std::min(len, from + n));
        break;
      }
}

void Scheduler::note_acceptance(Sequence* s, int64_t accepted) {
  constexpr int32_t kMissesBeforePause = 4, kLongestPause = 64;
  if (accepted > 0) {
    s->spec_misses = s->spec_pause_len = 0;
    return;
  }
  if (++s->spec_misses < kMissesBeforePause) return;
  s->spec_pause_len = std::min(kLongestPause, std::max(1, 2 * s->spec_pause_len));
  s->spec_pause = s->spec_pause_len;
  s->spec_misses = kMissesBeforePause - 1;  // the next miss pauses again, twice as long
}

void Scheduler::schedule(SchedOutput& out, bool allow_prefill) {
  int64_t rows = cfg_.max_num_batched_tokens, prompt_rows = cfg_.max_num_prefill_tokens;
  picked_.clear();
  const int64_t preemptions_before = stats_.preemptions;
  // Decoding: a single pending token, or the tokens a rejected draft left to compute again.
  auto decoding = [](const Sequence* s) { return s->num_pending() == 1 || s->rollback; };
  auto chunk_of = [&](Sequence* s) -> int64_t {
    const int64_t pending = s->num_pending();
    if (decoding(s)) return rows >= pending ? pending : 0;  // decode rows
    int64_t n = std::min({pending, rows, prompt_rows});
    if (cfg_.prompt_as_decode) n = std::min<int64_t>(n, 1);
    if (cfg_.prefill_bucket > 0) n = std::min(n, cfg_.prefill_bucket);
    return n;
  };
  auto rows_of = [&](Sequence* s, int64_t n) {
    const bool padded = cfg_.prefill_bucket > 0 && !decoding(s) && !cfg_.prompt_as_decode;
    return padded ? cfg_.prefill_bucket : n;
  };
  auto take = [&](Sequence* s, int64_t n) {
    grow_blocks(s, s->num_computed + n);
    picked_.emplace_back(s, n);
    rows -= rows_of(s, n);
    if (!decoding(s)) prompt_rows -= n;
  };
  auto unpick = [&](Sequence* v) {
    auto p = std::find_if(picked_.begin(), picked_.end(), [&](auto& e) { return e.first == v; });
    if (p == picked_.end()) return;
    rows += rows_of(v, p->second);
    if (!decoding(v)) prompt_rows += p->second;
    v->drafts.clear();
    picked_.erase(p);
  };
  // 1 + 2: running sequences, decode rows first, then prompt chunks (each phase oldest first).
  for (int phase = 0; phase < (allow_prefill ? 2 : 1); ++phase) {
    order_ = running_;  // preemption changes running_ while we walk it
    for (Sequence* s : order_) {
      if (!s->running() || decoding(s) != (phase == 0)) continue;
      int64_t n = chunk_of(s);
      if (n == 0 || rows_of(s, n) > rows) continue;
      // A prompt chunk shrinks to the free blocks; only a sequence that cannot add a single
      // token preempts, newest first.
      if (n > 1) n = std::clamp<int64_t>(room(s) - s->num_computed, 1, n);
      while (s->running() && room(s) < s->num_computed + n) {
        Sequence* victim = running_.back();  // the newest arrival, `s` itself at the last
        unpick(victim);
        preempt(victim);
      }
      if (!s->running()) continue;
      s->drafts.clear();
      // A sequence computing rejected drafts' accepted tokens again takes new drafts only while
      // that tail is short: a run of rejections would otherwise grow it step after step (each
      // rejection keeps nothing of its step), and a step without drafts commits it.
      if (phase == 0 && may_draft(*s) && s->num_pending() <= 1 + cfg_.num_speculative_tokens) {
        // Drafts that fit the step, the free blocks, max_tokens and max_model_len.
        propose(s, std::min({int64_t(cfg_.num_speculative_tokens), rows - n,
                             room(s) - s->num_computed - n,
                             s->req.params.max_tokens - s->num_generated() - 1,
                             cfg_.max_model_len - int64_t(s->tokens.size()) - 1}));
      }
      if (phase == 0 && s->spec_pause > 0) --s->spec_pause;  // this step is one of the pause
      take(s, n + int64_t(s->drafts.size()));
    }
  }
  // 3: admissions, strict FCFS; a chunk shrinks to the free blocks, and admission stops at the
  // first sequence that cannot start. A step that had to preempt admits nobody (what was just
  // freed would only be fought over again).
  while (allow_prefill && !waiting_.empty() && int32_t(running_.size()) < cfg_.max_num_seqs &&
         stats_.preemptions == preemptions_before) {
    Sequence* s = waiting_.front();
    const bool hit = take_hit(s);
    int64_t n = chunk_of(s);
    if (n > 1) n = std::clamp<int64_t>(room(s) - s->num_computed, 0, n);  // what the blocks fit
    if (n == 0 || rows_of(s, n) > rows || room(s) < s->num_computed + n) {
      if (hit) release_blocks(s);  // the cached blocks go back
      s->num_computed = 0;
      break;
    }
    if (cache_.enabled()) {
      ++stats_.prefix_queries;
      stats_.prefix_hits += hit;
      stats_.prefix_hit_tokens += s->num_computed;
    }
    waiting_.pop_front();
    s->slot = free_slots_.back();
    free_slots_.pop_back();
    running_.insert(
        std::ranges::find_if(running_, [&](Sequence* r) { return r->arrival > s->arrival; }), s);
    take(s, n);
  }
  out.seqs.resize(picked_.size());  // the entries keep their buffers from earlier steps
  pending_.clear();
  for (size_t i = 0; i < picked_.size(); ++i) {
    auto [s, n] = picked_[i];
    SchedSeq& q = out.seqs[i];
    q.seq_id = s->req.id;
    q.slot = s->slot;
    q.start_pos = s->num_computed;
    const int64_t nd = int64_t(s->drafts.size()), real = n - nd;
    q.tokens.assign(s->tokens.begin() + s->num_computed,
                    s->tokens.begin() + s->num_computed + real);
    q.tokens.insert(q.tokens.end(), s->drafts.begin(), s->drafts.end());
    q.n_drafts = int32_t(nd);
    q.backup = nd > 0;
    q.n_padding = rows_of(s, n) - n;
    q.decode = decoding(s);
    q.rollback = std::exchange(s->rollback, false);
    q.image_at = s->image_at.empty() ? nullptr : s->image_at.data();
    q.image_len = int64_t(s->image_at.size());
    // A scheduled sequence holds a block, so nothing announced means a table not yet started.
    q.reset_blocks = s->blocks_sent == 0;
    q.new_blocks.assign(s->blocks.begin() + long(s->blocks_sent), s->blocks.end());
    s->blocks_sent = s->blocks.size();
    q.sample = s->num_computed + real == int64_t(s->tokens.size());
    q.restore = std::exchange(s->restore, -1);
    q.saves.clear();
    plan_saves(s, q, i, out);
  }
  out.released.clear();
  out.released.swap(released_);
}

const std::vector<Sequence*>& Scheduler::update(const SchedOutput& out,
                                                const std::vector<int32_t>& sampled,
                                                const std::vector<int32_t>& counts) {
  sampled_seqs_.clear();
  size_t at = 0;
  for (const SchedSeq& q : out.seqs) {
    Sequence* s = seqs_.at(q.seq_id).get();
    s->drafts.clear();
    if (!q.sample) {
      s->num_computed += int64_t(q.tokens.size());
      continue;
    }
    const size_t i = sampled_seqs_.size();
    DI_CHECK(i < counts.size() && counts[i] >= 1 && counts[i] <= q.n_drafts + 1 &&
                 at + size_t(counts[i]) <= sampled.size(),
             "sampled tokens do not match the sampling sequences");
    s->tokens.insert(s->tokens.end(), sampled.begin() + long(at),
                     sampled.begin() + long(at + size_t(counts[i])));
    at += size_t(counts[i]);
    sampled_seqs_.push_back(s);
    if (q.n_drafts > 0) {
      ++stats_.spec_steps;
      stats_.spec_drafted += q.n_drafts;
      stats_.spec_accepted += counts[i] - 1;
      s->drafted += q.n_drafts;
      s->accepted += counts[i] - 1;
      note_acceptance(s, counts[i] - 1);
    }
    if (counts[i] == q.n_drafts + 1) {
      s->num_computed += int64_t(q.tokens.size());
    } else {
      // A draft was rejected: the rows after it wrote the slot's rings and carries. The slot
      // goes back to its state before this step and the accepted tokens are computed again.
      s->rollback = true;
      s->blocks_cached = std::min(s->blocks_cached, size_t(s->num_computed / cfg_.block_tokens));
      for (Pending& p : pending_)
        if (p.seq == s) p.seq = nullptr;
    }
  }
  DI_CHECK(sampled_seqs_.size() == counts.size() && at == sampled.size(),
           "more sampled tokens than sampling sequences");
  // The blocks this step completed, and their snapshots, are now there to be found.
  for (const Pending& p : pending_)
    if (p.seq)
      cache_.publish(p.seq->block_hashes, p.index, p.seq->tokens, p.seq->blocks[p.index], p.snap);
  pending_.clear();
  return sampled_seqs_;
}

void Scheduler::finish(Sequence* s, FinishReason why) {
  if (s->finish != FinishReason::None) return;  // finished already
  if (s->running())
    release(s);
  else  // a waiting sequence holds no blocks
    std::erase(waiting_, s);
  s->finish = why;
  auto it = seqs_.find(s->req.id);
  finished_.push_back(std::move(it->second));
  seqs_.erase(it);
}

bool Scheduler::abort(RequestId id) {
  Sequence* s = find(id);
  if (s) finish(s, FinishReason::Abort);
  return s != nullptr;
}

Sequence* Scheduler::find(RequestId id) {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

}  // namespace deepinfer
