// Command-line options shared by the commands that run the engine (generate, serve, bench): the
// model, numerics and engine limits, parsed into runtime/load_engine.h's EngineOptions. Each
// option also reads a DEEPINFER_* environment variable so that spawned ranks inherit the
// leader's settings.
#pragma once

#include <CLI/CLI.hpp>

#include "runtime/load_engine.h"

namespace deepinfer::app {

using deepinfer::EngineOptions;
using deepinfer::load_engine;
using deepinfer::LoadedEngine;

// `serving`: for `serve`, which leaves data parallelism and debugging options out of its help.
void add_engine_options(CLI::App* cmd, EngineOptions* o, bool serving = false);

}  // namespace deepinfer::app
