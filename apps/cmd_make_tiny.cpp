#include <chrono>
#include <cstdio>
#include <string>

#include "commands.h"
#include "io/tiny.h"
#include "runtime/builtin.h"

namespace deepinfer::app {

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

}  // namespace deepinfer::app
