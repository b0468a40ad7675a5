#include "server/openai_response.h"

#include "server/choice_decoder.h"
#include "server/json_fields.h"

namespace deepinfer::server {

namespace {

// A token as text for logprobs: its bytes (which may be part of a character; the dump repairs
// them), or "token_id:N" without a tokenizer.
std::string token_text(const Tokenizer* tok, int32_t id) {
  if (!tok) return str_cat("token_id:", id);
  return std::string(tok->token_bytes(id));
}

Json token_bytes(const Tokenizer* tok, int32_t id) {
  Json bytes = Json::array();
  if (tok)
    for (const unsigned char c : tok->token_bytes(id)) bytes.push_back(int(c));
  return bytes;
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}.
Json chat_logprobs(const Tokenizer* tok, const std::vector<TokenLogprob>& lps) {
  Json content = Json::array();
  for (const TokenLogprob& lp : lps) {
    Json top = Json::array();
    for (const auto& [id, v] : lp.top)
      top.push_back(
          {{"token", token_text(tok, id)}, {"logprob", v}, {"bytes", token_bytes(tok, id)}});
    content.push_back({{"token", token_text(tok, lp.token)},
                       {"logprob", lp.logprob},
                       {"bytes", token_bytes(tok, lp.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

// Completions: parallel lists of tokens, their logprobs, the alternatives and text offsets.
Json completion_logprobs(const Tokenizer* tok, const std::vector<TokenLogprob>& lps,
                         int64_t* text_offset) {
  Json tokens = Json::array(), values = Json::array(), tops = Json::array(),
       offsets = Json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string t = token_text(tok, lp.token);
    tokens.push_back(t);
    values.push_back(lp.logprob);
    Json top = Json::object();
    for (const auto& [id, v] : lp.top) top[token_text(tok, id)] = v;
    tops.push_back(std::move(top));
    offsets.push_back(*text_offset);
    *text_offset += tok ? int64_t(t.size()) : 0;
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(values)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

Json tool_calls_json(const std::vector<ChatToolCall>& calls, int64_t first_index, bool indexed) {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json c;
    if (indexed) c["index"] = first_index + int64_t(i);
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

const char* api_finish_reason(FinishReason why, bool has_tool_calls) {
  switch (why) {
    case FinishReason::Stop:
      return has_tool_calls ? "tool_calls" : "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Abort:
      return "abort";
    case FinishReason::Error:
      return "error";
    case FinishReason::None:
      break;
  }
  return "stop";
}

struct ResponseBuilder::Choice {
  Choice(const ApiRequest& r, const Tokenizer* tok)
      : decoder(tok, r.params.stop, r.chat, r.logprobs, r.top_logprobs) {}
  ChoiceDecoder decoder;
  ChoiceDelta all;  // everything so far (non-streaming)
  bool ended = false, started = false;
  FinishReason finish = FinishReason::None;
  int64_t calls_sent = 0;
  int64_t text_offset = 0;  // completions logprobs
};

ResponseBuilder::ResponseBuilder(const ApiRequest& req, const ModelInfo& info, std::string id,
                                 int64_t created)
    : req_(req), info_(info), id_(std::move(id)), created_(created) {
  const size_t n = req_.prompts.size() * size_t(req_.n);
  for (size_t i = 0; i < n; ++i)
    choices_.push_back(std::make_unique<Choice>(req_, info_.tokenizer));
}

ResponseBuilder::~ResponseBuilder() = default;

std::string ResponseBuilder::usage() const {
  int64_t p = 0, g = 0;
  for (const auto& prompt : req_.prompts) p += int64_t(prompt.size());
  for (const auto& c : choices_) g += c->decoder.num_tokens();
  return dump_json({{"prompt_tokens", p}, {"completion_tokens", g}, {"total_tokens", p + g}});
}

std::string ResponseBuilder::envelope(const std::string& choices_json, const char* object) const {
  // Built as text so that choices can be spliced in without re-parsing.
  return str_cat("{\"id\":", dump_json(id_), ",\"object\":\"", object, "\",\"created\":", created_,
                 ",\"model\":", dump_json(req_.model), ",\"choices\":", choices_json);
}

std::vector<std::string> ResponseBuilder::stream_start() {
  std::vector<std::string> out;
  if (req_.endpoint != Endpoint::kChat) return out;
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    choices.push_back({{"index", i},
                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                       {"logprobs", nullptr},
                       {"finish_reason", nullptr}});
    choices_[i]->started = true;
  }
  std::string s = envelope(dump_json(choices), chunk_object());
  if (req_.return_token_ids) s += ",\"prompt_token_ids\":" + dump_json(Json(req_.prompts[0]));
  if (req_.include_usage) s += ",\"usage\":null";
  out.push_back(s + "}");
  return out;
}

std::string ResponseBuilder::chunk(int32_t index, const ChoiceDelta& d, const char* finish,
                                   bool first) {
  Choice& c = *choices_[size_t(index)];
  const Tokenizer* tok = info_.tokenizer;
  Json choice;
  choice["index"] = index;
  const bool chat = req_.endpoint == Endpoint::kChat;
  if (chat) {
    Json delta = Json::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) {
      delta["tool_calls"] = tool_calls_json(d.tool_calls, c.calls_sent, true);
      c.calls_sent += int64_t(d.tool_calls.size());
    }
    choice["delta"] = std::move(delta);
    choice["logprobs"] =
        req_.logprobs && !d.logprobs.empty() ? chat_logprobs(tok, d.logprobs) : Json();
  } else {
    choice["text"] = d.content;
    choice["logprobs"] = req_.logprobs && !d.logprobs.empty()
                             ? completion_logprobs(tok, d.logprobs, &c.text_offset)
                             : Json();
  }
  choice["finish_reason"] = finish ? Json(finish) : Json();
  if (req_.return_token_ids) {
    if (first && !chat) choice["prompt_token_ids"] = req_.prompts[size_t(index / req_.n)];
    choice["token_ids"] = d.token_ids;
  }
  std::string s = envelope(dump_json(Json::array({std::move(choice)})), chunk_object());
  if (req_.include_usage) s += ",\"usage\":null";
  return s + "}";
}

std::vector<std::string> ResponseBuilder::on_update(const CallUpdate& u) {
  std::vector<std::string> out;
  if (u.choice < 0 || size_t(u.choice) >= choices_.size()) return out;
  Choice& c = *choices_[size_t(u.choice)];
  if (c.ended) return out;
  ChoiceDelta d;
  const char* finish = nullptr;
  if (u.end) {
    d = c.decoder.finish(u.stop_text);
    c.ended = true;
    c.finish = u.finish;
    ++ended_;
    errors_ += u.finish == FinishReason::Error;
    finish = api_finish_reason(u.finish, c.decoder.has_tool_calls());
  } else {
    d = c.decoder.push(u.token);
  }
  const bool first = !c.started;
  if (req_.stream && (finish || d.has_output() || !d.token_ids.empty())) {
    out.push_back(chunk(u.choice, d, finish, first));
    c.started = true;
  }
  if (!req_.stream) c.all.append(std::move(d));
  return out;
}

std::vector<std::string> ResponseBuilder::stream_end() {
  std::vector<std::string> out;
  if (!req_.include_usage) return out;
  out.push_back(envelope("[]", chunk_object()) + ",\"usage\":" + usage() + "}");
  return out;
}

std::string ResponseBuilder::full_body() {
  const bool chat = req_.endpoint == Endpoint::kChat;
  const Tokenizer* tok = info_.tokenizer;
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = *choices_[i];
    Json choice;
    choice["index"] = i;
    if (chat) {
      Json msg = {{"role", "assistant"}};
      const bool calls = !c.all.tool_calls.empty();
      msg["content"] = calls && c.all.content.empty() ? Json() : Json(c.all.content);
      if (req_.chat.thinking) msg["reasoning_content"] = c.all.reasoning;
      if (calls) msg["tool_calls"] = tool_calls_json(c.all.tool_calls, 0, false);
      choice["message"] = std::move(msg);
      choice["logprobs"] = req_.logprobs ? chat_logprobs(tok, c.all.logprobs) : Json();
    } else {
      choice["text"] = c.all.content;
      int64_t offset = 0;
      choice["logprobs"] =
          req_.logprobs ? completion_logprobs(tok, c.all.logprobs, &offset) : Json();
    }
    choice["finish_reason"] = api_finish_reason(c.finish, c.decoder.has_tool_calls());
    if (req_.return_token_ids) {
      if (!chat) choice["prompt_token_ids"] = req_.prompts[i / size_t(req_.n)];
      choice["token_ids"] = c.all.token_ids;
    }
    choices.push_back(std::move(choice));
  }
  std::string s = envelope(dump_json(choices), chat ? "chat.completion" : "text_completion");
  s += ",\"usage\":" + usage();
  if (chat && req_.return_token_ids)
    s += ",\"prompt_token_ids\":" + dump_json(Json(req_.prompts[0]));
  return s + "}";
}

}  // namespace deepinfer::server
