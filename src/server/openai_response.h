// Response bodies of one generation call, in OpenAI's shapes: the whole body of a non-streaming
// call, or the chunks of a streaming one (JSON payloads; the HTTP layer frames them as
// server-sent events and ends the stream with [DONE]).
//
// Choices are numbered prompt-major: choice i answers prompt i / n. Each has a ChoiceDecoder; the
// builder is fed the engine's updates in arrival order and never blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/api_request.h"
#include "server/choice_decoder.h"
#include "server/engine_loop.h"

namespace deepinfer::server {

class ResponseBuilder {
 public:
  ResponseBuilder(const ApiRequest& req, const ModelInfo& info, std::string id, int64_t created);
  ~ResponseBuilder();
  ResponseBuilder(const ResponseBuilder&) = delete;
  ResponseBuilder& operator=(const ResponseBuilder&) = delete;

  // Chunks that open a stream (chat: the assistant role of every choice).
  std::vector<std::string> stream_start();
  // Takes one update; returns the chunks it produces when streaming (none otherwise).
  std::vector<std::string> on_update(const CallUpdate& u);
  bool all_ended() const { return ended_ == int64_t(choices_.size()); }
  // Some choice ended because the engine failed (FinishReason::Error).
  bool any_error() const { return errors_ > 0; }
  // After every choice ended: the usage chunk when stream_options.include_usage asked for it.
  std::vector<std::string> stream_end();
  // After every choice ended: the non-streaming body.
  std::string full_body();

 private:
  struct Choice;
  std::string chunk(int32_t index, const ChoiceDelta& d, const char* finish, bool first);
  std::string envelope(const std::string& choices_json, const char* object) const;
  const char* chunk_object() const {
    return req_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion";
  }
  std::string usage() const;  // the usage object's JSON

  ApiRequest req_;
  const ModelInfo& info_;
  std::string id_;
  int64_t created_;
  std::vector<std::unique_ptr<Choice>> choices_;
  int64_t ended_ = 0, errors_ = 0;
};

// The finish_reason the API reports for an engine ending.
const char* api_finish_reason(FinishReason why, bool has_tool_calls);

}  // namespace deepinfer::server
