#include "bench_decode.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/region_timer.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "onednn_matmul.h"

namespace deepinfer::bench {

namespace {

// Weight bytes one decode step of `batch` tokens reads: the dense weights once, a row of the
// embedding and Engram tables per token, and the experts the batch activates (expected number of
// distinct experts when each token picks k of E at random).
double step_bytes(const ModelConfig& c, const WeightFootprint& f, int batch) {
  const double E = c.n_routed_experts, k = c.n_activated_experts;
  const double distinct = E * (1.0 - std::pow(1.0 - k / E, batch));
  return double(f.dense_per_token) + double(f.experts_per_token) / k * distinct;
}

// Multiply-accumulates per token of a long prompt: every linear once (routed experts at k of E),
// the head once per prompt, table lookups and attention not counted.
double macs_per_token(const ModelConfig& c, int prompt) {
  double macs = 0;
  const double share = double(c.n_activated_experts) / double(c.n_routed_experts);
  for (const TensorSpec& s : checkpoint_schema(c, 0, -1, /*dspark=*/false, /*vision=*/false)) {
    if (s.shape.ndim != 2 || s.name.find(".scale") != std::string::npos) continue;
    const std::string& n = s.name;
    if (n == "embed.weight" || n.find(".engram.embed.") != std::string::npos) continue;
    const double numel = double(s.shape.numel());
    if (n == "head.weight")
      macs += numel / prompt;
    else if (n.find(".ffn.experts.") != std::string::npos)
      macs += numel * share;
    else
      macs += numel;
  }
  return macs;
}

// Reads one byte per page of a mapped weight, so that page faults of tables read one row per
// token (embedding, Engram) are not charged to the timed steps.
void touch_pages(const Weight& w) {
  const volatile uint8_t* p = static_cast<const uint8_t*>(w.data);
  uint8_t sink = 0;
  for (uint64_t off = 0; w.data && off < w.nbytes(); off += 4096) sink ^= p[off];
  (void)sink;
}

struct Runner {
  Model& model;
  KvCache& kv;
  const std::vector<int32_t>& blocks;  // [max_seqs, per_seq]
  int64_t per_seq;
  int64_t vocab;
  std::mt19937 rng{3};
  std::vector<float> logits;

  int32_t token() { return int32_t(rng() % uint32_t(vocab)); }

  // One step: sequences [0, n) each feed `len` tokens at `start`; logits of each last token.
  void step(int n, int64_t start, int64_t len) {
    ForwardBatch b;
    for (int s = 0; s < n; ++s) {
      ForwardSeq q;
      q.start_pos = start;
      q.n_tokens = len;
      q.kv = {s, blocks.data() + size_t(s) * size_t(per_seq), per_seq};
      q.logits_from = len - 1;
      b.seqs.push_back(q);
      for (int64_t i = 0; i < len; ++i) b.tokens.push_back(token());
    }
    logits.resize(size_t(b.n_logit_rows() * vocab));
    model.forward(b, kv, logits.data());
  }
};

}  // namespace

namespace {

// Decode tokens/s of the engine on `reqs` (after their prompts): every request's first token is
// sampled by its prefill, and the clock runs from there to the end. Fills `outputs` (by id).
double engine_decode_tok_s(Model& model, const EngineConfig& cfg, const std::vector<Request>& reqs,
                           std::vector<std::vector<int32_t>>* outputs, EngineStats* stats,
                           bool regions = false) {
  Engine e(model, cfg);
  for (const Request& r : reqs) DI_REQUIRE(e.add_request(r).empty(), "bench: request refused");
  std::vector<int64_t> got(reqs.size(), 0);
  auto step = [&] {
    for (const TokenEvent& ev : e.step()) ++got[size_t(ev.id)];
    for (RequestOutput& o : e.take_finished()) (*outputs)[size_t(o.id)] = std::move(o.output_ids);
  };
  while (std::count(got.begin(), got.end(), 0) > 0 && e.has_unfinished()) step();
  int64_t before = 0;
  for (int64_t g : got) before += g;
  if (regions) RegionTimer::reset();  // the decode steps only
  const double t0 = now_s();
  while (e.has_unfinished()) step();
  const double dt = now_s() - t0;
  int64_t after = 0;
  for (int64_t g : got) after += g;
  *stats = e.stats();
  return double(after - before) / dt;
}

void bench_speculative(Reporter& rep, Model& model, const WeightFootprint& fp,
                       const DecodeBenchOptions& opt) {
  const ModelConfig& c = model.config();
  const int K = opt.speculative;
  for (int B : opt.batches) {
    std::mt19937 rng(17);
    std::vector<Request> reqs(static_cast<size_t>(B));
    for (int i = 0; i < B; ++i) {
      Request& r = reqs[size_t(i)];
      r.id = RequestId(i);
      for (int t = 0; t < opt.prompt; ++t)
        r.prompt_ids.push_back(int32_t(rng() % uint32_t(c.vocab_size)));
      r.params.max_tokens = opt.spec_tokens;
      r.params.temperature = 0;
      r.params.ignore_eos = true;
    }
    EngineConfig plain;
    plain.sched.max_num_seqs = B;
    plain.sched.max_model_len = opt.prompt + opt.spec_tokens + K + 2;
    plain.prefix_caching = false;
    EngineConfig spec = plain;
    spec.sched.num_speculative_tokens = K;
    std::vector<std::vector<int32_t>> want(static_cast<size_t>(B)), got(static_cast<size_t>(B));
    EngineStats st;
    engine_decode_tok_s(model, plain, reqs, &want, &st);  // warm-up, and the drafts
    std::vector<Request> forced = reqs;
    for (Request& r : forced) r.params.draft_reference = want[size_t(r.id)];
    PairStats ps;
    std::vector<double> plain_tok_s;
    for (int p = 0; p < opt.pairs; ++p) {
      const double a = engine_decode_tok_s(model, plain, reqs, &got, &st);
      const double b = engine_decode_tok_s(model, spec, forced, &got, &st);
      DI_CHECK(got == want, "speculative decoding changed the tokens");
      DI_CHECK(st.spec_accepted == st.spec_drafted, "a forced draft was rejected");
      plain_tok_s.push_back(a);
      ps.add(b, a);
    }
    if (opt.regions) {  // where a verify step's time goes (after the prompts)
      engine_decode_tok_s(model, spec, forced, &got, &st, true);
      RegionTimer::print(stderr);
      engine_decode_tok_s(model, plain, reqs, &got, &st, true);
      RegionTimer::print(stderr);
    }
    // The n-gram lookup on this model's own output (a random model rarely repeats itself).
    const double ng = engine_decode_tok_s(model, spec, reqs, &got, &st);
    DI_CHECK(got == want, "speculative decoding changed the tokens");
    Row row("speculative");
    row.add("batch", B)
        .add("drafts", K)
        .add("verify_bytes_ratio", step_bytes(c, fp, B * (K + 1)) / step_bytes(c, fp, B), 2);
    add_pairs(row, ps, "forced_tok_s", "plain_tok_s");
    // A verify step's time over a one-row step's: with every draft accepted a verify step gives
    // K + 1 tokens per sequence, so (K + 1) / speedup, from the median pair ratio.
    row.add("verify_time_ratio", double(K + 1) / median(ps.ratio), 2);
    row.add("ngram_tok_s", ng, 2)
        .add("ngram_acceptance_length",
             st.spec_steps ? 1.0 + double(st.spec_accepted) / double(st.spec_steps) : 1.0, 3);
    if (model.has_draft_head()) {
      // The draft head's own drafts (a random head rarely guesses right).
      EngineConfig ds = spec;
      ds.sched.dspark = true;
      ds.sched.num_speculative_tokens = std::min(K, model.draft_block_size());
      const double d = engine_decode_tok_s(model, ds, reqs, &got, &st);
      DI_CHECK(got == want, "speculative decoding changed the tokens");
      row.add("dspark_tok_s", d, 2)
          .add("dspark_acceptance_length",
               st.spec_steps ? 1.0 + double(st.spec_accepted) / double(st.spec_steps) : 1.0, 3);
    }
    rep.print(row);
  }
}

}  // namespace

void bench_decode(Reporter& rep, const DecodeBenchOptions& opt) {
  DI_REQUIRE(!opt.model_dir.empty(), "bench decode: --model DIR is required");
  const double t_load = now_s();
  auto ck = Checkpoint::load(opt.model_dir);
  ModelOptions mo;
  mo.dspark = ck->has_dspark && opt.speculative > 0;  // the draft head, for the speculative rows
  Model model(*ck, mo);
  const double load_s = now_s() - t_load;
  const ModelConfig& c = model.config();
  const WeightFootprint fp = weight_footprint(c);
  touch_pages(ck->embed);
  for (const LayerWeights& L : ck->layers) touch_pages(L.engram_table);
  ThreadPool& pool = ThreadPool::global();
  rep.note(str_cat("model ", opt.model_dir, ": ", human_bytes(double(fp.total)), " of weights, ",
                   human_bytes(double(fp.per_token)),
                   " read per decoded token; repacked for the kernels: ",
                   human_bytes(double(model.prepared_weight_bytes())), " (load + repack ", load_s,
                   " s); isa ", isa_name(cpu_isa()), ", ", pool.size(), " threads"));

  const int max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  const int64_t timed = int64_t(opt.steps) * opt.pairs;
  const int64_t ctx = std::max<int64_t>(opt.prompt + timed + 2, opt.prefill_tokens + 1);
  KvCacheOptions ko;
  ko.block_tokens = 16;
  ko.max_seqs = max_batch;
  const int64_t per_seq = (ctx + ko.block_tokens - 1) / ko.block_tokens;
  ko.num_blocks = int32_t(per_seq * max_batch);
  KvCache kv(c, ko);
  std::vector<int32_t> blocks(size_t(ko.num_blocks));
  for (int32_t i = 0; i < ko.num_blocks; ++i) blocks[size_t(i)] = i;
  Runner run{model, kv, blocks, per_seq, c.vocab_size, std::mt19937(3), {}};
  if (opt.regions) RegionTimer::set_enabled(true);
  // The decode limit: a plain read of the model's own repacked weights, every pair.
  const std::vector<std::span<const uint8_t>> spans = model.prepared_weight_spans();
  const double swept = double(model.prepared_weight_bytes());

  for (int B : opt.batches) {
    run.step(B, 0, opt.prompt);  // context (all sequences in one step)
    run.step(B, opt.prompt, 1);  // warm-up
    if (opt.regions) RegionTimer::reset();
    const double bytes = step_bytes(c, fp, B);
    PairStats ps;
    std::vector<double> ms, lim_gbs;
    int64_t pos = opt.prompt + 1;
    for (int p = 0; p < opt.pairs; ++p) {
      const double bw = swept / sweep_seconds(spans) / 1e9;
      lim_gbs.push_back(bw);
      const double t0 = now_s();
      for (int s = 0; s < opt.steps; ++s) run.step(B, pos++, 1);
      const double dt = (now_s() - t0) / opt.steps;
      ms.push_back(dt * 1e3);
      ps.add(double(B) / dt, double(B) * bw * 1e9 / bytes);
    }
    Row row("decode");
    row.add("batch", B)
        .add("context", int64_t(opt.prompt))
        .add("ms_per_step", median(ms), 2)
        .add("roofline_bytes", int64_t(bytes))
        .add("bytes_per_step", human_bytes(bytes))
        .add("limit_gbs", median(lim_gbs), 2);
    add_pairs(row, ps, "tok_s", "roofline_tok_s");
    rep.print(row);
    if (opt.regions) RegionTimer::print(stderr);
  }

  // Prefill: one prompt in one call, alternated with the FLOP limit (oneDNN's bf16 matmul peak).
  const bool dnn = opt.onednn && onednn_available();
  const double flops = 2 * macs_per_token(c, opt.prefill_tokens);
  run.step(1, 0, std::min<int64_t>(opt.prefill_tokens, 16));  // warm-up
  if (opt.regions) RegionTimer::reset();
  PairStats ps;
  std::vector<double> secs;
  for (int p = 0; p < opt.pairs; ++p) {
    const double peak = dnn ? onednn_peak_gflops(pool.size()) : 0;
    const double t0 = now_s();
    run.step(1, 0, opt.prefill_tokens);
    const double dt = now_s() - t0;
    secs.push_back(dt);
    ps.add(opt.prefill_tokens * flops / dt / 1e9, peak);
  }
  const double dt = median(secs);
  Row row("prefill");
  row.add("tokens", int64_t(opt.prefill_tokens))
      .add("s", dt, 3)
      .add("tok_s", opt.prefill_tokens / dt, 1)
      .add("gflop_per_token", flops / 1e9, 3);
  if (dnn)
    add_pairs(row, ps, "gflops", "flop_limit_gflops", 1);
  else
    row.add("gflops", median(ps.figure), 1);
  rep.print(row);
  if (opt.regions) RegionTimer::print(stderr);
  if (opt.speculative > 0) bench_speculative(rep, model, fp, opt);
}

void bench_vision(Reporter& rep, const VisionBenchOptions& opt) {
  auto ck = Checkpoint::load(opt.model_dir);
  Model model(*ck, ModelOptions{});
  const ModelConfig& c = model.config();
  DI_REQUIRE(model.has_vision(), opt.model_dir, ": the checkpoint has no vision tower");
  int64_t side = opt.side;
  while (side == 0 || (opt.side == 0 && (side + 1) * (side + 2) + 2 <= c.vision_max_n_token))
    ++side;  // the largest s with s (s + 1) + 2 image tokens
  const int64_t r = c.vision_downsample_ratio, p = c.vision_patch_size, n = side * r * side * r;
  const int64_t Dv = c.vision_dim, F = c.vision_inter_dim, D = c.dim, L = side * side;
  // Multiply-adds: the patch embedding, per block qkv, scores, values, wo and SwiGLU, the aligner.
  const double macs = double(n) * 3 * p * p * Dv +
                      double(c.vision_n_layers) * (double(n) * Dv * (3 * Dv + Dv + 3 * F) +
                                                   2.0 * double(n) * double(n) * Dv) +
                      double(L) * (double(Dv) * r * r * D + double(D) * D);
  std::mt19937 rng(5);
  std::vector<uint16_t> patches(size_t(n * 3 * p * p));
  for (auto& v : patches) v = f32_to_bf16(float(int(rng() % 2001) - 1000) / 1000.0f);
  std::vector<float> out;
  model.encode_image(patches.data(), side * r, side * r, out);  // warm-up (prepares the linears)
  const bool dnn = onednn_available();
  PairStats ps;
  std::vector<double> secs;
  for (int i = 0; i < opt.pairs; ++i) {
    const double peak = dnn ? onednn_peak_gflops(ThreadPool::global().size()) : 0;
    const double t0 = now_s();
    model.encode_image(patches.data(), side * r, side * r, out);
    const double dt = now_s() - t0;
    secs.push_back(dt);
    ps.add(2 * macs / dt / 1e9, peak);
  }
  Row row("vision");
  row.add("patches", n).add("image_tokens", side * (side + 1) + 2).add("s", median(secs), 3);
  row.add("gflop", 2 * macs / 1e9, 2);
  if (dnn)
    add_pairs(row, ps, "gflops", "flop_limit_gflops", 1);
  else
    row.add("gflops", median(ps.figure), 1);
  rep.print(row);
}

}  // namespace deepinfer::bench
