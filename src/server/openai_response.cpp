#include "server/openai_response.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>

#include "server/json_fields.h"

namespace deepinfer::server {

namespace {

// A token as text for logprobs: its bytes (which may be part of a character; the dump repairs
// them), or "token_id:N" without a tokenizer.
std::string token_text(const Tokenizer* tok, int32_t id) {
  return tok ? std::string(tok->token_bytes(id)) : str_cat("token_id:", id);
}

Json token_bytes(const Tokenizer* tok, int32_t id) {
  const std::string_view bytes = tok ? tok->token_bytes(id) : std::string_view();
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}.
Json chat_logprobs(const Tokenizer* tok, const std::vector<TokenLogprob>& lps) {
  auto entry = [&](int32_t id, float v) {
    return Json{{"token", token_text(tok, id)}, {"logprob", v}, {"bytes", token_bytes(tok, id)}};
  };
  Json content = Json::array();
  for (const TokenLogprob& lp : lps) {
    Json& e = content.emplace_back(entry(lp.token, lp.logprob));
    e["top_logprobs"] = Json::array();
    for (const auto& [id, v] : lp.top) e["top_logprobs"].push_back(entry(id, v));
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
    Json& top = tops.emplace_back(Json::object());
    for (const auto& [id, v] : lp.top) top[token_text(tok, id)] = v;
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
    Json& c = out.emplace_back();
    if (indexed) c["index"] = first_index + int64_t(i);
    c["id"] = calls[i].id;
    c["type"] = "function";
    c["function"] = {{"name", calls[i].name}, {"arguments", calls[i].arguments}};
  }
  return out;
}

}  // namespace

std::string random_hex64() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

void ChoiceDelta::append(ChoiceDelta&& d) {
  content += d.content;
  reasoning += d.reasoning;
  for (auto& c : d.tool_calls) tool_calls.push_back(std::move(c));
  token_ids.insert(token_ids.end(), d.token_ids.begin(), d.token_ids.end());
  for (auto& l : d.logprobs) logprobs.push_back(std::move(l));
}

ChoiceDecoder::ChoiceDecoder(const Tokenizer* tokenizer, std::vector<std::string> stops,
                             ChatMode chat, bool logprobs, int32_t top_logprobs)
    : tokenizer_(tokenizer),
      stops_(std::move(stops)),
      chat_(chat),
      logprobs_(logprobs),
      top_logprobs_(top_logprobs) {
  // Special tokens produce no text, as in the offline runner and the engine's stop check; in
  // chat mode the markers the parser reads stay, even when the tokenizer marks them special
  // (the parser takes them out of the visible text).
  if (tokenizer_)
    detok_ = std::make_unique<IncrementalDetokenizer>(
        *tokenizer_, true,
        chat_.enabled ? chat_marker_tokens(*tokenizer_) : std::vector<int32_t>{});
  if (chat_.enabled) parser_ = std::make_unique<CompletionParser>(chat_.thinking);
}

ChoiceDelta ChoiceDecoder::push(const TokenEvent& ev) {
  ++num_tokens_;
  pending_.token_ids.push_back(ev.token);
  if (logprobs_) {
    const auto sampled = std::ranges::find(ev.logprobs, ev.token, &TopLogprobs::value_type::first);
    const auto top_end =
        ev.logprobs.begin() + std::min<ptrdiff_t>(top_logprobs_, ev.logprobs.size());
    pending_.logprobs.push_back({ev.token,
                                 sampled == ev.logprobs.end() ? -9999.0f : sampled->second,
                                 TopLogprobs(ev.logprobs.begin(), top_end)});
  }
  if (!tokenizer_) return std::exchange(pending_, {});
  text_ += detok_->push(ev.token);
  // Hold back from the first stop string found, or from a tail that may grow into one.
  size_t end = text_.size();
  for (const std::string& stop : stops_) {
    const size_t at = text_.find(stop, sent_);
    end = std::min(
        end, at != std::string::npos ? at : text_.size() - partial_marker_suffix(text_, {stop}));
  }
  if (end > sent_) release(end, false);
  return pending_.has_output() ? std::exchange(pending_, {}) : ChoiceDelta();
}

ChoiceDelta ChoiceDecoder::finish(const std::string& stop_text) {
  if (tokenizer_) {
    text_ += detok_->flush();
    size_t end = text_.size();
    if (!stop_text.empty()) end = std::min(end, text_.find(stop_text));
    release(std::max(end, sent_), true);
  }
  return std::exchange(pending_, {});
}

void ChoiceDecoder::release(size_t end, bool final) {
  const std::string text = text_.substr(sent_, end - sent_);
  sent_ = end;
  if (!parser_ || parser_failed_) {
    pending_.content += text;
    return;
  }
  routed_ += text;
  // What goes out is what the parser's result grew by; so when a malformed tool-call block makes
  // it throw, what it had accepted before failing still goes out as it would have.
  const ParsedCompletion& r = parser_->result();
  const size_t reasoning_out = r.reasoning.size(), content_out = r.content.size();
  const size_t calls_out = r.tool_calls.size();
  try {
    parser_->feed(text);
    if (final) parser_->finish();
  } catch (const Error&) {
    parser_failed_ = true;
  }
  pending_.reasoning.append(r.reasoning, reasoning_out);
  pending_.content.append(r.content, content_out);
  for (size_t i = calls_out; i < r.tool_calls.size(); ++i) {
    ChatToolCall& c = pending_.tool_calls.emplace_back(r.tool_calls[i]);
    c.id = "call_" + random_hex64();
    ++num_tool_calls_;
  }
  if (parser_failed_) {
    // The raw text from the block's opener on becomes content (after "</think>" when thinking).
    const size_t from =
        chat_.thinking ? std::min(routed_.find(chat_format::kThinkEnd), routed_.size()) : 0;
    const size_t at = routed_.find(chat_format::kCallsStart, from);
    if (at != std::string::npos) pending_.content += routed_.substr(at);
  }
}

// --- responses ---

const char* api_finish_reason(FinishReason why, bool has_tool_calls) {
  if (why == FinishReason::Stop && has_tool_calls) return "tool_calls";
  return why == FinishReason::None ? "stop" : finish_reason_name(why);  // the engine's names
}

ResponseBuilder::ResponseBuilder(const ApiRequest& req, const ModelInfo& info, std::string id,
                                 int64_t created)
    : req_(req), info_(info), id_(std::move(id)), created_(created) {
  for (size_t i = 0; i < req_.prompts.size() * size_t(req_.n); ++i)
    choices_.push_back(Choice{ChoiceDecoder(info_.tokenizer, req_.params.stop, req_.chat,
                                            req_.logprobs, req_.top_logprobs),
                              {}});
}

std::string ResponseBuilder::usage() const {
  int64_t p = 0, g = 0;
  for (const auto& prompt : req_.prompts) p += int64_t(prompt.size()) + req_.image_tokens;
  for (const Choice& c : choices_) g += c.decoder.num_tokens();
  return ",\"usage\":" +
         dump_json({{"prompt_tokens", p}, {"completion_tokens", g}, {"total_tokens", p + g}});
}

std::string ResponseBuilder::prompt_ids() const {
  return req_.return_token_ids ? ",\"prompt_token_ids\":" + dump_json(Json(req_.prompts[0])) : "";
}

std::string ResponseBuilder::envelope(const std::string& choices_json, const char* object,
                                      const std::string& rest) const {
  // Built as text so that choices can be spliced in without re-parsing.
  return str_cat("{\"id\":", dump_json(id_), ",\"object\":\"", object, "\",\"created\":", created_,
                 ",\"model\":", dump_json(req_.model), ",\"choices\":", choices_json, rest, "}");
}

std::string ResponseBuilder::stream_start() {
  if (req_.endpoint != Endpoint::kChat) return {};
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    choices.push_back({{"index", i},
                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                       {"logprobs", nullptr},
                       {"finish_reason", nullptr}});
    choices_[i].started = true;
  }
  return envelope(dump_json(choices), chunk_object(), prompt_ids() + null_usage());
}

std::string ResponseBuilder::choice_json(int32_t index, const ChoiceDelta& d, const char* finish,
                                         bool first) {
  Choice& c = choices_[size_t(index)];
  const Tokenizer* tok = info_.tokenizer;
  const bool chat = req_.endpoint == Endpoint::kChat;
  // A stream leaves out empty logprobs; a whole body has them whenever they were asked for.
  const bool logprobs = req_.logprobs && (!req_.stream || !d.logprobs.empty());
  Json choice;
  choice["index"] = index;
  if (chat && req_.stream) {
    Json delta = Json::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty())  // indexed from the calls that went out before these
      delta["tool_calls"] = tool_calls_json(
          d.tool_calls, c.decoder.num_tool_calls() - int64_t(d.tool_calls.size()), true);
    choice["delta"] = std::move(delta);
  } else if (chat) {
    Json msg = {{"role", "assistant"}};
    const bool calls = !d.tool_calls.empty();
    msg["content"] = calls && d.content.empty() ? Json() : Json(d.content);
    if (req_.chat.thinking) msg["reasoning_content"] = d.reasoning;
    if (calls) msg["tool_calls"] = tool_calls_json(d.tool_calls, 0, false);
    choice["message"] = std::move(msg);
  } else {
    choice["text"] = d.content;
  }
  choice["logprobs"] = !logprobs ? Json()
                       : chat    ? chat_logprobs(tok, d.logprobs)
                                 : completion_logprobs(tok, d.logprobs, &c.text_offset);
  choice["finish_reason"] = finish ? Json(finish) : Json();
  if (req_.return_token_ids) {
    if (first && !chat) choice["prompt_token_ids"] = req_.prompts[size_t(index / req_.n)];
    choice["token_ids"] = d.token_ids;
  }
  return dump_json(choice);
}

std::string ResponseBuilder::on_update(const CallUpdate& u) {
  Choice& c = choices_.at(size_t(u.choice));  // the engine loop numbers them from 0
  if (c.finish) return {};
  ChoiceDelta d = u.end ? c.decoder.finish(u.stop_text) : c.decoder.push(u.token);
  if (u.end) {
    c.finish = api_finish_reason(u.finish, c.decoder.num_tool_calls() > 0);
    ++ended_;
    errors_ += u.finish == FinishReason::Error;
  }
  std::string out;
  if (req_.stream && (u.end || d.has_output() || !d.token_ids.empty())) {
    out = envelope("[" + choice_json(u.choice, d, c.finish, !c.started) + "]", chunk_object(),
                   null_usage());
    c.started = true;
  }
  if (!req_.stream) c.all.append(std::move(d));
  return out;
}

std::string ResponseBuilder::stream_end() {
  return req_.include_usage ? envelope("[]", chunk_object(), usage()) : "";
}

std::string ResponseBuilder::full_body() {
  const bool chat = req_.endpoint == Endpoint::kChat;
  std::string choices = "[";
  for (size_t i = 0; i < choices_.size(); ++i)
    choices += (i ? "," : "") + choice_json(int32_t(i), choices_[i].all, choices_[i].finish, true);
  return envelope(choices + "]", chat ? "chat.completion" : "text_completion",
                  usage() + (chat ? prompt_ids() : ""));
}

}  // namespace deepinfer::server
