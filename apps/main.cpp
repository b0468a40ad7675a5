// The `deepinfer` command: make-tiny, inspect, generate, serve, bench.
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "core/error.h"

#ifdef DEEPINFER_HAVE_BENCH
#include "bench/bench_util.h"
#endif

namespace {

void add_bench(CLI::App& app) {
#ifdef DEEPINFER_HAVE_BENCH
  deepinfer::bench::add_command(app);
#else
  CLI::App* cmd = app.add_subcommand("bench", "Benchmarks (not in this build)");
  cmd->allow_extras();
  cmd->callback([] {
    throw deepinfer::Error(
        "this build has no benchmarks (configure with -DDEEPINFER_BUILD_BENCH=ON)");
  });
#endif
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DeepInfer: DeepSeek-V4.1 inference from the official checkpoint"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "deepinfer 0.1.0");
  deepinfer::app::add_make_tiny(app);
  deepinfer::app::add_inspect(app);
  add_bench(app);
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
