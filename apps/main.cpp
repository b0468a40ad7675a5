// The `deepinfer` command: make-tiny, inspect, generate, serve, bench. The checkpoint commands
// (make-tiny, inspect) and bench are here; generate and serve have their own files.
#include <chrono>
#include <cstdio>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "core/format.h"
#include "io/checkpoint.h"
#include "io/tiny.h"
#include "kv/kv_cache.h"
#include "runtime/builtin.h"

#ifdef DEEPINFER_HAVE_BENCH
#include "bench/bench_util.h"
#endif

namespace deepinfer::app {
namespace {

void add_make_tiny(CLI::App& app) {
  struct Opts {
    std::string out, layout = "release";
    TinyCheckpoint t;
  };
  auto o = std::make_shared<Opts>();
  TinyCheckpoint& t = o->t;
  std::string presets;
  for (const auto& n : tiny_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  CLI::App* cmd = app.add_subcommand(
      "make-tiny", "Write a deterministic random checkpoint in the official V4.1 format");
  cmd->add_option("--out", o->out, "Output directory")->required();
  cmd->add_option("--preset", t.preset, "One of: " + presets)->capture_default_str();
  cmd->add_option("--seed", t.seed, "Random seed")->capture_default_str();
  CLI::Option* random =
      cmd->add_option("--random-config", t.config_seed,
                      "Draw the config from this seed (any layer pattern the reference accepts) "
                      "instead of a preset");
  cmd->get_option("--preset")->excludes(random);
  cmd->add_option("--layout", o->layout,
                  "release (fp8/fp4 + scales, as DeepSeek ships it) or runtime (the reference's "
                  "state after loading: wo_a BF16, ratio>1 compressor F32, norms and gate F32)")
      ->check(CLI::IsMember({"release", "runtime"}))
      ->capture_default_str();
  cmd->add_flag("--vision", t.vision,
                "Add a small vision tower (2 ViT blocks, patch 14, 3x3 aligner) and bias_vl");
  cmd->add_option("--tokenizer", t.tokenizer,
                  "Copy this tokenizer (tokenizer.json or its directory) into the checkpoint");
  cmd->callback([o, random] {
    const auto t0 = std::chrono::steady_clock::now();
    TinyCheckpoint& t = o->t;
    t.random = random->count() > 0;
    t.layout = parse_tiny_layout(o->layout);
    const uint64_t bytes = make_tiny_checkpoint(o->out, t);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("wrote %s (seed %llu, %s layout) to %s: %.1f MiB of tensors in %.1f s\n",
                t.label().c_str(), static_cast<unsigned long long>(t.seed), o->layout.c_str(),
                o->out.c_str(), double(bytes) / (1 << 20), s);
  });
}

std::string join(const std::vector<int>& v) {  // [1,2,3]
  return nlohmann::json(v).dump();
}

void inspect(const std::string& dir) {
  auto ck = Checkpoint::load(dir);
  const ModelConfig& c = ck->config();
  std::printf("model: %s\n", dir.c_str());
  std::printf("  vocab %lld, dim %lld, %d layers (+%d DSpark), hc_mult %d\n",
              (long long)c.vocab_size, (long long)c.dim, c.n_layers, c.n_mtp_layers, c.hc_mult);
  std::printf(
      "  attention: %d heads x %lld (rope %lld), q_lora %lld, o_groups %d x %lld, "
      "window %lld\n",
      c.n_heads, (long long)c.head_dim, (long long)c.rope_head_dim, (long long)c.q_lora_rank,
      c.o_groups, (long long)c.o_lora_rank, (long long)c.window_size);
  std::printf(
      "  compress ratios %s; KV sources %s; index sources %s; candidate source %d\n",
      join(std::vector<int>(c.compress_ratios.begin(), c.compress_ratios.begin() + c.n_layers))
          .c_str(),
      join(c.kv_source_layers).c_str(), join(c.index_source_layers).c_str(),
      c.candidate_source_layer);
  std::printf("  indexer: %d heads x %lld, top-k %d; candidates %d blocks of %d\n", c.index_n_heads,
              (long long)c.index_head_dim, c.index_topk, c.candidate_topk_blocks,
              c.candidate_block_size);
  std::printf(
      "  MoE: %d routed experts (top-%d) + 1 shared, inter %lld, route_scale %g, "
      "swiglu_limit %g\n",
      c.n_routed_experts, c.n_activated_experts, (long long)c.moe_inter_dim, c.route_scale,
      c.swiglu_limit);
  if (!c.engram_layer_ids.empty())
    std::printf("  Engram: layers %s, n-grams 2..%d x %d heads, row width %lld\n",
                join(c.engram_layer_ids).c_str(), c.engram_max_ngram_size, c.engram_n_heads,
                (long long)c.engram_head_dim);

  // Tensors by dtype, as stored.
  std::map<std::string, std::pair<size_t, uint64_t>> by_dtype;
  for (const std::string& n : ck->store().names()) {
    const TensorInfo& t = ck->store().get(n);
    auto& e = by_dtype[std::string(dtype_name(t.dtype))];
    ++e.first;
    e.second += t.nbytes;
  }
  std::printf("tensors: %zu (%s)", ck->store().size(),
              human_bytes(double(ck->store().total_bytes())).c_str());
  if (!ck->skipped_tensors.empty())
    std::printf(", of which %zu not run by the text model (DSpark/vision)",
                ck->skipped_tensors.size());
  std::printf("\n");
  for (const auto& [dt, e] : by_dtype)
    std::printf("  %-8s %6zu tensors  %s\n", dt.c_str(), e.first,
                human_bytes(double(e.second)).c_str());

  // How each slot was loaded: layer and expert numbers folded into '*'. Slots in the order they
  // first appear: slot -> "stored -> computes" -> n.
  nlohmann::ordered_map<std::string, std::map<std::string, size_t>> forms;
  const std::regex number(R"(\.[0-9]+)");
  for (const auto& [name, form] : ck->forms) ++forms[std::regex_replace(name, number, ".*")][form];
  std::printf("slots as loaded (stored dtype -> computation):\n");
  for (const auto& [slot, by_form] : forms)
    for (const auto& [form, n] : by_form)
      std::printf("  %-42s %4zux %s\n", slot.c_str(), n, form.c_str());

  const WeightFootprint w = weight_footprint(c);
  std::printf("weights read per decoded token: %s (dense %s incl. head %s, experts %s)\n",
              human_bytes(double(w.per_token)).c_str(),
              human_bytes(double(w.dense_per_token)).c_str(), human_bytes(double(w.head)).c_str(),
              human_bytes(double(w.experts_per_token)).c_str());
  const KvFootprint kv = kv_footprint(c);
  std::printf(
      "KV cache: %.1f B per token of context (compressed KV fp4 + index keys fp4); "
      "fixed per sequence %s (window rings fp8 %s, compressor carry %s)\n",
      kv.bytes_per_token, human_bytes(double(kv.fixed_bytes_per_seq())).c_str(),
      human_bytes(double(kv.window_bytes)).c_str(), human_bytes(double(kv.carry_bytes)).c_str());
}

void add_inspect(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Summarise a checkpoint: config, tensors, bytes per token, KV bytes per token");
  cmd->add_option("dir", *dir, "Checkpoint directory (default: the built-in tiny model)");
  cmd->callback([dir] { inspect(dir->empty() ? default_model_dir() : *dir); });
}

void add_bench(CLI::App& app) {
#ifdef DEEPINFER_HAVE_BENCH
  bench::add_command(app);
#else
  CLI::App* cmd = app.add_subcommand("bench", "Benchmarks (not in this build)");
  cmd->allow_extras();
  cmd->callback([] {
    throw Error("this build has no benchmarks (configure with -DDEEPINFER_BUILD_BENCH=ON)");
  });
#endif
}

}  // namespace
}  // namespace deepinfer::app

int main(int argc, char** argv) {
  CLI::App app{"DeepInfer: DeepSeek-V4.1 inference from the official checkpoint"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "deepinfer 0.1.0");
  deepinfer::app::add_make_tiny(app);
  deepinfer::app::add_inspect(app);
  deepinfer::app::add_bench(app);
  deepinfer::app::add_generate(app);
  deepinfer::app::add_serve(app);
  // A first argument that names no command gets said so (CLI11 would report a missing one).
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      known |= sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "deepinfer: error: unknown command '%s' (expected one of: %s)\n",
                   argv[1], names.c_str());
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {  // deepinfer::Error and anything else
    std::fprintf(stderr, "deepinfer: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
