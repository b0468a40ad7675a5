// Completion text -> reasoning, content and DSML tool calls, fed in pieces.
//
// Every decision waits until the text that decides it has arrived: a marker is recognised only
// once complete, text that could still grow into one is held back, and a tool-call block is
// parsed one delimiter at a time. So the outcome cannot depend on where the pieces were cut.
#include <algorithm>

#include "core/error.h"
#include "tokenizer/chat.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/py_json.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer {

namespace cf = chat_format;
using tokenizer_internal::py_json_dumps;

namespace {

// Delimiters as the block grammar reads them; several stop short of their closing '>', which
// the next step then expects in ">\n".
constexpr std::string_view kInvokeStart = cf::kInvokeOpen;  // "<｜DSML｜ invoke"
constexpr std::string_view kInvokeEnd = "</｜DSML｜ invoke";
constexpr std::string_view kParamStart = cf::kParamOpen;  // "<｜DSML｜ parameter"
constexpr std::string_view kParamEnd = "/｜DSML｜ parameter";
constexpr std::string_view kStringTrue = "\" string=\"true\">";
constexpr std::string_view kStringFalse = "\" string=\"false\">";

// The earliest of `stops` in `text`: {position, the stop found}, position npos (and an empty
// stop) if none. No delimiter of this format can begin inside another, so the earliest complete
// one found is final even while more text is still to come.
std::pair<size_t, std::string_view> find_first(std::string_view text,
                                               std::initializer_list<std::string_view> stops) {
  std::pair<size_t, std::string_view> best{std::string_view::npos, {}};
  for (const std::string_view s : stops)
    if (const size_t at = text.find(s); at < best.first) best = {at, s};
  return best;
}

[[noreturn]] void malformed(const std::string& what) {
  throw Error("completion: malformed tool-call block: " + what);
}

std::string excerpt(std::string_view s) {
  return std::string(s.substr(0, 80)) + (s.size() > 80 ? "..." : "");
}

}  // namespace

size_t partial_marker_suffix(std::string_view text,
                             std::initializer_list<std::string_view> markers) {
  size_t longest = 0;
  for (const std::string_view marker : markers) {
    if (marker.empty()) continue;  // nothing can grow into an empty marker
    for (size_t n = std::min(text.size(), marker.size() - 1); n > longest; --n)
      if (text.ends_with(marker.substr(0, n))) longest = n;
  }
  return longest;
}

CompletionParser::CompletionParser(bool thinking)
    : state_(thinking ? State::kReasoning : State::kContent) {}

void CompletionParser::emit(Delta& delta, std::string_view text) {
  if (text.empty()) return;
  std::string& d = state_ == State::kReasoning ? delta.reasoning : delta.content;
  std::string& r = state_ == State::kReasoning ? result_.reasoning : result_.content;
  d += text;
  r += text;
}

void CompletionParser::finish_call(Delta& delta) {
  // The arguments object as the reference writes it: string values quoted, the others as the
  // model wrote them.
  std::string args = "{";
  for (size_t i = 0; i < call_params_.size(); ++i) {
    const Param& p = call_params_[i];
    if (i) args += ", ";
    args += py_json_dumps(p.key) + ": " + (p.is_string ? py_json_dumps(p.value) : p.value);
  }
  args += "}";
  ChatToolCall call{{}, std::move(call_name_), std::move(args)};
  delta.tool_calls.push_back(call);
  result_.tool_calls.push_back(std::move(call));
  call_name_.clear();
  call_params_.clear();
}

// Parses as much of the tool-call block in buffer_ as has arrived. Grammar, after the opener
// "\n\n<｜DSML｜ calls": ">\n", then invokes each followed by ">\n", then "</｜DSML｜ calls>".
// An invoke is kInvokeStart ' name="NAME">\n' parameters kInvokeEnd; a parameter is kParamStart
// ' name="KEY" string="true|false">VALUE<' kParamEnd ">\n". Each step reads up to the first
// delimiter that can end it, and that delimiter decides the next step.
void CompletionParser::parse_calls(Delta& delta, bool final) {
  while (state_ == State::kCalls) {
    const CallStep step = call_step_;
    const auto [at, stop] =
        step == CallStep::kSeek    ? find_first(buffer_, {kInvokeStart, cf::kCallsClose})
        : step == CallStep::kParam ? find_first(buffer_, {kParamEnd})
                                   : find_first(buffer_, {kParamStart, kInvokeEnd});
    std::string_view head = std::string_view(buffer_).substr(0, at);
    if (at == std::string::npos) {
      if (final) {
        malformed(step == CallStep::kSeek    ? "no closing " + std::string(cf::kCallsClose)
                  : step == CallStep::kParam ? "unterminated parameter"
                                             : "unterminated invoke");
      }
      // Between invokes, what has arrived must be the start of ">\n".
      if (step == CallStep::kSeek && !std::string_view(">\n").starts_with(head.substr(0, 2)))
        malformed("expected \">\\n\", got \"" + excerpt(head) + "\"");
      return;
    }
    if (step == CallStep::kName) {
      head.remove_prefix(std::min(head.find_first_not_of(" \t\n\r\f\v"), head.size()));
      if (head.size() < 9 || head.substr(0, 6) != "name=\"" ||
          head.substr(head.size() - 3) != "\">\n") {
        malformed("expected name=\"...\">\\n to open an invoke, got \"" + excerpt(head) + "\"");
      }
      call_name_ = std::string(head.substr(6, head.size() - 9));
    } else if (step == CallStep::kParam) {
      const auto [flag_at, flag] = find_first(head, {kStringTrue, kStringFalse});
      const size_t value_at = flag_at == std::string::npos ? 0 : flag_at + flag.size();
      if (head.substr(0, 7) != " name=\"" || flag_at == std::string::npos || flag_at < 7 ||
          head.size() < value_at + 1 || head.back() != '<') {
        malformed("expected name=\"...\" string=\"true|false\">...< in a parameter, got \"" +
                  excerpt(head) + "\"");
      }
      Param p{std::string(head.substr(7, flag_at - 7)),
              std::string(head.substr(value_at, head.size() - 1 - value_at)), flag == kStringTrue};
      for (const Param& q : call_params_) {
        if (q.key == p.key) malformed("duplicate parameter \"" + p.key + "\"");
      }
      call_params_.push_back(std::move(p));
    } else if (head != ">\n") {
      malformed(str_cat("expected \">\\n\"",
                        step == CallStep::kParamTail ? " after a parameter" : "", ", got \"",
                        excerpt(head), "\""));
    }
    buffer_.erase(0, at + stop.size());
    if (stop == cf::kCallsClose) {
      state_ = State::kAfterCalls;
    } else if (stop == kInvokeEnd) {
      finish_call(delta);
      call_step_ = CallStep::kSeek;
    } else {
      call_step_ = stop == kInvokeStart  ? CallStep::kName
                   : stop == kParamStart ? CallStep::kParam
                                         : CallStep::kParamTail;
    }
  }
}

CompletionParser::Delta CompletionParser::step(bool final) {
  Delta delta;
  for (;;) {
    switch (state_) {
      case State::kReasoning:
      case State::kContent: {
        // Reasoning ends at "</think>"; content at the tool-call opener or the end marker.
        const bool reasoning = state_ == State::kReasoning;
        const auto [at, stop] = reasoning ? find_first(buffer_, {cf::kThinkEnd})
                                          : find_first(buffer_, {cf::kCallsStart, cf::kEos});
        if (at == std::string::npos) break;
        emit(delta, std::string_view(buffer_).substr(0, at));
        buffer_.erase(0, at + stop.size());
        state_ = reasoning ? State::kContent : stop == cf::kEos ? State::kEnded : State::kCalls;
        delta.ended = result_.ended = stop == cf::kEos;
        continue;
      }
      case State::kCalls:
        parse_calls(delta, final);
        if (state_ == State::kCalls) return delta;
        continue;
      case State::kAfterCalls: {
        // Only the end-of-sentence marker may follow the block.
        const size_t n = std::min(buffer_.size(), cf::kEos.size());
        if (std::string_view(buffer_).substr(0, n) != cf::kEos.substr(0, n) ||
            (final && n > 0 && n < cf::kEos.size())) {
          malformed("unexpected text after the tool calls: \"" + excerpt(buffer_) + "\"");
        }
        if (n < cf::kEos.size()) return delta;
        buffer_.erase(0, n);
        state_ = State::kEnded;
        delta.ended = result_.ended = true;
        continue;
      }
      case State::kEnded:
        if (!buffer_.empty()) {
          throw Error("completion: text after the end-of-sentence marker: \"" + excerpt(buffer_) +
                      "\"");
        }
        return delta;
    }
    break;
  }

  // Reasoning or content with no complete marker: release all but what may still become one
  // (or the rest of a UTF-8 character).
  size_t hold = 0;
  if (!final) {
    hold = state_ == State::kReasoning
               ? partial_marker_suffix(buffer_, {cf::kThinkEnd})
               : partial_marker_suffix(buffer_, {cf::kCallsStart, cf::kEos});
    hold = std::max(hold, buffer_.size() - utf8::stable_prefix(buffer_));
  }
  emit(delta, std::string_view(buffer_).substr(0, buffer_.size() - hold));
  buffer_.erase(0, buffer_.size() - hold);
  return delta;
}

CompletionParser::Delta CompletionParser::feed(std::string_view text) {
  buffer_ += text;
  return step(/*final=*/false);
}

ParsedCompletion parse_completion(std::string_view text, bool thinking) {
  CompletionParser parser(thinking);
  parser.feed(text);
  parser.finish();
  return parser.result();
}

std::vector<int32_t> chat_marker_tokens(const Tokenizer& tok) {
  std::vector<int32_t> out;
  for (int32_t id = 0; id < tok.id_limit(); ++id) {
    const std::string_view text = tok.token_bytes(id);
    if (!tok.is_special(id) || text.empty()) continue;
    for (const std::string_view marker :
         {cf::kThinkStart, cf::kThinkEnd, cf::kCallsStart, cf::kCallsOpen, cf::kCallsClose,
          cf::kInvokeOpen, cf::kInvokeClose, cf::kParamOpen, cf::kParamClose, cf::kEos})
      if (marker.find(text) != std::string_view::npos) {
        out.push_back(id);
        break;
      }
  }
  return out;  // ascending
}

}  // namespace deepinfer
