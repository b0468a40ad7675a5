#include "server/choice_decoder.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <utility>

#include "tokenizer/chat_format.h"

namespace deepinfer::server {

namespace {

// Length of the longest suffix of `text` that is a proper prefix of `stop`.
size_t partial_stop_suffix(const std::string& text, const std::string& stop) {
  for (size_t n = std::min(text.size(), stop.size() - 1); n > 0; --n)
    if (text.compare(text.size() - n, n, stop, 0, n) == 0) return n;
  return 0;
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

ChoiceDecoder::~ChoiceDecoder() = default;

ChoiceDelta ChoiceDecoder::push(const TokenEvent& ev) {
  ++num_tokens_;
  pending_.token_ids.push_back(ev.token);
  if (logprobs_) {
    const auto sampled = std::find_if(ev.logprobs.begin(), ev.logprobs.end(),
                                      [&](const auto& lp) { return lp.first == ev.token; });
    const auto top_end =
        ev.logprobs.begin() + std::min<ptrdiff_t>(top_logprobs_, ev.logprobs.size());
    pending_.logprobs.push_back({ev.token,
                                 sampled == ev.logprobs.end() ? -9999.0f : sampled->second,
                                 TopLogprobs(ev.logprobs.begin(), top_end)});
  }
  if (!tokenizer_) return std::exchange(pending_, {});
  ChoiceDelta d;
  text_ += detok_->push(ev.token);
  // Hold back from the first stop string found, or from a tail that may grow into one.
  size_t end = text_.size();
  for (const std::string& stop : stops_) {
    const size_t at = text_.find(stop, sent_);
    end = std::min(end,
                   at != std::string::npos ? at : text_.size() - partial_stop_suffix(text_, stop));
  }
  if (end > sent_) release(end, &d, false);
  return d.has_output() ? with_pending(std::move(d)) : d;
}

ChoiceDelta ChoiceDecoder::finish(const std::string& stop_text) {
  ChoiceDelta d;
  if (tokenizer_) {
    text_ += detok_->flush();
    size_t end = text_.size();
    if (!stop_text.empty()) end = std::min(end, text_.find(stop_text));
    release(std::max(end, sent_), &d, true);
  }
  return with_pending(std::move(d));
}

ChoiceDelta ChoiceDecoder::with_pending(ChoiceDelta&& d) {
  pending_.append(std::move(d));
  return std::exchange(pending_, {});
}

void ChoiceDecoder::release(size_t end, ChoiceDelta* d, bool final) {
  const std::string piece = text_.substr(sent_, end - sent_);
  sent_ = end;
  route(piece, d, final);
}

void ChoiceDecoder::route(const std::string& text, ChoiceDelta* d, bool final) {
  if (!parser_ || parser_failed_) {
    d->content += text;
    return;
  }
  routed_ += text;
  const ParsedCompletion& r = parser_->result();
  // How much of the parser's result has gone out; a failure below resumes from there.
  size_t reasoning_out = r.reasoning.size(), content_out = r.content.size();
  size_t calls_out = r.tool_calls.size();
  auto add_call = [&](ChatToolCall c) {
    c.id = "call_" + random_hex64();
    d->tool_calls.push_back(std::move(c));
    ++num_tool_calls_;
  };
  auto take = [&](CompletionParser::Delta&& pd) {
    d->reasoning += pd.reasoning;
    d->content += pd.content;
    for (ChatToolCall& c : pd.tool_calls) add_call(std::move(c));
    reasoning_out = r.reasoning.size(), content_out = r.content.size();
    calls_out = r.tool_calls.size();
  };
  try {
    take(parser_->feed(text));
    if (final) take(parser_->finish());
  } catch (const Error&) {
    // A malformed tool-call block: what the parser had accepted before failing goes out as it
    // would have, and the raw text from the block's opener on becomes content.
    parser_failed_ = true;
    d->reasoning += r.reasoning.substr(std::min(reasoning_out, r.reasoning.size()));
    d->content += r.content.substr(std::min(content_out, r.content.size()));
    for (size_t i = calls_out; i < r.tool_calls.size(); ++i) add_call(r.tool_calls[i]);
    size_t from = 0;
    if (chat_.thinking) {
      const size_t think_end = routed_.find(chat_format::kThinkEnd);
      from = think_end == std::string::npos ? routed_.size() : think_end;
    }
    const size_t at = routed_.find(chat_format::kCallsStart, from);
    if (at != std::string::npos) d->content += routed_.substr(at);
  }
}

}  // namespace deepinfer::server
