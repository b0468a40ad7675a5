#include "runtime/load_engine.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/cpu.h"
#include "core/error.h"
#include "core/format.h"
#include "core/region_timer.h"
#include "core/thread_pool.h"
#include "kv/kv_cache.h"
#include "runtime/builtin.h"
#include "tokenizer/engram_map.h"

namespace deepinfer {

namespace fs = std::filesystem;

namespace {
// Engine limits that no model can run with, named by their flags (before anything loads).
void check_engine_limits(const EngineOptions& o) {
  const SchedulerConfig& s = o.engine.sched;
  auto at_least = [](const char* flag, int64_t v, int64_t min, const char* note = "") {
    DI_REQUIRE(v >= min, flag, " ", v, ": must be >= ", min, note);
  };
  at_least("--max-num-seqs", s.max_num_seqs, 1);
  at_least("--max-num-batched-tokens", s.max_num_batched_tokens, 1);
  at_least("--max-num-prefill-tokens", s.max_num_prefill_tokens, 1);
  at_least("--max-model-len", s.max_model_len, 1);
  at_least("--block-size", s.block_tokens, 1);
  at_least("--prefill-bucket", s.prefill_bucket, 0, " (0: off)");
  at_least("--num-kv-blocks", o.engine.num_kv_blocks, 0, " (0: from --kv-cache-memory)");
  at_least("--kv-cache-memory", o.kv_cache_mib, 1, " (MiB)");
  DI_REQUIRE(o.speculative_method == "none" || o.speculative_method == "ngram" ||
                 o.speculative_method == "dspark",
             "--speculative-method ", o.speculative_method, ": expected none, ngram or dspark");
  at_least("--num-speculative-tokens", o.num_speculative_tokens, 0, " (0: the method's default)");
  at_least("--ngram-max", o.ngram_max, 1);
  at_least("--prefix-cache-memory", o.prefix_cache_mib, 0,
           " (MiB; 0: a quarter of --kv-cache-memory)");
  at_least("--threads", o.threads, 0, " (0: all cores)");
}
}  // namespace

LoadedEngine load_engine(const EngineOptions& o) {
  check_engine_limits(o);
  LoadedEngine le;
  const std::string dir = o.model.empty() ? default_model_dir() : o.model;
  // Ranks start before anything heavy is loaded (the leader forks its followers).
  const ModelConfig cfg = ModelConfig::load(dir);
  o.parallel.validate(cfg.n_routed_experts);
  le.world = ranks::init_world({.world_size = o.parallel.world_size()});
  le.layout = make_rank_layout(o.parallel, *le.world, cfg.n_routed_experts);
  if (le.world->size() > 1) RegionTimer::set_title(str_cat("rank ", le.world->rank()));
  if (o.threads > 0) ThreadPool::set_global_threads(o.threads);
  le.checkpoint = Checkpoint::load(dir, le.layout.expert_begin, le.layout.expert_end);
  const ModelConfig& c = le.checkpoint->config();
  ModelOptions mo;
  mo.numerics = o.dtype == "fp32" ? Numerics::Fp32 : Numerics::Bf16;
  mo.demo_decode_defect = o.demo_decode_defect;
  mo.parallel = le.layout.model;
  EngineConfig ec = o.engine;
  ec.kv_cache_memory = uint64_t(o.kv_cache_mib) << 20;
  ec.prefix_cache_memory = uint64_t(o.prefix_cache_mib) << 20;
  if (o.speculative_method == "ngram") {
    ec.sched.num_speculative_tokens = o.num_speculative_tokens ? o.num_speculative_tokens : 4;
    ec.sched.ngram_max = o.ngram_max;
  } else if (o.speculative_method == "dspark") {
    DI_REQUIRE(le.checkpoint->has_dspark, "--speculative-method dspark: ", dir,
               " has no DSpark draft head (config.json needs dspark_block_size and n_mtp_layers "
               "> 0, and the files the mtp.* tensors)");
    DI_REQUIRE(o.num_speculative_tokens <= c.dspark_block_size, "--num-speculative-tokens ",
               o.num_speculative_tokens, ": the draft head proposes at most its block size, ",
               c.dspark_block_size);
    mo.dspark = le.layout.scheduler;  // only the rank that samples drafts
    // Default: all but the block's last draft (the least likely to stand).
    ec.sched.num_speculative_tokens =
        o.num_speculative_tokens ? o.num_speculative_tokens : std::max(1, c.dspark_block_size - 1);
    ec.sched.dspark = true;
  }
  // The demo's decode defect reads state a resumed sequence would not have.
  ec.prefix_caching = ec.prefix_caching && !o.demo_decode_defect;
  if (fs::exists(fs::path(dir) / "tokenizer.json")) {
    le.tokenizer = Tokenizer::load(dir);
    DI_REQUIRE(le.tokenizer->vocab_size() <= c.vocab_size, dir, ": tokenizer has ",
               le.tokenizer->vocab_size(), " tokens but the model's vocab_size is ", c.vocab_size);
    if (!c.engram_layer_ids.empty()) {
      EngramTokenMap map = build_engram_token_map(*le.tokenizer);
      // Ids past the tokenizer's vocabulary (spare embedding rows, which no text produces) hash
      // like the padding token.
      const int32_t pad = c.engram_pad_id < int64_t(map.compressed.size())
                              ? map.compressed[size_t(c.engram_pad_id)]
                              : 0;
      map.compressed.resize(size_t(c.vocab_size), pad);
      DI_REQUIRE(map.compressed_vocab_size == c.engram_compressed_vocab_size, dir,
                 ": the tokenizer's Engram token map has ", map.compressed_vocab_size,
                 " keys but config.json says engram_compressed_vocab_size = ",
                 c.engram_compressed_vocab_size);
      mo.engram_token_map = std::move(map.compressed);
    }
  }
  le.model = std::make_unique<Model>(*le.checkpoint, mo);
  if (!o.dump_dir.empty()) {
    le.dump = std::make_unique<NpyActivationDump>(o.dump_dir);
    le.model->set_activation_sink(le.dump.get());
  }
  TextDecoder decoder;
  if (const Tokenizer* tok = le.tokenizer.get())
    decoder = [tok](std::span<const int32_t> ids) { return tok->decode(ids, true); };
  {
    // This rank's share of the weights (what expert parallelism divides), after the repack.
    const std::string who =
        le.world->size() > 1 ? str_cat("rank ", le.world->rank(), ": ") : std::string();
    const int64_t rss = resident_memory_bytes();  // 0 where /proc/self/statm cannot be read
    const std::string resident = rss > 0 ? human_bytes(double(rss)) : "unknown";
    std::fprintf(stderr,
                 "deepinfer: %sexperts [%d, %d), weights %.2f GiB mapped + %.2f GiB repacked, "
                 "resident %s\n",
                 who.c_str(), le.layout.expert_begin, le.layout.expert_end,
                 double(le.checkpoint->bound_bytes) / (1 << 30),
                 double(le.model->prepared_weight_bytes()) / (1 << 30), resident.c_str());
  }
  if (!le.layout.scheduler) {
    // A replica follower: the same pool as the scheduler's, and a runner without logits.
    le.follower_kv = std::make_unique<KvCache>(c, size_kv_pool(c, &ec));
    le.follower_runner = std::make_unique<ModelRunner>(*le.model, *le.follower_kv, false);
    return le;
  }
  le.engine = std::make_unique<Engine>(*le.model, ec, decoder, &le.layout);
  if (le.world->rank() == 0) {
    const KvFootprint kv = kv_footprint(c);
    std::fprintf(stderr,
                 "deepinfer: model %s (%d layers, vocab %lld, %s numerics%s)\n"
                 "deepinfer: KV %.1f bytes/token; pool %d blocks x %lld tokens x %d cp = %lld "
                 "tokens (%.1f MiB per rank incl. %d sequence slots)\n",
                 dir.c_str(), c.n_layers, (long long)c.vocab_size, o.dtype.c_str(),
                 le.tokenizer ? ", tokenizer" : ", no tokenizer", kv.bytes_per_token,
                 le.engine->num_kv_blocks(), (long long)le.engine->block_tokens(), o.parallel.cp,
                 (long long)(le.engine->num_kv_blocks() * le.engine->block_tokens()),
                 double(le.engine->kv_pool_bytes()) / (1 << 20), ec.sched.max_num_seqs);
    if (le.world->size() > 1)
      std::fprintf(stderr, "deepinfer: %d ranks (%s): dp %d, cp %d, ep %d\n", le.world->size(),
                   ranks::backend_name(le.world->backend()), o.parallel.dp, o.parallel.cp,
                   o.parallel.ep);
  }
  return le;
}

void LoadedEngine::run_follower() {
  DI_CHECK(is_follower() && layout.channel);
  // Replays the leader's step messages until the shutdown message.
  for (std::vector<uint8_t> msg;;) {
    {
      DI_REGION("comm.step_receive");
      if (!layout.channel->receive(msg)) break;
    }
    follower_runner->execute(decode_sched_output(msg));
  }
  finish();
}

}  // namespace deepinfer
