// Assembling a runnable engine from options, for leaders and followers alike: ranks (spawned or
// joined), this rank's share of the checkpoint, the tokenizer and its Engram token map, the model
// and the engine (or, on replica followers, the runner that replays the scheduler's steps).
// Commands and library users call load_engine; apps/ only turns flags into EngineOptions.
#pragma once

#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/parallel.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "ranks/world.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

struct EngineOptions {
  std::string model;  // empty: the built-in tiny model
  std::string dtype = "bf16";
  bool demo_decode_defect = false;
  int threads = 0;
  EngineConfig engine;
  int64_t kv_cache_mib = 512;
  int64_t prefix_cache_mib = 0;  // 0: a quarter of kv_cache_mib
  // Speculative decoding: "none", "ngram" (prompt lookup) or "dspark" (the checkpoint's draft
  // head); drafts per step (0: the method's default, 4 for ngram, block size - 1 for dspark); the
  // longest n-gram matched.
  std::string speculative_method = "none";
  int num_speculative_tokens = 0;
  int ngram_max = 3;
  std::string dump_dir;
  ParallelConfig parallel;
};

// Everything a command needs to run requests: checkpoint, optional tokenizer, model, engine.
struct LoadedEngine {
  std::unique_ptr<ranks::World> world;
  RankLayout layout;
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the checkpoint has none
  std::unique_ptr<Model> model;
  std::unique_ptr<NpyActivationDump> dump;
  std::unique_ptr<Engine> engine;  // null on replica followers
  // Replica followers: the pool and runner that replay the scheduler's steps.
  std::unique_ptr<KvCache> follower_kv;
  std::unique_ptr<ModelRunner> follower_runner;

  bool is_follower() const { return engine == nullptr; }
  // Replica followers: replays steps until the scheduler ends the run, then finish(). Everyone:
  // ends the run (the world's leader waits for every other rank to exit).
  void run_follower();
  void finish() {
    if (world) world->finish();
  }
};

// Starts the ranks (--dp/--cp/--ep spawn follower processes running this same command), loads
// everything this rank needs and prints a startup summary (model, KV pool) to stderr.
LoadedEngine load_engine(const EngineOptions& o);

}  // namespace deepinfer
