// The OpenAI-style API at the edge of the server: request bodies (JSON text) in, validated plain
// structs out. JSON stays inside src/server; what leaves this header is engine vocabulary
// (token ids, SamplingParams) plus the few response options the API has.
//
// Every refusal is an ApiError: the HTTP status, OpenAI's error type, the offending field
// ("param") and a short code, with a message that names the field and what was expected.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "engine/request.h"
#include "tokenizer/tokenizer.h"
#include "vision/image.h"

namespace deepinfer::server {

class GrammarCache;

class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {})
      : Error(message), status(status), param(std::move(param)), code(std::move(code)) {}

  int status;
  std::string param;  // the request field at fault; empty for none
  std::string code;   // e.g. "invalid_type", "model_not_found"; empty for none
  // OpenAI's error type, from the status.
  std::string type = status == 401   ? "authentication_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
};

// {"error": {"message", "type", "param", "code"}} with nulls for the empty fields.
std::string error_body(const ApiError& e);
// Logs an unexpected exception while serving a request; returns the 500 that answers it.
ApiError internal_error(const std::exception& e);

// What a request is checked against.
struct ModelInfo {
  std::vector<std::string> names;        // accepted values of "model"; names[0] is reported
  const Tokenizer* tokenizer = nullptr;  // null: token-id prompts only, no text out
  int64_t vocab_size = 0;
  int64_t max_model_len = 0;
  int64_t created = 0;  // unix seconds, for /v1/models
  // Compiles response_format / tool_choice output shapes for this model; null without a
  // tokenizer (structured outputs are refused then).
  GrammarCache* grammars = nullptr;
  // Images in chat messages (docs/vision.md): the tower's limits (max_tokens 0: no tower, image
  // parts are refused) and the image token each image part becomes in the prompt.
  vision::VisionLimits vision{14, 3, 0, 0, 0.0};
  int32_t image_token_id = -1;
};

enum class Endpoint { kCompletions, kChat };

// Chat output mode: how generated text splits into reasoning, content and tool calls.
struct ChatMode {
  bool enabled = false;  // false: completions (text only)
  bool thinking = false;
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // as reported back (the served name)
  // One prompt per entry; completions may carry several, chat exactly one.
  std::vector<std::vector<int32_t>> prompts;
  SamplingParams params;  // max_tokens filled in; seed as given (choices derive theirs)
  int32_t n = 1;          // choices per prompt
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool return_token_ids = false;  // also implied when the model has no tokenizer
  bool logprobs = false;          // report the sampled tokens' logprobs
  int32_t top_logprobs = 0;       // alternatives per token
  ChatMode chat;
  // The chat prompt's images, in order of their image tokens, and the tokens their spans add to
  // the prompt beyond those (the engine expands each image token into its span).
  std::vector<RequestImage> images;
  int64_t image_tokens = 0;
};

// Parses and validates a request body for `endpoint`. Throws ApiError.
ApiRequest parse_api_request(Endpoint endpoint, std::string_view body, const ModelInfo& info);

// POST /tokenize: {"prompt": text} or {"messages": [...], ...chat options}, optional
// "add_special_tokens" (a BOS before a text prompt). Returns the token ids. Throws ApiError.
std::vector<int32_t> parse_tokenize_request(std::string_view body, const ModelInfo& info);
// POST /detokenize: {"tokens": [ids]}. Returns the ids. Throws ApiError.
std::vector<int32_t> parse_detokenize_request(std::string_view body, const ModelInfo& info);

// The seed of choice `i` of a request seeded with `seed`: choice 0 keeps it, so a one-choice
// request samples exactly as the offline runner does with the same seed.
uint64_t choice_seed(uint64_t seed, int32_t i);

// Nesting depth of JSON text (brackets outside strings), computed without parsing, so that
// pathological nesting is refused before any recursive code sees it.
int json_nesting_depth(std::string_view text);

}  // namespace deepinfer::server
