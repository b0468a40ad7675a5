// DeepSeek-V4.1 chat format: messages -> prompt text, and completion text -> reasoning,
// content and tool calls.
//
// The prompt format is the one of the model repository's encoding script (there is no Jinja
// template):
//
//   <｜begin▁of▁sentence｜><｜System｜>Reasoning Effort: 75 (range 1-100, ...)\n\n{system}
//   <｜User｜>{user}<｜Assistant｜><think>{reasoning}</think>{answer}<｜end▁of▁sentence｜>
//   <｜User｜>{user}<｜Assistant｜><think>
//
// * The reasoning-effort line exists only in thinking mode and opens the first message.
// * Non-thinking turns open with "</think>" instead of "<think>". In thinking mode the
//   reasoning of turns before the last user turn is dropped, unless tools are present.
// * Tool schemas follow the system text under "## Tools" (Python json.dumps spelling, keys in
//   the order given). Assistant tool calls are DSML blocks:
//     \n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="f">\n
//     <｜DSML｜ parameter name="k" string="true">v</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n
//     </｜DSML｜ calls>
//   (string="false" values are JSON). Tool results become "<tool_result>...</tool_result>"
//   blocks of a user turn, ordered like the calls they answer.
// * A system message after the first counts as a user turn (it gets the generation prompt).
//
// JSON crosses this interface as text (tool schemas, tool-call arguments); it is parsed inside.
// Bad input (unknown task, invalid tool JSON, an empty developer message, ...) throws
// deepinfer::Error naming the message and field.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

enum class ChatRole : uint8_t { kSystem, kUser, kAssistant, kTool, kDeveloper, kLatestReminder };

struct ChatToolCall {
  std::string id;  // optional; tool results are ordered by the position of their call
  std::string name;
  std::string arguments;  // JSON text, normally an object
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;
  std::string reasoning_content;         // assistant: the thinking text
  std::vector<ChatToolCall> tool_calls;  // assistant
  std::string tool_call_id;              // tool: the call this result answers
  std::string tools_json;                // system/developer: OpenAI-style "tools" array
  std::string response_format_json;      // system/developer: schema the reply must follow
  std::string task;  // user/developer: quick-instruction task (action, query, authority,
                     // domain, title, read_url); empty for none
};

struct ChatOptions {
  bool thinking = false;
  int reasoning_effort = 0;  // 1..100; 0 = the format's default, kDefaultReasoningEffort
  // OpenAI-style "tools" array offered to the model; it joins the leading system message (an
  // empty one is inserted when the conversation does not start with one).
  std::string tools_json;
  // A schema the reply must follow (rendered under "## Response Format:"), joining the leading
  // system message the same way.
  std::string response_format_json;
  bool drop_thinking = true;
  bool add_bos = true;
  // End with "<｜Assistant｜>" + "<think>" (thinking) or "</think>" after a final user turn.
  bool add_generation_prompt = true;
  // Leave a final assistant message open (no end-of-sentence) for the model to continue.
  bool continue_final_message = false;
};

std::string encode_chat(std::span<const ChatMessage> messages, const ChatOptions& options);

// The named efforts of the V4.1 encoder: low 50, high 75 (its default), max 100.
inline constexpr int kDefaultReasoningEffort = 75;
int reasoning_effort_from_name(std::string_view name);

// --- completions ---

struct ParsedCompletion {
  std::string reasoning, content;
  std::vector<ChatToolCall> tool_calls;  // arguments as a JSON object text
  bool ended = false;                    // the end-of-sentence marker was seen
};

// Splits completion text as it streams in. Text that might be the beginning of a marker
// ("</think>", the DSML block opener, the end-of-sentence token) or of a UTF-8 character is
// held back until it is decided, so feeding a completion in any pieces gives the same result as
// feeding it whole. A tool call is reported once its invoke block is complete.
//
// In thinking mode the text starts as reasoning, up to "</think>". Content follows, up to
// "\n\n<｜DSML｜ calls" (tool calls) or "<｜end▁of▁sentence｜>". A malformed DSML block or text
// after the calls throws deepinfer::Error.
class CompletionParser {
 public:
  explicit CompletionParser(bool thinking)
      : state_(thinking ? State::kReasoning : State::kContent) {}

  // What one call adds: the text and calls decided by it, `ended` if the marker came with it.
  using Delta = ParsedCompletion;
  Delta feed(std::string_view text) {
    buffer_ += text;
    return step(/*final=*/false);
  }
  // End of the completion: releases what was held back. An unterminated tool-call block throws.
  Delta finish() { return step(/*final=*/true); }
  // Everything parsed so far.
  const ParsedCompletion& result() const { return result_; }

 private:
  enum class State : uint8_t { kReasoning, kContent, kCalls, kAfterCalls, kEnded };
  // Where a tool-call block's parse stands: between invokes, in an invoke's name, in a
  // parameter, or after a parameter.
  enum class CallStep : uint8_t { kSeek, kName, kParam, kParamTail };
  struct Param {
    std::string key, value;
    bool is_string;
  };

  Delta step(bool final);
  void emit(Delta& delta, std::string_view text);
  void parse_calls(Delta& delta, bool final);
  void finish_call(Delta& delta);

  State state_;
  std::string buffer_;  // text not decided yet
  CallStep call_step_ = CallStep::kSeek;
  std::string call_name_;
  std::vector<Param> call_params_;
  ParsedCompletion result_;
};

ParsedCompletion parse_completion(std::string_view text, bool thinking);

// Length of the longest suffix of `text` that is a proper prefix of one of `markers` (text that
// may still grow into a marker, and so is held back).
size_t partial_marker_suffix(std::string_view text,
                             std::initializer_list<std::string_view> markers);

class Tokenizer;
// The special tokens of `tok` whose text is part of a marker the parser reads ("<think>",
// "</think>", the DSML tags, end of sentence), sorted: decode completions for the parser keeping
// these (Tokenizer::decode / IncrementalDetokenizer `keep`) and skipping every other special
// token, so the markers are seen even when a tokenizer marks them special.
std::vector<int32_t> chat_marker_tokens(const Tokenizer& tok);

}  // namespace deepinfer

// Literal pieces of the DeepSeek-V4.1 chat format, shared by the encoder and the parser.
namespace deepinfer::chat_format {

inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kSystem = "<｜System｜>";
inline constexpr std::string_view kLatestReminder = "<｜latest_reminder｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

// DSML: the tag names carry a leading space after the marker.
inline constexpr std::string_view kCallsOpen = "<｜DSML｜ calls>";
inline constexpr std::string_view kCallsClose = "</｜DSML｜ calls>";
inline constexpr std::string_view kInvokeOpen = "<｜DSML｜ invoke";
inline constexpr std::string_view kInvokeClose = "</｜DSML｜ invoke>";
inline constexpr std::string_view kParamOpen = "<｜DSML｜ parameter";
inline constexpr std::string_view kParamClose = "</｜DSML｜ parameter>";
// What separates content from a tool-call block in a completion.
inline constexpr std::string_view kCallsStart = "\n\n<｜DSML｜ calls";

inline constexpr std::string_view kToolResultOpen = "<tool_result>";
inline constexpr std::string_view kToolResultClose = "</tool_result>";

}  // namespace deepinfer::chat_format
