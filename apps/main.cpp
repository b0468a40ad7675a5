// The `deepinfer` command: make-tiny, inspect, generate, serve, bench.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"DeepInfer: DeepSeek-V4.1 inference from the official checkpoint"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "deepinfer 0.1.0");
  deepinfer::app::add_make_tiny(app);
  deepinfer::app::add_inspect(app);
  deepinfer::app::add_bench(app);
  deepinfer::app::add_generate(app);
  deepinfer::app::add_serve(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const deepinfer::Error& e) {
    std::fprintf(stderr, "deepinfer: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "deepinfer: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
