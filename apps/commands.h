// Subcommands of the `deepinfer` executable. Each registers its options on the app and returns
// nothing; CLI11 runs the callback of the chosen one.
#pragma once

#include <CLI/CLI.hpp>

namespace deepinfer::app {

void add_make_tiny(CLI::App& app);
void add_inspect(CLI::App& app);
void add_generate(CLI::App& app);
void add_serve(CLI::App& app);

}  // namespace deepinfer::app
