// `deepinfer serve`: the OpenAI-compatible HTTP server (src/server) on the engine. SIGTERM or
// SIGINT starts a graceful shutdown (stop accepting, let calls in flight finish within
// --shutdown-timeout, cancel the rest); a second signal cancels at once.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>
#include <tuple>

#include "commands.h"
#include "core/error.h"
#include "engine/replicas.h"
#include "server/http_server.h"
#include "server/structured_output.h"

namespace deepinfer::app {

namespace {

struct ServeOptions {
  EngineOptions eo;
  server::ServerOptions so;
  std::string served_model_name, api_key_file;
  const CLI::Option* api_key_given = nullptr;  // --api-key or DEEPINFER_API_KEY
  int64_t max_body_mib = 8;
};

// The key from --api-key-file, or the one given; an empty key given on purpose is refused (it
// would serve without authentication while the operator believes otherwise).
void resolve_api_key(ServeOptions& o) {
  if (!o.api_key_file.empty()) {
    std::ifstream in(o.api_key_file);
    DI_REQUIRE(in, "--api-key-file ", o.api_key_file, ": cannot read it");
    std::getline(in, o.so.api_key);
    o.so.api_key.erase(o.so.api_key.find_last_not_of(" \t\n\v\f\r") + 1);  // trailing spaces
    DI_REQUIRE(!o.so.api_key.empty(), "--api-key-file ", o.api_key_file,
               ": its first line is empty; expected the API key");
  } else if (o.api_key_given && o.api_key_given->count() > 0) {
    DI_REQUIRE(!o.so.api_key.empty(),
               "--api-key (or DEEPINFER_API_KEY) is empty: that would serve without "
               "authentication; give a key, or leave the option out to serve without one");
  }
}

void serve(ServeOptions& o) {
  // Signals go to one watcher thread; every thread started from here on inherits the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  DI_REQUIRE(o.max_body_mib >= 1, "--max-body-mib must be >= 1");
  resolve_api_key(o);
  o.so.limits.max_body_bytes = size_t(o.max_body_mib) << 20;
  LoadedEngine le = load_engine(o.eo);
  if (le.world->rank() != 0) {
    // A context/expert-parallel rank replays the leader's steps, a data-parallel replica serves
    // the requests the leader sends it, until the server stops. The leader handles
    // SIGINT/SIGTERM (a terminal or a service manager signals every process) and ends the run;
    // a rank whose leader dies notices and exits.
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    pthread_sigmask(SIG_UNBLOCK, &sigs, nullptr);
    if (le.is_follower()) return le.run_follower();
  }
  const ModelConfig& c = le.checkpoint->config();
  // Structured outputs: the vocabulary as grammar bytes, built once (a trie of every token).
  std::unique_ptr<server::GrammarCache> grammars;
  if (le.tokenizer)
    grammars = std::make_unique<server::GrammarCache>(
        server::make_grammar_vocab(*le.tokenizer, c.vocab_size, c.eos_token_id));
  if (le.world->rank() != 0) {
    GrammarResolver resolve;
    if (grammars)
      resolve = [&grammars](std::string_view source) {
        return grammars->get(server::decode_output_shape(source));
      };
    serve_replica(*le.engine, *le.layout.dp, resolve);
    return le.finish();
  }

  const std::string given = o.eo.model.empty() ? "deepinfer-tiny" : o.eo.model;
  std::string name = o.served_model_name;
  if (name.empty()) name = std::filesystem::path(given).filename().string();
  if (name.empty()) name = given;  // a path ending in '/'
  server::ModelInfo info{.names = {name, given},
                         .tokenizer = le.tokenizer.get(),
                         .vocab_size = c.vocab_size,
                         .max_model_len = o.eo.engine.sched.max_model_len,
                         .created = int64_t(std::time(nullptr)),
                         .grammars = grammars.get()};
  if (c.has_vision() && le.checkpoint->has_vision) {
    info.vision = {c.vision_patch_size, c.vision_downsample_ratio, c.vision_max_n_token,
                   c.vision_min_pixels, c.vision_max_wh_ratio};
    info.image_token_id = int32_t(c.image_token_id);
  }

  server::ApiServer srv(*le.engine, info, o.so,
                        le.layout.cfg.dp > 1 ? le.layout.dp.get() : nullptr);
  if (le.world->size() > 1) srv.set_health_probe([&le] { return le.world->dead_rank(); });
  const int port = srv.bind();
  // An IPv6 address goes in brackets in a URL.
  const std::string host =
      o.so.host.find(':') != std::string::npos ? "[" + o.so.host + "]" : o.so.host;
  std::fprintf(stderr, "deepinfer: serving '%s' on http://%s:%d%s\n", name.c_str(), host.c_str(),
               port, o.so.api_key.empty() ? "" : " (API key required)");

  std::atomic<bool> done{false};
  std::thread watcher([&] {
    int count = 0;
    const timespec tick{0, 200'000'000};
    while (!done) {
      const int sig = sigtimedwait(&sigs, nullptr, &tick);
      if (sig <= 0) continue;
      if (count++ == 0) {
        std::fprintf(stderr, "deepinfer: %s: shutting down (again to cancel running requests)\n",
                     sig == SIGTERM ? "SIGTERM" : "SIGINT");
        srv.shutdown();
      } else {
        std::fprintf(stderr, "deepinfer: cancelling running requests\n");
        srv.cancel_all();
      }
    }
  });
  srv.run();
  done = true;
  watcher.join();
  if (srv.failed()) {
    // A supervisor restarts a server that exits non-zero. The other ranks' fate is not waited
    // for: one of them is what failed.
    std::fprintf(stderr, "deepinfer: server stopped after an engine failure\n");
    std::fflush(stderr);
    std::_Exit(3);
  }
  le.finish();  // other ranks: the shutdown message, then their exit
  std::fprintf(stderr, "deepinfer: server stopped\n");
}

}  // namespace

void add_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server");
  add_engine_options(cmd, &o->eo, /*serving=*/true);
  server::ServerOptions& so = o->so;
  env_option(cmd, "--host", so.host, "Address to listen on");
  env_option(cmd, "--port", so.port, "Port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535));
  CLI::Option* key =
      env_option(cmd, "--api-key", so.api_key,
                 "Require 'Authorization: Bearer KEY' on the API (visible in ps: prefer "
                 "DEEPINFER_API_KEY or --api-key-file)");
  cmd->add_option("--api-key-file", o->api_key_file,
                  "Read the API key from this file (its first line)")
      ->excludes(key);
  o->api_key_given = key;
  cmd->add_option("--served-model-name", o->served_model_name,
                  "Model name clients use (default: the model directory's name)");
  cmd->add_option("--max-body-mib", o->max_body_mib, "Largest request body accepted")
      ->capture_default_str();
  cmd->add_option("--http-threads", so.http_threads,
                  "Threads that parse and tokenize request bodies")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--max-connections", so.max_connections,
                  "Connections open at once (beyond: the longest idle one closes, else 503)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  for (const auto& [name, seconds, help] :
       {std::tuple{"--request-timeout", &so.request_timeout_s,
                   "Seconds from a request's first byte to its last (else 408)"},
        std::tuple{"--idle-timeout", &so.idle_timeout_s,
                   "Seconds a kept-alive connection may wait for its next request"},
        std::tuple{"--write-timeout", &so.write_timeout_s,
                   "Seconds a client may leave output unread before it is dropped"}})
    cmd->add_option(name, *seconds, help)->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--shutdown-timeout", so.shutdown_timeout_s,
                  "Seconds running requests get to finish after SIGTERM")
      ->capture_default_str();
  cmd->add_option("--seed", o->eo.engine.seed, "Seeds requests that bring no seed")
      ->capture_default_str();
  cmd->callback([o] { serve(*o); });
}

}  // namespace deepinfer::app
