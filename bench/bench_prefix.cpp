#include "bench_prefix.h"

#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "io/checkpoint.h"
#include "model/model.h"

namespace deepinfer::bench {

namespace {

// Seconds from queueing `prompt` to its first token; the request then ends (one token).
double time_to_first_token(Engine& e, RequestId id, const std::vector<int32_t>& prompt) {
  Request r;
  r.id = id;
  r.prompt_ids = prompt;
  r.params.max_tokens = 1;
  r.params.temperature = 0;
  const double t0 = now_s();
  DI_REQUIRE(e.add_request(std::move(r)).empty(), "bench prefix-cache: request refused");
  while (e.step().empty()) {
  }
  const double dt = now_s() - t0;
  while (e.has_unfinished()) e.step();
  e.take_finished();
  return dt;
}

}  // namespace

void bench_prefix(Reporter& rep, const PrefixBenchOptions& opt) {
  DI_REQUIRE(!opt.model_dir.empty(), "bench prefix-cache: --model DIR is required");
  auto ck = Checkpoint::load(opt.model_dir);
  Model model(*ck, ModelOptions{});
  const int64_t V = model.config().vocab_size;
  EngineConfig cfg;
  cfg.sched.max_num_seqs = 1;
  cfg.sched.max_model_len = opt.prefix + opt.suffix + 1;
  Engine cached(model, cfg);
  cfg.prefix_caching = false;
  Engine cold(model, cfg);
  rep.note(str_cat("model ", opt.model_dir, "; ", ThreadPool::global().size(),
                   " threads; blocks of ", cfg.sched.block_tokens, " tokens; ",
                   cached.stats().prefix_snapshots, " snapshots"));

  std::mt19937_64 rng(11);
  auto tokens = [&](int n) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(int32_t(rng() % uint64_t(V)));
    return t;
  };
  const std::vector<int32_t> prefix = tokens(opt.prefix);
  auto request = [&] {
    std::vector<int32_t> p = prefix;
    for (int32_t t : tokens(opt.suffix)) p.push_back(t);
    return p;
  };
  RequestId id = 0;
  // The earlier request leaves the prefix in the cache (and warms both engines up).
  time_to_first_token(cached, id++, request());
  time_to_first_token(cold, id++, request());
  PairStats ps;
  std::vector<double> cold_s, cached_s;
  const int64_t hits_before = cached.stats().prefix_hit_tokens;
  for (int p = 0; p < opt.pairs; ++p) {
    const std::vector<int32_t> prompt = request();
    cold_s.push_back(time_to_first_token(cold, id++, prompt));
    cached_s.push_back(time_to_first_token(cached, id++, request()));
    ps.add(cold_s.back(), cached_s.back());  // ratio: cold / cached
  }
  Row row("prefix_cache");
  row.add("prefix", int64_t(opt.prefix))
      .add("suffix", int64_t(opt.suffix))
      .add("hit_tokens_per_request", (cached.stats().prefix_hit_tokens - hits_before) / opt.pairs);
  add_pairs(row, ps, "cold_ttft_s", "cached_ttft_s", 4);
  rep.print(row);
}

}  // namespace deepinfer::bench
