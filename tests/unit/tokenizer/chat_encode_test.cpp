// DeepSeek-V4.1 prompt encoding against the golden cases in tests/data/tokenizer/chat_cases.json.
#include <gtest/gtest.h>

#include "core/error.h"
#include "test_data.h"
#include "tokenizer/chat.h"
#include "tokenizer/py_json.h"

namespace deepinfer {
namespace {

using nlohmann::ordered_json;
using tokenizer_internal::parse_json_exact;
using tokenizer_internal::py_json_dumps;

ChatRole role_of(const std::string& r) {
  if (r == "system") return ChatRole::kSystem;
  if (r == "user") return ChatRole::kUser;
  if (r == "assistant") return ChatRole::kAssistant;
  if (r == "tool") return ChatRole::kTool;
  if (r == "developer") return ChatRole::kDeveloper;
  if (r == "latest_reminder") return ChatRole::kLatestReminder;
  ADD_FAILURE() << "unknown role " << r;
  return ChatRole::kUser;
}

std::vector<ChatMessage> messages_of(const ordered_json& list) {
  std::vector<ChatMessage> out;
  for (const auto& m : list) {
    ChatMessage msg;
    msg.role = role_of(m["role"]);
    msg.content = m.value("content", "");
    msg.reasoning_content = m.value("reasoning_content", "");
    msg.tool_call_id = m.value("tool_call_id", "");
    msg.task = m.value("task", "");
    if (m.contains("tools")) msg.tools_json = py_json_dumps(m["tools"]);
    if (m.contains("response_format"))
      msg.response_format_json = py_json_dumps(m["response_format"]);
    for (const auto& tc : m.value("tool_calls", ordered_json::array())) {
      msg.tool_calls.push_back({tc.value("id", ""), tc["name"], tc["arguments"]});
    }
    out.push_back(std::move(msg));
  }
  return out;
}

ChatOptions options_of(const ordered_json& o) {
  ChatOptions opt;
  opt.thinking = o.value("thinking", false);
  opt.reasoning_effort = o.value("reasoning_effort", 0);
  opt.drop_thinking = o.value("drop_thinking", true);
  opt.add_bos = o.value("add_bos", true);
  opt.add_generation_prompt = o.value("add_generation_prompt", true);
  opt.continue_final_message = o.value("continue_final_message", false);
  if (o.contains("tools")) opt.tools_json = py_json_dumps(o["tools"]);
  if (o.contains("response_format")) opt.response_format_json = py_json_dumps(o["response_format"]);
  return opt;
}

ChatMessage message(ChatRole role, std::string content) {
  ChatMessage m;
  m.role = role;
  m.content = std::move(content);
  return m;
}

// Where two strings first differ, for a readable failure.
std::string first_difference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "at byte " + std::to_string(i) + "\n  got:  ..." + got.substr(from, 120) +
         "\n  want: ..." + want.substr(from, 120);
}

TEST(ChatEncode, GoldenCases) {
  // Parsed as Python's json.loads reads it: integers of any size keep their digits.
  const auto fixture = parse_json_exact(test::read_text(test::data_path("chat_cases.json")));
  ASSERT_GE(fixture["cases"].size(), 20u);
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const std::vector<ChatMessage> messages = messages_of(c["messages"]);
    const std::string got = encode_chat(messages, options_of(c["options"]));
    const std::string want = c["expected"];
    EXPECT_EQ(got, want) << first_difference(got, want);
  }
}

TEST(ChatEncode, EffortNames) {
  EXPECT_EQ(reasoning_effort_from_name("low"), 50);
  EXPECT_EQ(reasoning_effort_from_name("high"), 75);
  EXPECT_EQ(reasoning_effort_from_name("max"), 100);
  EXPECT_EQ(kDefaultReasoningEffort, 75);
  EXPECT_THROW(reasoning_effort_from_name("medium"), Error);  // the encoder's names only
  EXPECT_THROW(reasoning_effort_from_name("xhigh"), Error);
}

TEST(ChatEncode, EffortOnlyInThinkingMode) {
  const std::vector<ChatMessage> msgs = {message(ChatRole::kUser, "q")};
  ChatOptions opt;
  opt.reasoning_effort = 80;
  EXPECT_EQ(encode_chat(msgs, opt).find("Reasoning Effort"), std::string::npos);
  opt.thinking = true;
  EXPECT_NE(encode_chat(msgs, opt).find("Reasoning Effort: 80 "), std::string::npos);
}

TEST(ChatEncode, BadInputNamesTheField) {
  const auto expect_error = [](const std::vector<ChatMessage>& msgs, const ChatOptions& opt,
                               const std::string& needle) {
    try {
      encode_chat(msgs, opt);
      ADD_FAILURE() << "expected an error mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::vector<ChatMessage> msgs = {message(ChatRole::kSystem, "s"), message(ChatRole::kUser, "q")};
  ChatOptions opt;
  opt.tools_json = "[{\"type\": \"function\", \"function\": {\"name\": ";
  expect_error(msgs, opt, "options.tools_json");
  opt.tools_json = "{\"name\": \"f\"}";
  expect_error(msgs, opt, "expected a JSON array");
  opt = {};
  opt.reasoning_effort = 101;
  expect_error(msgs, opt, "reasoning_effort 101");
  opt = {};
  msgs[1].task = "dance";
  expect_error(msgs, opt, "messages[1].task");
  msgs[1].task.clear();
  msgs[0].response_format_json = "{";
  expect_error(msgs, opt, "messages[0].response_format_json");
  msgs[0].response_format_json.clear();
  opt.continue_final_message = true;
  expect_error(msgs, opt, "continue_final_message");
  expect_error({message(ChatRole::kDeveloper, "")}, {}, "developer message needs content");
}

}  // namespace
}  // namespace deepinfer
