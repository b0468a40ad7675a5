// Messages -> DeepSeek-V4.1 prompt text. The steps mirror the reference encoder: tool messages
// merge into user turns, tool results are ordered like their calls, earlier reasoning is
// dropped in thinking mode (unless tools are present), then each message is rendered with the
// transition to the next one.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/chat.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/py_json.h"

namespace deepinfer {

namespace cf = chat_format;
using nlohmann::ordered_json;
using tokenizer_internal::py_json_dumps;

namespace {

// A user turn's parts after tool results have been merged into it.
struct Block {
  bool tool_result = false;
  std::string text;
  std::string tool_use_id;
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
  if (v.is_discarded()) throw Error(str_cat("chat: ", where, ": invalid JSON"));
  return v;
}

// An OpenAI-style tools array -> the function schemas the prompt lists.
ordered_json parse_tools(const std::string& text, const std::string& where) {
  const ordered_json tools = parse_field(text, where);
  if (!tools.is_array()) throw Error(str_cat("chat: ", where, ": expected a JSON array of tools"));
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    if (t.is_object() && t.contains("function") && t["function"].is_object()) {
      out.push_back(t["function"]);
    } else if (t.is_object() && t.contains("name")) {
      out.push_back(t);
    } else {
      throw Error(str_cat("chat: ", where, "[", i,
                          "]: expected {\"type\": \"function\", \"function\": {...}}"));
    }
  }
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
  for (size_t i = msgs.size(); i-- > 0;) {
    if (is_user_like(msgs, i)) return ptrdiff_t(i);
  }
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
      for (const Block& b : m.blocks) {
        if (b.tool_result) results.push_back(b);
      }
      if (results.size() < 2 || order.empty()) continue;
      const auto rank = [&](const Block& b) {  // unknown ids rank 0
        const auto it = order.find(b.tool_use_id);
        return it == order.end() ? 0 : it->second;
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      size_t next = 0;
      for (Block& b : m.blocks) {
        if (b.tool_result) b = std::move(results[next++]);
      }
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
  std::string schemas;
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i) schemas += '\n';
    schemas += py_json_dumps(tools[i]);
  }
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
      schemas,
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
  std::string out;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!out.empty()) out += '\n';
    out += it.value().is_string() ? param(it.key(), true, it.value().get<std::string>())
                                  : param(it.key(), false, py_json_dumps(it.value()));
  }
  return out;
}

std::string render_tool_calls(const std::vector<ChatToolCall>& calls) {
  std::string out = str_cat("\n\n", cf::kCallsOpen, "\n");
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) out += '\n';
    out += str_cat(cf::kInvokeOpen, " name=\"", calls[i].name, "\">\n",
                   render_arguments(calls[i].arguments), "\n", cf::kInvokeClose);
  }
  return out + str_cat("\n", cf::kCallsClose);
}

// `drop_thinking` is the effective setting: false when any message has tools.
std::string render_message(const std::vector<Msg>& msgs, size_t index, const ChatOptions& o,
                           bool drop_thinking) {
  const Msg& m = msgs[index];
  const ptrdiff_t last_user = last_user_index(msgs);
  std::string prompt;

  const bool effort_line = index == 0 && o.thinking;
  if (effort_line || m.role == ChatRole::kSystem) prompt += cf::kSystem;
  if (effort_line) {
    prompt += str_cat(
        "Reasoning Effort: ", o.reasoning_effort ? o.reasoning_effort : kDefaultReasoningEffort,
        " (range 1-100, the higher the value, the more thorough the reasoning)\n\n");
  }

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
      for (size_t i = 0; i < m.blocks.size(); ++i) {
        if (i) prompt += "\n\n";
        const Block& b = m.blocks[i];
        prompt +=
            b.tool_result ? str_cat(cf::kToolResultOpen, b.text, cf::kToolResultClose) : b.text;
      }
      break;
    case ChatRole::kLatestReminder:
      prompt += cf::kLatestReminder;
      prompt += m.content;
      break;
    case ChatRole::kAssistant: {
      const bool after_task = index > 0 && !msgs[index - 1].task.empty();
      if (o.thinking && !after_task && (!drop_thinking || ptrdiff_t(index) > last_user)) {
        prompt += m.reasoning_content;
        prompt += cf::kThinkEnd;
      }
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
      msgs[index + 1].role != ChatRole::kLatestReminder) {
    return prompt;
  }
  if (!m.task.empty()) {
    if (m.task == "action")
      prompt += str_cat(cf::kAssistant, o.thinking ? cf::kThinkStart : cf::kThinkEnd);
    prompt += task_token(m.task);
  } else if (is_user_like(msgs, index) && (index + 1 < msgs.size() || o.add_generation_prompt)) {
    prompt += cf::kAssistant;
    const bool open_thinking = o.thinking && (!drop_thinking || ptrdiff_t(index) >= last_user);
    prompt += open_thinking ? cf::kThinkStart : cf::kThinkEnd;
  }
  return prompt;
}

Msg convert(const ChatMessage& in, size_t i) {
  const std::string where = str_cat("messages[", i, "]");
  Msg m;
  static_cast<ChatMessage&>(m) = in;
  if (!in.tools_json.empty()) m.tools = parse_tools(in.tools_json, where + ".tools_json");
  if (!in.response_format_json.empty()) {
    m.response_format = parse_field(in.response_format_json, where + ".response_format_json");
  }
  if (!m.task.empty() && task_token(m.task).empty()) {
    throw Error(str_cat("chat: ", where, ".task: unknown task \"", m.task,
                        "\" (expected action, query, authority, domain, title or read_url)"));
  }
  if (in.role == ChatRole::kDeveloper && in.content.empty()) {
    throw Error(str_cat("chat: ", where, ": a developer message needs content"));
  }
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
  if (options.reasoning_effort != 0 &&
      (options.reasoning_effort < 1 || options.reasoning_effort > 100)) {
    throw Error(str_cat("chat: reasoning_effort ", options.reasoning_effort,
                        " is outside 1-100 (0 selects the default)"));
  }
  std::vector<Msg> msgs;
  msgs.reserve(messages.size() + 1);
  for (size_t i = 0; i < messages.size(); ++i) msgs.push_back(convert(messages[i], i));

  // Options that join the leading system message (one is added when the conversation has none).
  auto join_system = [&msgs](ordered_json Msg::*field, ordered_json value, const char* option) {
    if (msgs.empty() || msgs[0].role != ChatRole::kSystem) {
      Msg system;
      system.role = ChatRole::kSystem;
      msgs.insert(msgs.begin(), std::move(system));
    }
    if (truthy(msgs[0].*field))
      throw Error(str_cat("chat: options.", option, " and messages[0].", option, " are both set"));
    msgs[0].*field = std::move(value);
  };
  if (!options.tools_json.empty())
    join_system(&Msg::tools, parse_tools(options.tools_json, "options.tools_json"), "tools_json");
  if (!options.response_format_json.empty())
    join_system(&Msg::response_format,
                parse_field(options.response_format_json, "options.response_format_json"),
                "response_format_json");
  if (options.continue_final_message) {
    if (msgs.empty() || msgs.back().role != ChatRole::kAssistant) {
      throw Error("chat: continue_final_message needs a final assistant message");
    }
    msgs.back().open_end = true;
  }

  msgs = merge_tool_messages(std::move(msgs));
  sort_tool_results(msgs);
  bool drop = options.drop_thinking;
  for (const Msg& m : msgs) {
    if (truthy(m.tools)) drop = false;
  }
  if (options.thinking && drop) drop_earlier_thinking(msgs);

  std::string prompt = options.add_bos ? std::string(cf::kBos) : std::string();
  for (size_t i = 0; i < msgs.size(); ++i) prompt += render_message(msgs, i, options, drop);
  return prompt;
}

}  // namespace deepinfer
