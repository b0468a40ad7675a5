#include "commands.h"

namespace deepinfer::app {

void add_engine_options(CLI::App* cmd, EngineOptions* o, bool serving) {
  SchedulerConfig& s = o->engine.sched;
  // Debugging options stay out of the server's help (they still parse, so a refusal can name
  // them).
  const std::string hidden_in_serve = serving ? "" : "Options";
  env_option(cmd, "--model", o->model, "Checkpoint directory (default: the built-in tiny model)");
  env_option(cmd, "--dtype", o->dtype, "Activation numerics: bf16 (official) or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  env_option(cmd, "--demo-decode-defect", o->demo_decode_defect,
             "Reproduce the public demo's decode-time index-key sharing (comparisons only)")
      ->group(hidden_in_serve);
  cmd->add_option("--threads", o->threads, "Worker threads (default: all cores)")
      ->envname("DEEPINFER_NUM_THREADS");
  env_option(cmd, "--max-num-seqs", s.max_num_seqs, "Sequences running at once");
  env_option(cmd, "--max-num-batched-tokens", s.max_num_batched_tokens, "Rows per step");
  env_option(cmd, "--max-num-prefill-tokens", s.max_num_prefill_tokens,
             "Prompt rows per step (chunked prefill)");
  env_option(cmd, "--max-model-len", s.max_model_len, "Prompt + generated tokens per request");
  env_option(cmd, "--block-size", s.block_tokens, "Tokens of context per KV block");
  env_option(cmd, "--num-kv-blocks", o->engine.num_kv_blocks,
             "KV pool size in blocks (default: from --kv-cache-memory)", /*show_default=*/false);
  env_option(cmd, "--kv-cache-memory", o->kv_cache_mib, "KV pool budget in MiB");
  env_option(cmd, "--prefill-bucket", s.prefill_bucket,
             "Pad every prompt chunk to this many rows (0: off)", /*show_default=*/false);
  env_option(cmd, "--prompt-as-decode", s.prompt_as_decode,
             "Lay prompt chunks out as decode rows (one row per sequence per step)");
  cmd->add_flag("--no-prefix-caching{false}", o->engine.prefix_caching,
                "Compute every prompt in full (default: reuse cached KV of shared prefixes)")
      ->envname("DEEPINFER_NO_PREFIX_CACHING");
  env_option(cmd, "--prefix-cache-memory", o->prefix_cache_mib,
             "MiB of slot-state snapshots prefix caching resumes from (0: a quarter of "
             "--kv-cache-memory)");
  env_option(cmd, "--speculative-method", o->speculative_method,
             "Speculative decoding, verified exactly: none, ngram (drafts from earlier "
             "occurrences of the last tokens) or dspark (the checkpoint's draft head)")
      ->check(CLI::IsMember({"none", "ngram", "dspark"}));
  env_option(cmd, "--num-speculative-tokens", o->num_speculative_tokens,
             "Drafts per decode step (0: 4 for ngram, the draft block size - 1 for dspark)");
  env_option(cmd, "--ngram-max", o->ngram_max, "Longest n-gram ngram drafting matches");
  ParallelConfig& pc = o->parallel;
  env_option(cmd, "--dp", pc.dp, "Data-parallel replicas (each schedules its own requests)");
  env_option(cmd, "--cp", pc.cp, "Context-parallel ranks (split each sequence's compressed KV)");
  env_option(cmd, "--ep", pc.ep, "Expert-parallel ranks (split the routed experts)");
  env_option(cmd, "--prefill-attempt-interval", pc.prefill_attempt_interval,
             "Data parallelism: vote on prefilling every this many steps");
  env_option(cmd, "--engram-sharding", pc.engram_sharding,
             "Engram tables: shard rows over ranks sharing tokens (on), read a shared "
             "mapping (off), or shard only across hosts (auto)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_option("--dump-dir", o->dump_dir,
                  "Write per-layer activations of single-sequence steps as .npy files here")
      ->group(hidden_in_serve);
}

}  // namespace deepinfer::app
