// Response bodies of one generation call, in OpenAI's shapes: the whole body of a non-streaming
// call, or the chunks of a streaming one (JSON payloads; the HTTP layer frames them as
// server-sent events and ends the stream with [DONE]).
//
// Choices are numbered prompt-major: choice i answers prompt i / n. Each has a ChoiceDecoder; the
// builder is fed the engine's updates in arrival order and never blocks.
//
// ChoiceDecoder: one choice's generated tokens -> what the API reports, as they arrive. Text comes
// from an IncrementalDetokenizer (never half a character). Text that could still be the start of a
// stop string is held back, so nothing at or past a stop string is ever sent; when the engine
// reports the stop string that ended the request, the text is cut just before it, as the offline
// runner cuts it. In chat mode the text then goes through a CompletionParser that splits reasoning,
// content and DSML tool calls. A tool-call block the parser cannot read is passed on as content
// from where the block began.
//
// Token ids and logprobs ride along with the next delta that carries text, so concatenating every
// delta gives each token exactly once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/api_request.h"
#include "server/engine_loop.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::server {

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;  // -9999 when the token is not among the engine's top alternatives
  TopLogprobs top;    // the alternatives to report, best first
};

struct ChoiceDelta {
  std::string content;  // completions: the text
  std::string reasoning;
  std::vector<ChatToolCall> tool_calls;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;

  bool has_output() const { return !content.empty() || !reasoning.empty() || !tool_calls.empty(); }
  void append(ChoiceDelta&& d);
};

// 16 random hex digits, for the ids of responses and tool calls.
std::string random_hex64();

class ChoiceDecoder {
 public:
  // `tokenizer` may be null (ids only). `top_logprobs` alternatives are kept per token when
  // `logprobs` is set.
  ChoiceDecoder(const Tokenizer* tokenizer, std::vector<std::string> stops, ChatMode chat,
                bool logprobs, int32_t top_logprobs);

  // A generated token. The delta may have no output yet (text held back).
  ChoiceDelta push(const TokenEvent& ev);
  // The end: releases held-back text, cut before `stop_text` when it is set.
  ChoiceDelta finish(const std::string& stop_text);

  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_tool_calls() const { return num_tool_calls_; }

 private:
  // Adds text_[sent_, end) to pending_: as content, or through the chat parser in chat mode.
  void release(size_t end, bool final);

  const Tokenizer* tokenizer_;
  std::vector<std::string> stops_;
  ChatMode chat_;
  bool logprobs_;
  int32_t top_logprobs_;
  std::unique_ptr<IncrementalDetokenizer> detok_;
  std::unique_ptr<CompletionParser> parser_;
  bool parser_failed_ = false;
  std::string text_;    // all stable text so far
  size_t sent_ = 0;     // text_[0, sent_) has been released
  std::string routed_;  // what went into the chat parser (to recover from a malformed block)
  // The delta being built: ids and logprobs wait in it until text goes out with them.
  ChoiceDelta pending_;
  int64_t num_tokens_ = 0;
  int64_t num_tool_calls_ = 0;
};

// --- responses ---

class ResponseBuilder {
 public:
  ResponseBuilder(const ApiRequest& req, const ModelInfo& info, std::string id, int64_t created);

  // The chunk that opens a stream (chat: the assistant role of every choice); empty for none.
  std::string stream_start();
  // Takes one update; returns the chunk it produces when streaming (empty for none).
  std::string on_update(const CallUpdate& u);
  bool all_ended() const { return ended_ == int64_t(choices_.size()); }
  // Some choice ended because the engine failed (FinishReason::Error).
  bool any_error() const { return errors_ > 0; }
  // After every choice ended: the usage chunk when stream_options.include_usage asked for it,
  // else empty.
  std::string stream_end();
  // After every choice ended: the non-streaming body.
  std::string full_body();

 private:
  struct Choice {
    ChoiceDecoder decoder;
    ChoiceDelta all;  // everything so far (non-streaming)
    bool started = false;
    const char* finish = nullptr;  // the API's finish_reason once it ended
    int64_t text_offset = 0;       // completions logprobs
  };
  // Choice `index` as JSON text, with `d` (a stream's delta, or everything of a whole body) and
  // `finish`; `first`: its first chunk, or a whole body.
  std::string choice_json(int32_t index, const ChoiceDelta& d, const char* finish, bool first);
  // The response object: its id, object, created, model and choices, then `rest` (more fields,
  // each as ",\"name\":value").
  std::string envelope(const std::string& choices_json, const char* object,
                       const std::string& rest) const;
  const char* chunk_object() const {
    return req_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion";
  }
  std::string usage() const;       // ",\"usage\":{...}"
  std::string prompt_ids() const;  // ",\"prompt_token_ids\":[...]" when asked for, else empty
  // The usage field of a stream's chunks when the stream ends with the usage, else empty.
  std::string null_usage() const { return req_.include_usage ? ",\"usage\":null" : ""; }

  ApiRequest req_;
  const ModelInfo& info_;
  std::string id_;
  int64_t created_;
  std::vector<Choice> choices_;
  int64_t ended_ = 0, errors_ = 0;
};

// The finish_reason the API reports for an engine ending.
const char* api_finish_reason(FinishReason why, bool has_tool_calls);

}  // namespace deepinfer::server
