// The DeepSeek-V4.1 chat format (chat.h).
//
// Encoding, messages -> prompt text: the steps mirror the reference encoder: tool messages
// merge into user turns, tool results are ordered like their calls, earlier reasoning is
// dropped in thinking mode (unless tools are present), then each message is rendered with the
// transition to the next one.
//
// Parsing, completion text -> reasoning, content and DSML tool calls, fed in pieces: every
// decision waits until the text that decides it has arrived: a marker is recognised only once
// complete, text that could still grow into one is held back, and a tool-call block is parsed
// one delimiter at a time. So the outcome cannot depend on where the pieces were cut.
#include "tokenizer/chat.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/py_json.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer {

namespace cf = chat_format;
using nlohmann::ordered_json;
using tokenizer_internal::py_json_dumps;

namespace {

// A user turn's parts after tool results have been merged into it.
struct Block {
  bool tool_result = false;
  std::string text, tool_use_id;
};

struct Msg : ChatMessage {
  ordered_json tools;            // tools_json parsed: array of function schemas, or null
  ordered_json response_format;  // response_format_json parsed, or null
  std::vector<Block> blocks;     // user turns, once tool messages are merged
  bool open_end = false;         // no end-of-sentence (continue_final_message)
};

// "<｜task｜>" for a known task, empty otherwise.
std::string task_token(const std::string& task) {
  for (const char* t : {"action", "query", "authority", "domain", "title", "read_url"})
    if (task == t) return str_cat("<｜", t, "｜>");
  return {};
}

ordered_json parse_field(const std::string& text, const std::string& where) {
  ordered_json v = tokenizer_internal::parse_json_exact(text);  // big integers keep every digit
  DI_REQUIRE(!v.is_discarded(), "chat: ", where, ": invalid JSON");
  return v;
}

// An OpenAI-style tools array -> the function schemas the prompt lists.
ordered_json parse_tools(const std::string& text, const std::string& where) {
  const ordered_json tools = parse_field(text, where);
  DI_REQUIRE(tools.is_array(), "chat: ", where, ": expected a JSON array of tools");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    const bool wrapped = t.is_object() && t.contains("function") && t["function"].is_object();
    DI_REQUIRE(wrapped || (t.is_object() && t.contains("name")), "chat: ", where, "[", i,
               "]: expected {\"type\": \"function\", \"function\": {...}}");
    out.push_back(wrapped ? t["function"] : t);
  }
  return out;
}

// f(item) for each item, `sep` between them.
template <typename Range, typename F>
std::string join(const Range& items, std::string_view sep, F f) {
  std::string out;
  bool first = true;
  for (const auto& item : items) out += str_cat(std::exchange(first, false) ? "" : sep, f(item));
  return out;
}

bool truthy(const ordered_json& v) {
  return !v.is_null() && !(v.is_structured() && v.empty());
}

// Role user/developer, or a system message that is not the first: these get the generation
// prompt after them.
bool is_user_like(const std::vector<Msg>& msgs, size_t i) {
  const ChatRole r = msgs[i].role;
  return r == ChatRole::kUser || r == ChatRole::kDeveloper || (r == ChatRole::kSystem && i > 0);
}

ptrdiff_t last_user_index(const std::vector<Msg>& msgs) {
  for (size_t i = msgs.size(); i-- > 0;)
    if (is_user_like(msgs, i)) return ptrdiff_t(i);
  return -1;
}

// --- preprocessing ---

std::vector<Msg> merge_tool_messages(std::vector<Msg> in) {
  std::vector<Msg> out;
  for (Msg& m : in) {
    if (m.role != ChatRole::kTool && m.role != ChatRole::kUser) {
      out.push_back(std::move(m));
      continue;
    }
    const bool tool = m.role == ChatRole::kTool;
    Block b{tool, m.content, tool ? m.tool_call_id : std::string()};
    // A tool result joins the user turn before it; so does a user message unless that turn has
    // a task. (The reference keeps only the blocks of a user turn merged into the previous one.)
    if (!out.empty() && out.back().role == ChatRole::kUser && (tool || out.back().task.empty())) {
      out.back().blocks.push_back(std::move(b));
      continue;
    }
    if (tool) m = Msg();  // a tool result opens a user turn of its own
    m.role = ChatRole::kUser;
    m.blocks.push_back(std::move(b));
    out.push_back(std::move(m));
  }
  return out;
}

void sort_tool_results(std::vector<Msg>& msgs) {
  // Call id -> position in its message; a later duplicate id overwrites an earlier one, as in a
  // dict.
  std::map<std::string, size_t> order;
  for (Msg& m : msgs) {
    if (m.role == ChatRole::kAssistant && !m.tool_calls.empty()) {
      order.clear();
      for (size_t i = 0; i < m.tool_calls.size(); ++i)
        if (!m.tool_calls[i].id.empty()) order[m.tool_calls[i].id] = i;
    } else if (m.role == ChatRole::kUser) {
      std::vector<Block> results;
      std::ranges::copy_if(m.blocks, std::back_inserter(results), &Block::tool_result);
      std::ranges::stable_sort(results, {}, [&](const Block& b) {  // unknown ids rank 0
        const auto it = order.find(b.tool_use_id);
        return it == order.end() ? 0 : it->second;
      });
      size_t next = 0;
      for (Block& b : m.blocks)
        if (b.tool_result) b = std::move(results[next++]);
    }
  }
}

// Before the last user turn: assistant reasoning is cleared and developer messages are dropped.
void drop_earlier_thinking(std::vector<Msg>& msgs) {
  const auto end = msgs.begin() + std::max<ptrdiff_t>(last_user_index(msgs), 0);
  for (auto it = msgs.begin(); it != end; ++it)
    if (it->role == ChatRole::kAssistant) it->reasoning_content.clear();
  msgs.erase(std::remove_if(msgs.begin(), end,
                            [](const Msg& m) { return m.role == ChatRole::kDeveloper; }),
             end);
}

// --- rendering ---

std::string render_tools(const ordered_json& tools) {
  return str_cat(
      "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can "
      "invoke tools by writing a \"",
      cf::kCallsOpen, "\" block like the following:\n\n", cf::kCallsOpen, "\n", cf::kInvokeOpen,
      " name=\"$TOOL_NAME\">\n", cf::kParamOpen,
      " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE", cf::kParamClose,
      "\n...\n", cf::kInvokeClose, "\n", cf::kInvokeOpen, " name=\"$TOOL_NAME2\">\n...\n",
      cf::kInvokeClose, "\n", cf::kCallsClose,
      "\n\nString parameters should be specified as is and set `string=\"true\"`. For all other "
      "types (numbers, booleans, arrays, objects), pass the value in JSON format and set "
      "`string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by ",
      cf::kThinkStart, "), you MUST output your complete reasoning inside ", cf::kThinkStart, "...",
      cf::kThinkEnd,
      " BEFORE any tool calls or final response.\n\nOtherwise, output directly after ",
      cf::kThinkEnd, " with tool calls or final response.\n\n### Available Tool Schemas\n\n",
      join(tools, "\n", py_json_dumps),
      "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke "
      "tool calls.\n");
}

std::string render_response_format(const ordered_json& schema) {
  return "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
         py_json_dumps(schema);
}

// One parameter per key of the arguments object. Arguments that are not an object (after
// undoing at most one extra level of string encoding) become a single string parameter
// "arguments" holding the text as given.
std::string render_arguments(const std::string& arguments) {
  ordered_json v = tokenizer_internal::parse_json_exact(arguments);
  if (!v.is_discarded() && v.is_string()) {
    ordered_json inner = tokenizer_internal::parse_json_exact(v.get<std::string>());
    if (!inner.is_discarded()) v = std::move(inner);
  }
  const auto param = [](const std::string& key, bool is_string, const std::string& value) {
    return str_cat(cf::kParamOpen, " name=\"", key, "\" string=\"", is_string ? "true" : "false",
                   "\">", value, cf::kParamClose);
  };
  if (v.is_discarded() || !v.is_object()) return param("arguments", true, arguments);
  return join(v.items(), "\n", [&](const auto& kv) {
    return kv.value().is_string() ? param(kv.key(), true, kv.value().template get<std::string>())
                                  : param(kv.key(), false, py_json_dumps(kv.value()));
  });
}

std::string render_tool_calls(const std::vector<ChatToolCall>& calls) {
  const auto invoke = [](const ChatToolCall& c) {
    return str_cat(cf::kInvokeOpen, " name=\"", c.name, "\">\n", render_arguments(c.arguments),
                   "\n", cf::kInvokeClose);
  };
  return str_cat("\n\n", cf::kCallsOpen, "\n", join(calls, "\n", invoke), "\n", cf::kCallsClose);
}

// `drop_thinking` is the effective setting: false when any message has tools.
std::string render_message(const std::vector<Msg>& msgs, size_t index, const ChatOptions& o,
                           bool drop_thinking) {
  const Msg& m = msgs[index];
  const ptrdiff_t last_user = last_user_index(msgs);
  std::string prompt;

  const bool effort_line = index == 0 && o.thinking;
  if (effort_line || m.role == ChatRole::kSystem) prompt += cf::kSystem;
  if (effort_line)
    prompt += str_cat(
        "Reasoning Effort: ", o.reasoning_effort ? o.reasoning_effort : kDefaultReasoningEffort,
        " (range 1-100, the higher the value, the more thorough the reasoning)\n\n");

  switch (m.role) {
    case ChatRole::kSystem:
    case ChatRole::kDeveloper:
      if (m.role == ChatRole::kDeveloper) prompt += cf::kUser;
      prompt += m.content;
      if (truthy(m.tools)) prompt += "\n\n" + render_tools(m.tools);
      if (truthy(m.response_format)) prompt += "\n\n" + render_response_format(m.response_format);
      break;
    case ChatRole::kUser:
      prompt += cf::kUser;
      // Tool messages are merged into user turns, so every user turn has its blocks.
      prompt += join(m.blocks, "\n\n", [](const Block& b) {
        return b.tool_result ? str_cat(cf::kToolResultOpen, b.text, cf::kToolResultClose) : b.text;
      });
      break;
    case ChatRole::kLatestReminder:
      prompt += str_cat(cf::kLatestReminder, m.content);
      break;
    case ChatRole::kAssistant: {
      const bool after_task = index > 0 && !msgs[index - 1].task.empty();
      if (o.thinking && !after_task && (!drop_thinking || ptrdiff_t(index) > last_user))
        prompt += str_cat(m.reasoning_content, cf::kThinkEnd);
      prompt += m.content;
      if (!m.tool_calls.empty()) prompt += render_tool_calls(m.tool_calls);
      if (!m.open_end) prompt += cf::kEos;
      break;
    }
    case ChatRole::kTool:
      DI_CHECK(false, "tool messages are merged into user turns before rendering");
  }

  // The transition to what follows: only before an assistant or reminder message, or at the end.
  if (index + 1 < msgs.size() && msgs[index + 1].role != ChatRole::kAssistant &&
      msgs[index + 1].role != ChatRole::kLatestReminder)
    return prompt;
  if (!m.task.empty()) {
    if (m.task == "action")
      prompt += str_cat(cf::kAssistant, o.thinking ? cf::kThinkStart : cf::kThinkEnd);
    prompt += task_token(m.task);
  } else if (is_user_like(msgs, index) && (index + 1 < msgs.size() || o.add_generation_prompt)) {
    const bool open_thinking = o.thinking && (!drop_thinking || ptrdiff_t(index) >= last_user);
    prompt += str_cat(cf::kAssistant, open_thinking ? cf::kThinkStart : cf::kThinkEnd);
  }
  return prompt;
}

Msg convert(const ChatMessage& in, size_t i) {
  const std::string where = str_cat("messages[", i, "]");
  Msg m;
  static_cast<ChatMessage&>(m) = in;
  if (!in.tools_json.empty()) m.tools = parse_tools(in.tools_json, where + ".tools_json");
  if (!in.response_format_json.empty())
    m.response_format = parse_field(in.response_format_json, where + ".response_format_json");
  DI_REQUIRE(m.task.empty() || !task_token(m.task).empty(), "chat: ", where,
             ".task: unknown task \"", m.task,
             "\" (expected action, query, authority, domain, title or read_url)");
  DI_REQUIRE(in.role != ChatRole::kDeveloper || !in.content.empty(), "chat: ", where,
             ": a developer message needs content");
  return m;
}

}  // namespace

int reasoning_effort_from_name(std::string_view name) {
  if (name == "low") return 50;
  if (name == "high") return kDefaultReasoningEffort;
  if (name == "max") return 100;
  throw Error(str_cat("chat: reasoning effort \"", name,
                      "\" is not one of low, high, max (or a number 1-100)"));
}

std::string encode_chat(std::span<const ChatMessage> messages, const ChatOptions& options) {
  DI_REQUIRE(options.reasoning_effort >= 0 && options.reasoning_effort <= 100,
             "chat: reasoning_effort ", options.reasoning_effort,
             " is outside 1-100 (0 selects the default)");
  std::vector<Msg> msgs;
  msgs.reserve(messages.size() + 1);
  for (size_t i = 0; i < messages.size(); ++i) msgs.push_back(convert(messages[i], i));

  // Options that join the leading system message (one is added when the conversation has none).
  auto join_system = [&msgs](ordered_json Msg::*field, ordered_json value, const char* option) {
    if (msgs.empty() || msgs[0].role != ChatRole::kSystem) {
      msgs.insert(msgs.begin(), Msg());
      msgs[0].role = ChatRole::kSystem;
    }
    DI_REQUIRE(!truthy(msgs[0].*field), "chat: options.", option, " and messages[0].", option,
               " are both set");
    msgs[0].*field = std::move(value);
  };
  if (!options.tools_json.empty())
    join_system(&Msg::tools, parse_tools(options.tools_json, "options.tools_json"), "tools_json");
  if (!options.response_format_json.empty())
    join_system(&Msg::response_format,
                parse_field(options.response_format_json, "options.response_format_json"),
                "response_format_json");
  if (options.continue_final_message) {
    DI_REQUIRE(!msgs.empty() && msgs.back().role == ChatRole::kAssistant,
               "chat: continue_final_message needs a final assistant message");
    msgs.back().open_end = true;
  }

  msgs = merge_tool_messages(std::move(msgs));
  sort_tool_results(msgs);
  const bool drop = options.drop_thinking &&
                    std::ranges::none_of(msgs, [](const Msg& m) { return truthy(m.tools); });
  if (options.thinking && drop) drop_earlier_thinking(msgs);

  std::string prompt = options.add_bos ? std::string(cf::kBos) : std::string();
  for (size_t i = 0; i < msgs.size(); ++i) prompt += render_message(msgs, i, options, drop);
  return prompt;
}

// --- completions ---

namespace {

// Delimiters as the block grammar reads them; several stop short of their closing '>', which
// the next step then expects in ">\n".
constexpr std::string_view kInvokeEnd = "</｜DSML｜ invoke";
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

void CompletionParser::emit(Delta& delta, std::string_view text) {
  const bool reasoning = state_ == State::kReasoning;
  (reasoning ? delta.reasoning : delta.content) += text;
  (reasoning ? result_.reasoning : result_.content) += text;
}

void CompletionParser::finish_call(Delta& delta) {
  // The arguments object as the reference writes it: string values quoted, the others as the
  // model wrote them.
  const std::string args = join(call_params_, ", ", [](const Param& p) {
    return py_json_dumps(p.key) + ": " + (p.is_string ? py_json_dumps(p.value) : p.value);
  });
  ChatToolCall call{{}, std::move(call_name_), "{" + args + "}"};
  delta.tool_calls.push_back(call);
  result_.tool_calls.push_back(std::move(call));
  call_name_.clear();
  call_params_.clear();
}

// Parses as much of the tool-call block in buffer_ as has arrived. Grammar, after the opener
// "\n\n<｜DSML｜ calls": ">\n", then invokes each followed by ">\n", then "</｜DSML｜ calls>".
// An invoke is cf::kInvokeOpen ' name="NAME">\n' parameters kInvokeEnd; a parameter is
// cf::kParamOpen ' name="KEY" string="true|false">VALUE<' kParamEnd ">\n". Each step reads up to
// the first delimiter that can end it, and that delimiter decides the next step.
void CompletionParser::parse_calls(Delta& delta, bool final) {
  while (state_ == State::kCalls) {
    const CallStep step = call_step_;
    const auto [at, stop] =
        step == CallStep::kSeek    ? find_first(buffer_, {cf::kInvokeOpen, cf::kCallsClose})
        : step == CallStep::kParam ? find_first(buffer_, {kParamEnd})
                                   : find_first(buffer_, {cf::kParamOpen, kInvokeEnd});
    std::string_view head = std::string_view(buffer_).substr(0, at);
    if (at == std::string::npos) {
      if (final)
        malformed(step == CallStep::kSeek    ? "no closing " + std::string(cf::kCallsClose)
                  : step == CallStep::kParam ? "unterminated parameter"
                                             : "unterminated invoke");
      // Between invokes, what has arrived must be the start of ">\n".
      if (step == CallStep::kSeek && !std::string_view(">\n").starts_with(head.substr(0, 2)))
        malformed("expected \">\\n\", got \"" + excerpt(head) + "\"");
      return;
    }
    if (step == CallStep::kName) {
      head.remove_prefix(std::min(head.find_first_not_of(" \t\n\r\f\v"), head.size()));
      if (head.size() < 9 || !head.starts_with("name=\"") || !head.ends_with("\">\n"))
        malformed("expected name=\"...\">\\n to open an invoke, got \"" + excerpt(head) + "\"");
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
      for (const Param& q : call_params_)
        if (q.key == p.key) malformed("duplicate parameter \"" + p.key + "\"");
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
      call_step_ = stop == cf::kInvokeOpen  ? CallStep::kName
                   : stop == cf::kParamOpen ? CallStep::kParam
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
        DI_REQUIRE(buffer_.empty(), "completion: text after the end-of-sentence marker: \"",
                   excerpt(buffer_), "\"");
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

ParsedCompletion parse_completion(std::string_view text, bool thinking) {
  CompletionParser parser(thinking);
  parser.feed(text);
  parser.finish();
  return parser.result();
}

std::vector<int32_t> chat_marker_tokens(const Tokenizer& tok) {
  constexpr std::string_view kMarkers[] = {
      cf::kThinkStart, cf::kThinkEnd,    cf::kCallsStart, cf::kCallsOpen,  cf::kCallsClose,
      cf::kInvokeOpen, cf::kInvokeClose, cf::kParamOpen,  cf::kParamClose, cf::kEos};
  std::vector<int32_t> out;
  for (int32_t id = 0; id < tok.id_limit(); ++id) {
    const std::string_view text = tok.token_bytes(id);
    if (tok.is_special(id) && !text.empty() &&
        std::ranges::any_of(kMarkers, [&](std::string_view m) { return m.find(text) != m.npos; }))
      out.push_back(id);
  }
  return out;  // ascending
}

}  // namespace deepinfer
