// libFuzzer target: the server's request parser on arbitrary bodies, then the response path on
// token ids taken from the same bytes. The first byte picks the endpoint (completions, chat,
// tokenize, detokenize) and whether the model has a tokenizer (a small byte-level BPE with the
// chat markers as added tokens); the rest is the body.
//
// Bad input must end in ApiError with a 4xx status. Anything else is a finding: another exception,
// a crash or sanitizer report, or an accepted request that breaks what the engine relies on
// (non-empty prompts of in-vocabulary ids that fit the context with max_tokens, 1 <= n <= 128).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/request.h"
#include "server/api_request.h"
#include "server/openai_response.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using deepinfer::server::ApiError;
using deepinfer::server::ApiRequest;
using deepinfer::server::Endpoint;
using deepinfer::server::ModelInfo;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "finding: %s\n", what.c_str());
  std::abort();
}

// The character a byte-level BPE vocabulary uses for byte `b` (printable bytes stand for
// themselves, the others are shifted past U+0100).
std::string byte_char(int b) {
  int cp = b;
  if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
    cp = 256;
    for (int x = 0; x < b; ++x)
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++cp;
  }
  std::string s;
  deepinfer::utf8::append(s, char32_t(cp));
  return s;
}

std::unique_ptr<deepinfer::Tokenizer> small_tokenizer() {
  using json = nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  vocab["Ġt"] = 256;
  vocab["Ġth"] = 257;
  json added = json::array();
  int id = 258;
  for (const char* t : {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>",
                        "<｜Assistant｜>", "<｜System｜>", "<think>", "</think>"}) {
    const bool special = id < 260;  // BOS and EOS
    added.push_back({{"id", id}, {"content", t}, {"special", special}, {"normalized", false}});
    ++id;
  }
  const json tok = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"Ġ t", "Ġt h"})}}}};
  return deepinfer::Tokenizer::from_json(
      tok.dump(),
      R"({"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"})",
      "fuzz tokenizer");
}

void check_accepted(const ApiRequest& r, const ModelInfo& info) {
  if (r.prompts.empty()) finding("no prompt");
  if (r.n < 1 || r.n > 128) finding("n out of range");
  for (const auto& p : r.prompts) {
    if (p.empty()) finding("empty prompt");
    for (const int32_t id : p)
      if (id < 0 || id >= info.vocab_size) finding("token id outside the vocabulary");
    if (r.params.max_tokens < 1 || int64_t(p.size()) + r.params.max_tokens > info.max_model_len)
      finding("prompt + max_tokens exceeds the context");
  }
  if (r.top_logprobs < 0 || r.top_logprobs > 20) finding("top_logprobs out of range");
}

// Feeds token ids made from the body to a response, streaming and not, and checks the output is
// JSON.
void respond(const ApiRequest& r, const ModelInfo& info, const uint8_t* data, size_t size) {
  for (const bool stream : {false, true}) {
    ApiRequest req = r;
    req.stream = stream;
    deepinfer::server::ResponseBuilder b(req, info, "fuzz", 0);
    std::vector<std::string> out = {b.stream_start()};
    const int32_t choices = int32_t(r.prompts.size()) * r.n;
    for (size_t i = 0; i < size && i < 256; ++i) {
      deepinfer::server::CallUpdate u;
      u.choice = int32_t(i % size_t(choices));
      u.token.token = int32_t(data[i]) + (i % 3 == 0 ? 256 : 0);
      u.token.logprobs = {{u.token.token, -0.5f}, {7, -1.0f}};
      out.push_back(b.on_update(u));
    }
    for (int32_t c = 0; c < choices; ++c) {
      deepinfer::server::CallUpdate u;
      u.choice = c;
      u.end = true;
      u.finish = deepinfer::FinishReason::Stop;
      u.stop_text = r.params.stop.empty() ? "" : r.params.stop[0];
      out.push_back(b.on_update(u));
    }
    if (!b.all_ended()) finding("choices not ended");
    out.push_back(b.stream_end());
    if (!stream) out.push_back(b.full_body());
    for (const std::string& s : out)
      if (!s.empty() && !nlohmann::json::accept(s))
        finding("response is not JSON: " + s.substr(0, 200));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::unique_ptr<deepinfer::Tokenizer> tok = small_tokenizer();
  if (size == 0) return 0;
  ModelInfo info;
  info.names = {"fuzz"};
  info.tokenizer = (data[0] & 1) ? tok.get() : nullptr;
  info.vocab_size = 300;
  info.max_model_len = 128;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch ((data[0] >> 1) % 4) {
      case 0:
      case 1: {
        const Endpoint ep = (data[0] >> 1) % 4 ? Endpoint::kChat : Endpoint::kCompletions;
        const ApiRequest r = deepinfer::server::parse_api_request(ep, body, info);
        check_accepted(r, info);
        respond(r, info, data + 1, size - 1);
        break;
      }
      case 2:
        for (const int32_t id : deepinfer::server::parse_tokenize_request(body, info))
          if (id < 0 || id >= info.vocab_size)
            finding("tokenize gave an id outside the vocabulary");
        break;
      case 3:
        deepinfer::server::parse_detokenize_request(body, info);
        break;
    }
  } catch (const ApiError& e) {
    if (e.status < 400 || e.status > 499)
      finding("refusal with status " + std::to_string(e.status));
    if (!nlohmann::json::accept(deepinfer::server::error_body(e)))
      finding("error body is not JSON");
  }
  return 0;
}
