// `deepinfer generate`: the offline runner. Reads prompts (text, ids, a JSONL file, or synthetic),
// runs them through the engine with continuous batching, and writes one JSON line per request in
// input order.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "commands.h"
#include "core/error.h"
#include "core/file.h"
#include "engine/replicas.h"
#include "server/json_fields.h"
#include "server/structured_output.h"
#include "tokenizer/chat.h"
#include "vision/image.h"

namespace deepinfer::app {

namespace {

// Ordered: a JSON schema in a line keeps its property order (the order the output follows).
using json = nlohmann::ordered_json;

struct GenerateOptions {
  EngineOptions eo;
  std::string prompt, prompt_ids, prompts_file, output, system;
  int64_t num_prompts = -1, input_len = 32;  // num_prompts < 0: not given
  bool chat = false, thinking = false;
  int reasoning_effort = 0;
  SamplingParams params;
};

// One input line's outcome: a request to run, or an error to report in its place.
struct Input {
  Request req;
  std::string error;
};

std::vector<int32_t> tokenize(const GenerateOptions& o, const Tokenizer* tok,
                              const std::string& text) {
  DI_REQUIRE(tok,
             "text prompts need a tokenizer, and this checkpoint has none "
             "(give token ids with --prompt-ids or \"prompt_ids\")");
  // Chat encoding carries its own BOS; plain text gets none (as the completions API).
  if (!o.chat) return tok->encode(text, false);
  std::vector<ChatMessage> msgs(o.system.empty() ? 1 : 2);  // [system,] user
  msgs[0].role = ChatRole::kSystem;
  msgs[0].content = o.system;
  msgs.back().role = ChatRole::kUser;
  msgs.back().content = text;
  ChatOptions co;
  co.thinking = o.thinking;
  co.reasoning_effort = o.reasoning_effort;
  return tok->encode(encode_chat(msgs, co), false);
}

// A JSONL line's fields over the command-line defaults: the sampling fields as the OpenAI server
// reads them, "max_tokens", "logprobs" (the number of alternatives), and "response_format" (as
// in the API) or "json_schema" (the schema itself) to constrain the output.
void apply_request_fields(const json& j, const GenerateOptions& o, server::ModelInfo& info,
                          const std::function<server::GrammarCache*()>& grammars,
                          SamplingParams* p) {
  server::parse_sampling_fields(j, info, p);
  if (const json* v = server::find_field(j, "max_tokens"))
    p->max_tokens = server::get_int(*v, "max_tokens", 1, INT64_MAX / 2);
  if (const json* v = server::find_field(j, "logprobs"))
    p->logprobs = server::get_int(*v, "logprobs", 0, 20);
  server::OutputShape shape;
  server::parse_response_format(j, &shape);
  if (const json* v = server::find_field(j, "json_schema")) {
    if (shape.kind != server::OutputShape::Kind::kFree)
      server::throw_bad_value("json_schema", "give one of 'response_format' and 'json_schema'.");
    if (!v->is_object() && !v->is_boolean()) server::throw_bad_type("json_schema", "a schema", *v);
    shape.kind = server::OutputShape::Kind::kJsonSchema;
    shape.schema_json = v->dump();
  }
  if (shape.kind == server::OutputShape::Kind::kFree) return;
  shape.after_thinking = o.chat && o.thinking;
  info.grammars = grammars();
  server::constrain(shape, info, p);
}

std::vector<Input> read_inputs(const GenerateOptions& o, const Tokenizer* tok, int64_t vocab,
                               const vision::VisionLimits& vision,
                               const std::function<server::GrammarCache*()>& grammars) {
  std::vector<Input> in;
  server::ModelInfo info;  // what a line's fields are checked against
  info.tokenizer = tok;
  info.vocab_size = vocab;
  auto next = [&]() -> Input& {  // a new input with the flags' sampling parameters
    in.emplace_back().req.params = o.params;
    return in.back();
  };
  int given =
      !o.prompt.empty() + !o.prompt_ids.empty() + !o.prompts_file.empty() + (o.num_prompts >= 0);
  DI_REQUIRE(given == 1, "give exactly one of --prompt, --prompt-ids, --prompts or --num-prompts");
  DI_REQUIRE(o.input_len >= 1, "--input-len ", o.input_len, ": must be >= 1");
  if (!o.prompt.empty()) {
    next().req.prompt_ids = tokenize(o, tok, o.prompt);
  } else if (!o.prompt_ids.empty()) {
    const json ids = json::parse("[" + o.prompt_ids + "]", nullptr, false);
    DI_REQUIRE(!ids.is_discarded(), "--prompt-ids: an entry of '", o.prompt_ids,
               "' is not an integer token id (expected e.g. 1,2,3)");
    next().req.prompt_ids = server::token_list(ids, "--prompt-ids", vocab);
  } else if (o.num_prompts >= 0) {
    std::mt19937_64 rng(o.eo.engine.seed);
    for (int64_t i = 0; i < o.num_prompts; ++i) {
      Request& r = next().req;
      for (int64_t t = 0; t < o.input_len; ++t)
        r.prompt_ids.push_back(int32_t(rng() % uint64_t(vocab)));
    }
  } else {
    std::istringstream f(read_file(o.prompts_file, o.prompts_file));
    std::string line;
    for (int64_t n = 1; std::getline(f, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      Input& x = next();
      try {
        const json j = json::parse(line, nullptr, false);
        DI_REQUIRE(!j.is_discarded() && j.is_object(), "not a JSON object");
        const bool has_text = j.contains("prompt"), has_ids = j.contains("prompt_ids");
        DI_REQUIRE(has_text != has_ids, "expected exactly one of \"prompt\" or \"prompt_ids\"");
        if (has_text) {
          DI_REQUIRE(j["prompt"].is_string(), "\"prompt\" must be a string");
          x.req.prompt_ids = tokenize(o, tok, j["prompt"].get<std::string>());
        } else {
          x.req.prompt_ids = server::token_list(j["prompt_ids"], "prompt_ids", vocab);
        }
        apply_request_fields(j, o, info, grammars, &x.req.params);
        // Images (docs/vision.md): data URLs or files, one per image placeholder of the prompt.
        if (const json* v = server::find_field(j, "images")) {
          DI_REQUIRE(v->is_array(), "\"images\" must be an array of data: URLs or file paths");
          for (size_t k = 0; k < v->size(); ++k) {
            const std::string what = str_cat("images[", k, "]");
            DI_REQUIRE((*v)[k].is_string(), what, " must be a string (a data: URL or a file path)");
            DI_REQUIRE(vision.max_tokens > 0, what,
                       ": this model has no vision tower (vision_n_layers = 0)");
            x.req.images.push_back(server::load_image((*v)[k].get<std::string>(), what, vision,
                                                      /*allow_files=*/true));
          }
        }
        // Benchmarks and tests: a previous run's output to draft from (speculative decoding).
        if (j.contains("draft_reference"))
          x.req.params.draft_reference =
              server::token_list(j["draft_reference"], "draft_reference", vocab);
      } catch (const Error& e) {
        x.error = str_cat(o.prompts_file, ":", n, ": ", e.what());
      }
    }
  }
  return in;
}

void progress(size_t done, size_t total, int64_t generated, double secs) {
  const int width = 30;
  const int filled = total ? int(double(width) * double(done) / double(total)) : width;
  std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu requests, %lld tokens, %.1f tok/s ", filled,
               "==============================", width - filled, "", done, total,
               (long long)generated, secs > 0 ? double(generated) / secs : 0.0);
}

void generate(GenerateOptions& o) {
  // The flags' sampling parameters are every request's defaults: wrong ones fail the run before
  // the model loads.
  if (const std::string e = check_sampling_params(o.params); !e.empty()) {
    std::string flag = "--" + e.substr(0, e.find(' '));
    std::replace(flag.begin(), flag.end(), '_', '-');
    throw Error(str_cat(flag, ": ", e));
  }
  LoadedEngine le = load_engine(o.eo);
  if (le.is_follower()) return le.run_follower();
  const Tokenizer* tok = le.tokenizer.get();
  const std::vector<int32_t> chat_markers =
      tok && o.chat ? chat_marker_tokens(*tok) : std::vector<int32_t>{};
  DI_REQUIRE(o.params.stop.empty() || tok,
             "--stop: stop strings need a tokenizer, and this model has none");
  const ModelConfig& mc = le.checkpoint->config();
  // Built on first use (the vocabulary's trie takes a moment).
  std::unique_ptr<server::GrammarCache> grammars;
  auto grammar_cache = [&]() -> server::GrammarCache* {
    if (!grammars && tok)
      grammars = std::make_unique<server::GrammarCache>(
          server::make_grammar_vocab(*tok, mc.vocab_size, mc.eos_token_id));
    return grammars.get();
  };
  if (le.world->rank() != 0) {
    // Another data-parallel replica: runs the requests the first one sends it.
    GrammarResolver resolve = [&](std::string_view source) {
      DI_REQUIRE(grammar_cache(), "output grammars need a tokenizer");
      return grammar_cache()->get(server::decode_output_shape(source));
    };
    serve_replica(*le.engine, *le.layout.dp, resolve);
    return le.finish();
  }
  // Requests go to the least loaded data-parallel replica (this one when there is one).
  Replicas engine(*le.engine, le.layout.cfg.dp > 1 ? le.layout.dp.get() : nullptr);
  const vision::VisionLimits vision{mc.vision_patch_size, mc.vision_downsample_ratio,
                                    mc.has_vision() ? mc.vision_max_n_token : 0,
                                    mc.vision_min_pixels, mc.vision_max_wh_ratio};
  std::vector<Input> inputs = read_inputs(o, tok, mc.vocab_size, vision, grammar_cache);
  const size_t n = inputs.size();
  std::vector<json> results(n);
  for (size_t i = 0; i < n; ++i) {
    inputs[i].req.id = i;
    if (inputs[i].error.empty()) inputs[i].error = engine.add_request(inputs[i].req);
    if (!inputs[i].error.empty()) {
      results[i] = {{"index", i}, {"error", inputs[i].error}};
      std::fprintf(stderr, "deepinfer: request %zu rejected: %s\n", i, inputs[i].error.c_str());
    }
  }
  const bool bar = ::isatty(2);
  const auto t0 = std::chrono::steady_clock::now();
  size_t done = results.size() - size_t(std::count(results.begin(), results.end(), nullptr));
  while (engine.has_unfinished()) {
    engine.step();
    for (RequestOutput& out : engine.take_finished()) {
      json j = {{"index", out.id}, {"prompt_ids", out.prompt_ids}, {"output_ids", out.output_ids}};
      if (inputs[out.id].req.params.logprobs > 0) j["logprobs"] = out.logprobs;  // [[id, lp]...]
      if (tok) {
        auto cut = [&](const std::string& text) {  // up to the stop string
          return out.stop_text.empty() ? text : text.substr(0, text.find(out.stop_text));
        };
        if (o.chat) {
          // The parser reads the markers even where the tokenizer marks them special.
          const ParsedCompletion pc =
              parse_completion(cut(tok->decode(out.output_ids, true, chat_markers)), o.thinking);
          j["reasoning_content"] = pc.reasoning;
          j["content"] = pc.content;
        }
        j["text"] = cut(tok->decode(out.output_ids, true));
      }
      j["finish_reason"] = finish_reason_name(out.finish);
      if (o.eo.speculative_method != "none") {
        j["drafted_tokens"] = out.drafted;
        j["accepted_tokens"] = out.accepted;
      }
      results[out.id] = std::move(j);
      ++done;
    }
    if (bar) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      progress(done, n, engine.total().stats.generated_tokens, s);
    }
  }
  if (bar) std::fprintf(stderr, "\n");
  engine.shutdown();
  std::FILE* out = o.output.empty() ? stdout : std::fopen(o.output.c_str(), "w");
  DI_REQUIRE(out, o.output, ": cannot create");
  for (const auto& j : results) std::fprintf(out, "%s\n", j.dump().c_str());
  if (out != stdout) std::fclose(out);

  const EngineStats st = engine.total().stats;
  const auto errors = size_t(std::count_if(results.begin(), results.end(),
                                           [](const json& r) { return r.contains("error"); }));
  std::fprintf(stderr,
               "deepinfer: %zu requests (%zu rejected); prompt tokens %lld, generated %lld; "
               "prefill %.1f tok/s, decode %.1f tok/s; %lld steps; KV pool peak %d/%d blocks "
               "(%.0f%%), %lld preemptions; prefix cache %lld hits of %lld queries, %lld "
               "tokens; speculative %lld drafted, %lld accepted, mean acceptance length %.2f\n",
               n, errors, (long long)st.prompt_tokens, (long long)st.generated_tokens,
               st.prefill_seconds > 0 ? double(st.prompt_tokens) / st.prefill_seconds : 0.0,
               st.decode_seconds > 0 ? double(st.generated_tokens) / st.decode_seconds : 0.0,
               (long long)st.steps, st.peak_blocks_used, st.kv_blocks_total,
               100.0 * st.peak_blocks_used / std::max(1, st.kv_blocks_total),
               (long long)st.preemptions, (long long)st.prefix_hits, (long long)st.prefix_queries,
               (long long)st.prefix_hit_tokens, (long long)st.spec_drafted,
               (long long)st.spec_accepted,
               st.spec_steps ? 1.0 + double(st.spec_accepted) / double(st.spec_steps) : 0.0);
  le.finish();
  // Every line is written; the exit status still says that some requests failed.
  DI_REQUIRE(errors == 0, errors, " of ", n,
             " requests failed (their output lines carry \"error\")");
}

}  // namespace

void add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "Offline generation: prompts in, JSON lines out");
  add_engine_options(cmd, &o->eo);
  cmd->add_option("--prompt", o->prompt, "A text prompt (needs a tokenizer)");
  cmd->add_option("--prompt-ids", o->prompt_ids, "A prompt as token ids: 1,2,3");
  cmd->add_option("--prompts", o->prompts_file,
                  "JSONL file, one request a line: {\"prompt\": ...} or {\"prompt_ids\": [...]} "
                  "with optional max_tokens, temperature, top_p, top_k, min_p, seed, stop, ..., "
                  "draft_reference (token ids to draft from while the output follows them), "
                  "images (data: URLs or files, one per image token of the prompt)");
  cmd->add_option("--num-prompts", o->num_prompts, "Synthetic random prompts (seeded by --seed)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  cmd->add_option("--input-len", o->input_len, "Length of synthetic prompts")
      ->capture_default_str();
  cmd->add_option("--seed", o->eo.engine.seed,
                  "Seed of synthetic prompts and of requests without one")
      ->capture_default_str();
  cmd->add_option("--output", o->output, "Write JSON lines here (default: stdout)");
  cmd->add_flag("--chat", o->chat, "Apply the DeepSeek-V4.1 chat encoding to text prompts");
  cmd->add_option("--system", o->system, "System message for --chat");
  cmd->add_flag("--thinking", o->thinking, "Thinking mode for --chat");
  cmd->add_option("--reasoning-effort", o->reasoning_effort, "1-100, for --chat thinking");
  SamplingParams& p = o->params;
  cmd->add_option("--max-tokens", p.max_tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", p.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", p.top_p)->capture_default_str();
  cmd->add_option("--top-k", p.top_k, "0 = off")->capture_default_str();
  cmd->add_option("--min-p", p.min_p)->capture_default_str();
  cmd->add_option("--repetition-penalty", p.repetition_penalty)->capture_default_str();
  cmd->add_option("--presence-penalty", p.presence_penalty)->capture_default_str();
  cmd->add_option("--frequency-penalty", p.frequency_penalty)->capture_default_str();
  cmd->add_option("--sampling-seed", p.seed, "Seed every request's sampling");
  cmd->add_option("--stop", p.stop, "Stop string (repeatable; needs a tokenizer)");
  cmd->add_option("--stop-token-ids", p.stop_token_ids, "Stop token ids")->delimiter(',');
  cmd->add_flag("--ignore-eos", p.ignore_eos, "Keep going past the end-of-sequence token");
  cmd->add_option("--logprobs", p.logprobs, "Top-K logprobs per generated token")
      ->capture_default_str();
  cmd->callback([o] { generate(*o); });
}

}  // namespace deepinfer::app
