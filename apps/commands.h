// Subcommands of the `deepinfer` executable. Each registers its options on the app and returns
// nothing; CLI11 runs the callback of the chosen one.
#pragma once

#include <CLI/CLI.hpp>
#include <cctype>
#include <string>

#include "runtime/load_engine.h"

namespace deepinfer::app {

void add_generate(CLI::App& app);
void add_serve(CLI::App& app);

// An option (a flag for a bool) that also reads DEEPINFER_<FLAG>: --max-num-seqs from
// DEEPINFER_MAX_NUM_SEQS. An option's help shows its default unless `show_default` is false.
template <typename T>
CLI::Option* env_option(CLI::App* cmd, const std::string& flag, T& var, const std::string& help,
                        bool show_default = true) {
  std::string env = "DEEPINFER_" + flag.substr(2);
  for (char& ch : env) ch = ch == '-' ? '_' : char(std::toupper(static_cast<unsigned char>(ch)));
  if constexpr (std::is_same_v<T, bool>) return cmd->add_flag(flag, var, help)->envname(env);
  CLI::Option* o = cmd->add_option(flag, var, help)->envname(env);
  return show_default ? o->capture_default_str() : o;
}

// Options shared by the commands that run the engine (generate, serve): the model, numerics
// and engine limits, parsed into runtime/load_engine.h's EngineOptions. Each option also reads a
// DEEPINFER_* environment variable so that spawned ranks inherit the leader's settings. `serving`:
// for `serve`, which leaves data parallelism and debugging options out of its help.
void add_engine_options(CLI::App* cmd, EngineOptions* o, bool serving = false);

}  // namespace deepinfer::app
