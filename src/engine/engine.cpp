#include "engine/engine.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/region_timer.h"
#include "kernels/reduce.h"

namespace deepinfer {

KvCacheOptions size_kv_pool(const ModelConfig& c, EngineConfig* cfg) {
  // Blocks must hold whole compressed groups of every layer.
  int64_t lcm = 1;
  for (int l = 0; l < c.n_layers; ++l)
    if (c.compress_ratio(l) > 0) lcm = std::lcm(lcm, int64_t(c.compress_ratio(l)));
  SchedulerConfig& sc = cfg->sched;
  DI_REQUIRE(sc.block_tokens >= 1, "KV block size must be >= 1 token");
  sc.block_tokens = (sc.block_tokens + lcm - 1) / lcm * lcm;
  DI_REQUIRE(sc.max_model_len >= 1, "max_model_len must be >= 1");
  const uint64_t block_bytes =
      uint64_t(kv_footprint(c).bytes_per_token * double(sc.block_tokens) + 0.5);
  KvCacheOptions ko{.num_blocks = cfg->num_kv_blocks,
                    .block_tokens = sc.block_tokens,
                    .max_seqs = sc.max_num_seqs,
                    .slot_backups = sc.num_speculative_tokens > 0};
  if (ko.num_blocks <= 0) {
    // From the memory budget, but no more than max_num_seqs sequences of max_model_len need.
    const uint64_t per_seq = uint64_t((sc.max_model_len + sc.block_tokens - 1) / sc.block_tokens);
    const uint64_t most = per_seq * uint64_t(sc.max_num_seqs);
    const uint64_t n = block_bytes ? std::min(cfg->kv_cache_memory / block_bytes, most) : most;
    DI_REQUIRE(n >= 1, "--kv-cache-memory ", cfg->kv_cache_memory, " bytes holds no KV block (",
               block_bytes, " bytes each)");
    ko.num_blocks = int32_t(std::min<uint64_t>(n, uint64_t(INT32_MAX)));
  }
  if (cfg->prefix_caching) {
    // Snapshots from their budget, one at least, and no more than there are blocks to resume.
    const uint64_t budget =
        cfg->prefix_cache_memory ? cfg->prefix_cache_memory : cfg->kv_cache_memory / 4;
    // A snapshot holds the draft head's rings too, when it runs.
    const KvFootprint fp = kv_footprint(c, sc.dspark ? c.n_mtp_layers : 0);
    const uint64_t snap_bytes = uint64_t(std::max<int64_t>(1, fp.snapshot_bytes()));
    ko.num_snapshots =
        int32_t(std::clamp<uint64_t>(budget / snap_bytes, 1, uint64_t(ko.num_blocks)));
  }
  return ko;
}

Engine::Engine(Model& model, const EngineConfig& cfg, TextDecoder decoder, const RankLayout* layout)
    : model_(model), cfg_(cfg), decoder_(std::move(decoder)), sampler_(model.config().vocab_size) {
  const ModelConfig& c = model.config();
  KvCacheOptions ko = size_kv_pool(c, &cfg_);
  if (cfg_.sched.dspark) {
    DI_REQUIRE(model.has_draft_head(),
               "speculative decoding with the draft head needs a model built with it");
    ko.draft_layers = c.n_mtp_layers;  // its rings, in every slot
  }
  stats_.kv_blocks_total = ko.num_blocks;
  kv_ = std::make_unique<KvCache>(c, ko);
  stats_.prefix_snapshots = ko.num_snapshots;
  scheduler_ = std::make_unique<Scheduler>(cfg_.sched, ko.num_blocks, layout ? layout->cfg.cp : 1,
                                           ko.num_snapshots);
  runner_ = std::make_unique<ModelRunner>(model_, *kv_, true, layout);
}

std::string check_sampling_params(const SamplingParams& p) {
  if (p.max_tokens < 1) return str_cat("max_tokens must be >= 1, got ", p.max_tokens);
  if (!(p.temperature >= 0)) return str_cat("temperature must be >= 0, got ", p.temperature);
  if (p.top_k < 0) return str_cat("top_k must be >= 0, got ", p.top_k);
  if (!(p.top_p > 0 && p.top_p <= 1)) return str_cat("top_p must be in (0, 1], got ", p.top_p);
  if (!(p.min_p >= 0 && p.min_p <= 1)) return str_cat("min_p must be in [0, 1], got ", p.min_p);
  if (!(p.repetition_penalty > 0))
    return str_cat("repetition_penalty must be > 0, got ", p.repetition_penalty);
  if (p.logprobs < 0) return str_cat("logprobs must be >= 0, got ", p.logprobs);
  for (const auto& s : p.stop)
    if (s.empty()) return "stop strings must not be empty";
  return {};
}

std::string Engine::add_request(Request req) {
  // Images: the spans are planned now (every refusal is immediate), the tower runs a stage per
  // step (advance_images), and the request is scheduled once its images are through.
  PendingImages p;
  if (!req.images.empty())
    if (std::string e = plan_spans(req, p.row_of); !e.empty()) return e;
  if (std::string e = check_request(req); !e.empty()) return e;
  if (!req.params.seed) req.params.seed = cfg_.seed * 0x9e3779b97f4a7c15ull + req.id;
  if (req.images.empty()) return scheduler_->add(std::move(req));
  p.req = std::move(req);
  pending_images_.push_back(std::move(p));
  return "";
}

std::string Engine::plan_spans(Request& req, std::vector<int64_t>& row_of) {
  const ModelConfig& c = model_.config();
  if (!model_.has_vision())
    return str_cat("the request has ", req.images.size(),
                   " image(s), and this model has no vision tower");
  if (!runner_->alone()) return "images are served by a single rank (no cp/ep/dp ranks) for now";
  const int32_t image = int32_t(c.image_token_id);
  const size_t holders = size_t(std::count(req.prompt_ids.begin(), req.prompt_ids.end(), image));
  if (holders != req.images.size())
    return str_cat("the prompt has ", holders, " image placeholder(s) (token ", image, ") for ",
                   req.images.size(), " image(s)");
  const int64_t r = c.vision_downsample_ratio, P = c.vision_patch_size;
  std::vector<int32_t> ids;
  row_of.clear();  // per position: the tower's row (images' rows in order), -(1 + type), or text
  auto push = [&](int32_t t, int64_t v) {
    ids.push_back(t);
    row_of.push_back(v);
  };
  int64_t rows = 0;
  size_t k = 0;
  for (int32_t t : req.prompt_ids) {
    if (t != image) {
      push(t, INT64_MIN);
      continue;
    }
    const RequestImage& im = req.images[k];
    if (im.vit_h <= 0 || im.vit_w <= 0 ||
        int64_t(im.patches.size()) != im.vit_h * im.vit_w * 3 * P * P)
      return str_cat("image ", k, ": ", im.patches.size(), " patch values for a ", im.vit_h, "x",
                     im.vit_w, " grid of ", 3 * P * P);
    const int64_t lh = (im.vit_h + r - 1) / r, lw = (im.vit_w + r - 1) / r;
    if (lh * (lw + 1) + 2 > c.vision_max_n_token)
      return str_cat("image ", k, ": a span of ", lh * (lw + 1) + 2, " tokens, more than ",
                     c.vision_max_n_token, " (vision_max_n_token)");
    push(image, -1);  // IMAGE_START
    for (int64_t y = 0; y < lh; ++y) {
      for (int64_t x = 0; x < lw; ++x) push(image, rows + y * lw + x);
      push(image, -3);  // IMAGE_NEW_LINE
    }
    push(image, -4);  // IMAGE_END
    rows += lh * lw;
    ++k;
  }
  req.prompt_ids = std::move(ids);
  return "";
}

void Engine::advance_images() {
  if (pending_images_.empty()) return;
  DI_REGION("engine.vision");
  PendingImages& p = pending_images_.front();
  if (!p.job) {
    const RequestImage& im = p.req.images[p.done];
    p.job = model_.begin_image(im.patches.data(), im.vit_h, im.vit_w);
  }
  std::vector<float> out;
  if (!model_.advance_image(*p.job, out)) return;
  p.rows.insert(p.rows.end(), out.begin(), out.end());
  p.job.reset();
  if (++p.done < p.req.images.size()) return;
  // Every image is through: the span rows' embeddings and their keys go with the sequence.
  const int64_t D = model_.config().dim;
  std::vector<const float*> at(p.row_of.size(), nullptr);
  std::vector<uint64_t> keys(p.row_of.size(), 0);
  for (size_t i = 0; i < at.size(); ++i) {
    const int64_t v = p.row_of[i];
    if (v == INT64_MIN) continue;
    at[i] = v < 0 ? model_.image_delimiter(int(-v - 1)) : p.rows.data() + v * D;
    // The prefix cache's key: the embedding hashed (the delimiters' are fixed).
    uint64_t h = 0x243f6a8885a308d3ull;
    for (int64_t d = 0; d < D; ++d) h = splitmix_finalise(h ^ std::bit_cast<uint32_t>(at[i][d]));
    keys[i] = h | 1;
  }
  const RequestId id = p.req.id;
  p.req.images.clear();
  const std::string e = scheduler_->add(std::move(p.req));
  DI_CHECK(e.empty(), "an image request checked at admission was refused: ", e);
  Sequence* s = scheduler_->find(id);
  s->image_rows = std::move(p.rows);  // the pointers into it stay valid: it moves
  s->image_at = std::move(at);
  s->image_keys = std::move(keys);
  pending_images_.pop_front();
}

bool Engine::abort(RequestId id) {
  const auto it =
      std::ranges::find_if(pending_images_, [&](const PendingImages& p) { return p.req.id == id; });
  if (it == pending_images_.end()) return scheduler_->abort(id);
  aborted_.push_back({id, it->req.prompt_ids, {}, {}, FinishReason::Abort, {}, 0, 0});
  pending_images_.erase(it);
  return true;
}

std::string Engine::check_request(const Request& req) const {
  const int64_t V = model_.config().vocab_size;
  const SamplingParams& p = req.params;
  if (req.prompt_ids.empty()) return "prompt is empty";
  for (size_t i = 0; i < req.prompt_ids.size(); ++i)
    if (req.prompt_ids[i] < 0 || req.prompt_ids[i] >= V)
      return str_cat("prompt token ", i, " = ", req.prompt_ids[i],
                     " is outside the vocabulary [0, ", V, ")");
  if (std::string e = check_sampling_params(p); !e.empty()) return e;
  if (p.logprobs > V) return str_cat("logprobs must be in [0, ", V, "], got ", p.logprobs);
  for (int32_t t : p.stop_token_ids)
    if (t < 0 || t >= V) return str_cat("stop token id ", t, " is outside the vocabulary");
  if (!p.stop.empty() && !decoder_) return "stop strings need a tokenizer, and this model has none";
  if (scheduler_->find(req.id) ||
      std::ranges::any_of(pending_images_, [&](auto& q) { return q.req.id == req.id; }))
    return str_cat("request id ", req.id, " is already in use");
  if (p.grammar && p.grammar->vocab().size() != V)
    return str_cat("the output grammar was compiled for a vocabulary of ",
                   p.grammar->vocab().size(), " tokens; the model has ", V);
  return scheduler_->check(req);
}

FinishReason Engine::stop_reason(const Sequence& s) const {
  const SamplingParams& p = s.req.params;
  const int32_t t = s.tokens.back();
  // A grammar's end is the end, whatever ignore_eos says (nothing else could follow).
  if ((!p.ignore_eos && t == model_.config().eos_token_id) ||
      (s.matcher && s.matcher->finished()) ||
      std::ranges::find(p.stop_token_ids, t) != p.stop_token_ids.end())
    return FinishReason::Stop;
  if (s.num_generated() >= p.max_tokens || int64_t(s.tokens.size()) >= cfg_.sched.max_model_len)
    return FinishReason::Length;
  return FinishReason::None;
}

void Engine::check_stop(Sequence* s) {
  const SamplingParams& p = s->req.params;
  const FinishReason why = stop_reason(*s);
  if (why == FinishReason::Stop) return scheduler_->finish(s, why);
  if (!p.stop.empty()) {
    // Only a stop string that ends in the newest token can be new, and it lies within the last
    // `longest` bytes of the output's text: decode a suffix of the output that long (plus the
    // replacement characters a cut through a character may give, at most 9 bytes), not the whole
    // output, so the check costs the same at every length.
    size_t longest = 0;
    for (const auto& stop : p.stop) longest = std::max(longest, stop.size());
    const int64_t n_out = s->num_generated();
    const int32_t* end = s->tokens.data() + s->tokens.size();
    std::string text;
    for (int64_t w = std::min<int64_t>(n_out, int64_t(longest) + 12);; w = std::min(n_out, 2 * w)) {
      text = decoder_(std::span<const int32_t>(end - w, size_t(w)));
      if (w == n_out || text.size() >= longest + 12) break;
    }
    for (const auto& stop : p.stop)
      if (text.find(stop) != std::string::npos) {
        s->stop_text = stop;
        return scheduler_->finish(s, FinishReason::Stop);
      }
  }
  if (why == FinishReason::Length) scheduler_->finish(s, why);
}

std::vector<TokenEvent> Engine::step() {
  std::vector<TokenEvent> events;
  const auto t0 = std::chrono::steady_clock::now();
  bool allow_prefill = true;
  advance_images();  // one stage of the vision tower, then the step of everyone else
  if (!runner_->begin_step(*scheduler_, &allow_prefill)) return events;
  SchedOutput& out = sched_out_;
  {
    DI_REGION("engine.schedule");
    scheduler_->schedule(out, allow_prefill);
  }
  const std::vector<float>* logits = runner_->run(out);
  if (!logits) return events;
  sampled_.clear();
  tops_.clear();
  counts_.clear();
  size_t row = 0;  // logits row
  bool has_prompt = false;
  {
    DI_REGION("engine.sample");
    const int64_t V = model_.config().vocab_size;
    for (const SchedSeq& q : out.seqs) {
      Sequence* s = scheduler_->find(q.seq_id);
      // Prompt rows: chunks, and a prompt's last token run as a decode row (a one-token prompt
      // is nothing else); recomputation after preemption counts too.
      if (!q.decode || q.start_pos < s->num_prompt) {
        has_prompt = true;
        stats_.prompt_tokens += int64_t(q.tokens.size());
      }
      if (!q.sample) continue;
      // Row j samples as plain decoding would after the drafts before it: with them in the
      // history, the same random draw (seed, token index) and the same grammar state. Draft j
      // stands when row j picks it; the first row that picks another token ends the run (its
      // token is kept), as does a token that ends the request.
      const size_t first = sampled_.size();
      const int32_t* drafts = q.tokens.data() + q.tokens.size() - size_t(q.n_drafts);
      for (int32_t j = 0; j <= q.n_drafts; ++j) {
        SampleInput in{logits->data() + (row + size_t(j)) * size_t(V), &s->req.params, &s->tokens,
                       s->num_prompt, *s->req.params.seed};
        if (s->matcher) {
          DI_REGION("engine.grammar_mask");
          in.allowed = s->matcher->allowed();
        }
        const int32_t t = sampler_.sample(in, &tops_.emplace_back());
        if (s->matcher)
          DI_CHECK(s->matcher->accept(t), "the sampler chose token ", t,
                   ", which the grammar refuses");
        sampled_.push_back(t);
        s->tokens.push_back(t);  // the next row's history
        if (j == q.n_drafts || t != drafts[j] || stop_reason(*s) != FinishReason::None) break;
      }
      row += 1 + size_t(q.n_drafts);
      const size_t k = sampled_.size() - first;
      s->tokens.resize(s->tokens.size() - k);  // update() appends them
      counts_.push_back(int32_t(k));
    }
  }
  const std::vector<Sequence*>& seqs = scheduler_->update(out, sampled_, counts_);
  if (cfg_.sched.dspark) draft(out);
  events.reserve(sampled_.size());
  for (size_t i = 0, at = 0; i < seqs.size(); ++i) {
    Sequence* s = seqs[i];
    for (int32_t j = 0; j < counts_[i]; ++j, ++at) {
      TokenEvent& ev = events.emplace_back(TokenEvent{s->req.id, sampled_[at], {}});
      if (s->req.params.logprobs > 0) {
        ev.logprobs = tops_[at];
        s->logprobs.push_back(std::move(tops_[at]));
      }
    }
    check_stop(s);
  }
  stats_.generated_tokens += int64_t(sampled_.size());
  ++stats_.steps;
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (has_prompt ? stats_.prefill_seconds : stats_.decode_seconds) += dt;
  return events;
}

void Engine::draft(const SchedOutput& out) {
  DI_REGION("engine.draft");
  // Every sequence of the step keeps its real rows and the drafts it accepted (their positions
  // enter the draft head's rings); one that sampled drafts from its newest token when its next
  // step may take drafts.
  draft_in_.clear();
  size_t at = 0, si = 0;
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    const SchedSeq& q = out.seqs[i];
    int32_t accepted = 0, from = -1;
    if (q.sample) {
      const int32_t k = counts_[si++];
      accepted = k - 1;
      at += size_t(k);
      const Sequence& s = *scheduler_->find(q.seq_id);
      if (scheduler_->may_draft(s) && stop_reason(s) == FinishReason::None) from = sampled_[at - 1];
    }
    draft_in_.push_back({int32_t(i), int64_t(q.tokens.size()) - q.n_drafts + accepted, from});
  }
  draft_out_.slots = std::min(cfg_.sched.num_speculative_tokens, model_.draft_block_size());
  if (!draft_in_.empty()) model_.draft(draft_in_, *kv_, draft_out_);
  auto block = draft_out_.tokens.begin();  // the drafting sequences' blocks, in order
  for (const DraftSeq& d : draft_in_) {
    Sequence* s = scheduler_->find(out.seqs[size_t(d.seq)].seq_id);
    s->model_drafts.clear();
    if (d.token < 0) continue;
    s->model_drafts.assign(block, block + draft_out_.slots);
    block += draft_out_.slots;
    if (draft_observer_) draft_observer_(s->req.id, int64_t(s->tokens.size()), s->model_drafts);
  }
}

std::vector<RequestOutput> Engine::take_finished() {
  std::vector<RequestOutput> res = std::exchange(aborted_, {});
  for (auto& s : scheduler_->take_finished()) {
    std::vector<int32_t> output(s->tokens.begin() + s->num_prompt, s->tokens.end());
    res.push_back({s->req.id, s->req.prompt_ids, std::move(output), std::move(s->logprobs),
                   s->finish, s->stop_text, s->drafted, s->accepted});
  }
  return res;
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  static_cast<SchedulerStats&>(s) = scheduler_->stats();
  return s;
}

// Sampler (next-token selection).

namespace {
uint64_t mix64(uint64_t z) {  // splitmix64's step and finaliser
  return splitmix_finalise(z + 0x9e3779b97f4a7c15ull);
}

// Higher value first, then lower id: the order every selection here uses.
struct ByValueThenId {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] != v[b] ? v[a] > v[b] : a < b; }
};

// A uniform draw in [0, 1) for (seed, index): counter-based, no state.
double sample_uniform(uint64_t seed, uint64_t index) {
  const uint64_t r = mix64(mix64(seed) ^ mix64(index + 0x632be59bd9b4e019ull));
  return double(r >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace

int32_t Sampler::sample(const SampleInput& in, TopLogprobs* top) {
  const SamplingParams& p = *in.params;
  const int64_t V = vocab_;
  const float* raw = in.logits;
  float lse = 0;
  const bool want = p.logprobs > 0 && top;
  if (want) {
    const float mx = *std::max_element(raw, raw + V);
    const float sum = canonical_sum(raw, V, [mx](float v) { return std::exp(v - mx); });
    lse = mx + std::log(sum);
    ids_.resize(size_t(V));
    std::iota(ids_.begin(), ids_.end(), 0);
    const int64_t k = std::min<int64_t>(p.logprobs, V);
    std::partial_sort(ids_.begin(), ids_.begin() + k, ids_.end(), ByValueThenId{raw});
    top->clear();
    for (int64_t i = 0; i < k; ++i) top->emplace_back(ids_[size_t(i)], raw[ids_[size_t(i)]] - lse);
  }
  const int32_t t = choose(in);
  // The chosen token's own logprob, from the same softmax, follows the top-K when it is not
  // among them (as vLLM reports it).
  if (want && std::none_of(top->begin(), top->end(), [t](const auto& e) { return e.first == t; }))
    top->emplace_back(t, raw[t] - lse);
  return t;
}

int32_t Sampler::choose(const SampleInput& in) {
  const SamplingParams& p = *in.params;
  const int64_t V = vocab_;
  const float* raw = in.logits;
  const bool greedy = p.temperature <= 0.0f || p.top_k == 1;
  if (greedy && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
      p.frequency_penalty == 0.0f && !in.allowed)
    return int32_t(argmax(raw, V));  // nothing to change in the logits: no copy
  work_.assign(raw, raw + V);
  float* l = work_.data();
  const auto& toks = *in.tokens;
  // Penalties: repetition over prompt and output, presence/frequency over output. `count_` is
  // all zero between calls: only the entries of this history's tokens are touched, then reset.
  if (p.repetition_penalty != 1.0f) {
    for (int32_t t : toks)
      if (!count_[size_t(t)]++)
        l[t] = l[t] > 0 ? l[t] / p.repetition_penalty : l[t] * p.repetition_penalty;
    for (int32_t t : toks) count_[size_t(t)] = 0;
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    const std::span<const int32_t> out(toks.begin() + in.num_prompt, toks.end());
    for (int32_t t : out) ++count_[size_t(t)];
    for (int32_t t : out)
      if (const int32_t n = std::exchange(count_[size_t(t)], 0))
        l[t] -= p.frequency_penalty * float(n) + p.presence_penalty;
  }
  if (in.allowed)
    for (int64_t i = 0; i < V; ++i)
      if (!((in.allowed[i / 64] >> (i % 64)) & 1)) l[i] = -std::numeric_limits<float>::infinity();
  if (greedy) return int32_t(argmax(l, V));
  for (int64_t i = 0; i < V; ++i) l[i] /= p.temperature;
  // Candidates: the top-k tokens, or all. The top-p and min-p cuts walk them in (value desc,
  // id asc) order; without those cuts id order serves as well and the vocabulary is not sorted.
  ids_.resize(size_t(V));
  std::iota(ids_.begin(), ids_.end(), 0);
  int64_t n = V;
  if (p.top_k > 0 && p.top_k < V) {
    n = p.top_k;
    std::partial_sort(ids_.begin(), ids_.begin() + n, ids_.end(), ByValueThenId{l});
  } else if (p.top_p < 1.0f || p.min_p > 0.0f) {
    std::sort(ids_.begin(), ids_.end(), ByValueThenId{l});
  }
  // Probabilities of the candidates (softmax over them), then top-p and min-p cuts.
  float mx = l[ids_[0]];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, l[ids_[size_t(i)]]);
  prob_.resize(size_t(n));
  double total = 0;
  for (int64_t i = 0; i < n; ++i)
    total += (prob_[size_t(i)] = std::exp(double(l[ids_[size_t(i)]] - mx)));
  int64_t keep = n;
  if (p.top_p < 1.0f) {  // the fewest candidates whose mass reaches top_p
    keep = 0;
    for (double cum = 0; keep < n && cum < double(p.top_p); ++keep)
      cum += prob_[size_t(keep)] / total;
  }
  if (p.min_p > 0.0f) {
    const double floor = double(p.min_p) * prob_[0];
    int64_t m = 1;
    while (m < keep && prob_[size_t(m)] >= floor) ++m;
    keep = m;
  }
  const double kept = std::accumulate(prob_.begin(), prob_.begin() + keep, 0.0);
  const double u = sample_uniform(in.seed, uint64_t(toks.size() - size_t(in.num_prompt))) * kept;
  double cum = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += prob_[size_t(i)];
    if (u < cum) return ids_[size_t(i)];
  }
  int64_t last = keep - 1;  // rounding left u at the very top: the last candidate with mass
  while (last > 0 && prob_[size_t(last)] == 0) --last;
  return ids_[size_t(last)];
}

}  // namespace deepinfer
