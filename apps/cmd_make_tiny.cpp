#include <chrono>
#include <cstdio>
#include <string>

#include "commands.h"
#include "io/tiny.h"
#include "model/builtin.h"

namespace deepinfer::app {

void add_make_tiny(CLI::App& app) {
  struct Opts {
    std::string out, preset = "tiny", tokenizer;
    uint64_t seed = 0;
  };
  auto o = std::make_shared<Opts>();
  std::string presets;
  for (const auto& n : tiny_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  CLI::App* cmd = app.add_subcommand(
      "make-tiny", "Write a deterministic random checkpoint in the official V4.1 format");
  cmd->add_option("--out", o->out, "Output directory")->required();
  cmd->add_option("--preset", o->preset, "One of: " + presets)->capture_default_str();
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "Copy this tokenizer (tokenizer.json or its directory) into the checkpoint");
  cmd->callback([o] {
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t bytes = make_tiny_checkpoint(o->out, o->preset, o->seed, o->tokenizer);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("wrote preset %s (seed %llu) to %s: %.1f MiB of tensors in %.1f s\n",
                o->preset.c_str(), static_cast<unsigned long long>(o->seed), o->out.c_str(),
                double(bytes) / (1 << 20), s);
  });
}

}  // namespace deepinfer::app
