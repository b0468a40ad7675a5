#include "engine_options.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace deepinfer::app {

namespace fs = std::filesystem;

void add_engine_options(CLI::App* cmd, EngineOptions* o, bool serving) {
  SchedulerConfig& s = o->engine.sched;
  // The server does not take data-parallel replicas yet, and debugging options stay out of its
  // help (they still parse, so a refusal can name them).
  const std::string hidden_in_serve = serving ? "" : "Options";
  cmd->add_option("--model", o->model, "Checkpoint directory (default: the built-in tiny model)")
      ->envname("DEEPINFER_MODEL");
  cmd->add_option("--dtype", o->dtype, "Activation numerics: bf16 (official) or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->envname("DEEPINFER_DTYPE")
      ->capture_default_str();
  cmd->add_flag("--demo-decode-defect", o->demo_decode_defect,
                "Reproduce the public demo's decode-time index-key sharing (comparisons only)")
      ->envname("DEEPINFER_DEMO_DECODE_DEFECT")
      ->group(hidden_in_serve);
  cmd->add_option("--threads", o->threads, "Worker threads (default: all cores)")
      ->envname("DEEPINFER_NUM_THREADS");
  cmd->add_option("--max-num-seqs", s.max_num_seqs, "Sequences running at once")
      ->envname("DEEPINFER_MAX_NUM_SEQS")
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", s.max_num_batched_tokens, "Rows per step")
      ->envname("DEEPINFER_MAX_NUM_BATCHED_TOKENS")
      ->capture_default_str();
  cmd->add_option("--max-num-prefill-tokens", s.max_num_prefill_tokens,
                  "Prompt rows per step (chunked prefill)")
      ->envname("DEEPINFER_MAX_NUM_PREFILL_TOKENS")
      ->capture_default_str();
  cmd->add_option("--max-model-len", s.max_model_len, "Prompt + generated tokens per request")
      ->envname("DEEPINFER_MAX_MODEL_LEN")
      ->capture_default_str();
  cmd->add_option("--block-size", s.block_tokens, "Tokens of context per KV block")
      ->envname("DEEPINFER_BLOCK_SIZE")
      ->capture_default_str();
  cmd->add_option("--num-kv-blocks", o->engine.num_kv_blocks,
                  "KV pool size in blocks (default: from --kv-cache-memory)")
      ->envname("DEEPINFER_NUM_KV_BLOCKS");
  cmd->add_option("--kv-cache-memory", o->kv_cache_mib, "KV pool budget in MiB")
      ->envname("DEEPINFER_KV_CACHE_MEMORY")
      ->capture_default_str();
  cmd->add_option("--prefill-bucket", s.prefill_bucket,
                  "Pad every prompt chunk to this many rows (0: off)")
      ->envname("DEEPINFER_PREFILL_BUCKET");
  cmd->add_flag("--prompt-as-decode", s.prompt_as_decode,
                "Lay prompt chunks out as decode rows (one row per sequence per step)")
      ->envname("DEEPINFER_PROMPT_AS_DECODE");
  ParallelConfig& pc = o->parallel;
  cmd->add_option("--dp", pc.dp, "Data-parallel ranks (each schedules its own requests)")
      ->envname("DEEPINFER_DP")
      ->capture_default_str()
      ->group(hidden_in_serve);
  cmd->add_option("--cp", pc.cp, "Context-parallel ranks (split each sequence's compressed KV)")
      ->envname("DEEPINFER_CP")
      ->capture_default_str();
  cmd->add_option("--ep", pc.ep, "Expert-parallel ranks (split the routed experts)")
      ->envname("DEEPINFER_EP")
      ->capture_default_str();
  cmd->add_option("--prefill-attempt-interval", pc.prefill_attempt_interval,
                  "Data parallelism: vote on prefilling every this many steps")
      ->envname("DEEPINFER_PREFILL_ATTEMPT_INTERVAL")
      ->capture_default_str()
      ->group(hidden_in_serve);
  cmd->add_option("--engram-sharding", pc.engram_sharding,
                  "Engram tables: shard rows over ranks sharing tokens (on), read a shared "
                  "mapping (off), or shard only across hosts (auto)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->envname("DEEPINFER_ENGRAM_SHARDING")
      ->capture_default_str();
  cmd->add_option("--dump-dir", o->dump_dir,
                  "Write per-layer activations of single-sequence steps as .npy files here")
      ->group(hidden_in_serve);
}

}  // namespace deepinfer::app
