// Completion parsing: whole text, and the same text streamed in every possible split.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "tokenizer/chat.h"
#include "tokenizer/utf8.h"

namespace deepinfer {
namespace {

const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string kCalls =
    "\n\n<｜DSML｜ calls>\n"
    "<｜DSML｜ invoke name=\"get_weather\">\n"
    "<｜DSML｜ parameter name=\"location\" string=\"true\">東京 \"quoted\"\nline</｜DSML｜ "
    "parameter>\n"
    "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"opts\" string=\"false\">{\"unit\": \"C\", \"x\": [1, 2]}</｜DSML｜ "
    "parameter>\n"
    "</｜DSML｜ invoke>\n"
    "<｜DSML｜ invoke name=\"now\">\n"
    "</｜DSML｜ invoke>\n"
    "</｜DSML｜ calls>";

void expect_same(const ParsedCompletion& a, const ParsedCompletion& b, const std::string& how) {
  EXPECT_EQ(a.reasoning, b.reasoning) << how;
  EXPECT_EQ(a.content, b.content) << how;
  EXPECT_EQ(a.ended, b.ended) << how;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << how;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << how;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << how;
  }
}

// Feeds `pieces` and checks the deltas add up to the parser's result and never end inside a
// UTF-8 character.
ParsedCompletion stream(const std::vector<std::string>& pieces, bool thinking) {
  CompletionParser p(thinking);
  ParsedCompletion sum;
  const auto add = [&](const CompletionParser::Delta& d) {
    EXPECT_TRUE(utf8::is_valid(d.reasoning) && utf8::is_valid(d.content));
    sum.reasoning += d.reasoning;
    sum.content += d.content;
    sum.tool_calls.insert(sum.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  };
  for (const std::string& piece : pieces) add(p.feed(piece));
  add(p.finish());
  sum.ended = p.result().ended;
  expect_same(sum, p.result(), "deltas vs result");
  return p.result();
}

// Every cut into two pieces, byte-by-byte, and random partitions agree with the whole text.
void check_streaming(const std::string& text, bool thinking) {
  const ParsedCompletion whole = parse_completion(text, thinking);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    expect_same(stream({text.substr(0, cut), text.substr(cut)}, thinking), whole,
                "cut at " + std::to_string(cut));
  }
  std::vector<std::string> bytes;
  for (const char c : text) bytes.emplace_back(1, c);
  expect_same(stream(bytes, thinking), whole, "byte by byte");
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::string> pieces;
    for (size_t pos = 0; pos < text.size();) {
      const size_t n = std::min(text.size() - pos, size_t(rng() % 12));
      pieces.push_back(text.substr(pos, n));
      pos += n;
    }
    expect_same(stream(pieces, thinking), whole, "random partition " + std::to_string(trial));
  }
}

TEST(CompletionParse, ReasoningContentAndToolCalls) {
  const std::string text = "Let me think: 2 < 3 </thi and more.</think>I'll check." + kCalls + kEos;
  const ParsedCompletion r = parse_completion(text, /*thinking=*/true);
  EXPECT_EQ(r.reasoning, "Let me think: 2 < 3 </thi and more.");
  EXPECT_EQ(r.content, "I'll check.");
  EXPECT_TRUE(r.ended);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(
      r.tool_calls[0].arguments,
      "{\"location\": \"東京 \\\"quoted\\\"\\nline\", \"days\": 3, \"opts\": {\"unit\": \"C\", "
      "\"x\": [1, 2]}}");
  EXPECT_EQ(r.tool_calls[1].name, "now");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
  check_streaming(text, true);
}

TEST(CompletionParse, ChatModeContentOnly) {
  const std::string text =
      "Hello 世界 😀\n\n<｜DSML not a call <｜end▁of▁sentence not the end" + kEos;
  const ParsedCompletion r = parse_completion(text, /*thinking=*/false);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Hello 世界 😀\n\n<｜DSML not a call <｜end▁of▁sentence not the end");
  EXPECT_TRUE(r.ended);
  EXPECT_TRUE(r.tool_calls.empty());
  check_streaming(text, false);
}

TEST(CompletionParse, UnfinishedCompletionKeepsEverything) {
  // Cut off by a length limit: no </think>, no end marker.
  const ParsedCompletion r = parse_completion("still thinking </th", true);
  EXPECT_EQ(r.reasoning, "still thinking </th");
  EXPECT_FALSE(r.ended);
  check_streaming("still thinking </th", true);
  check_streaming("answer without end\n\n<｜DSML｜ cal", false);
  EXPECT_EQ(parse_completion("answer\n\n<｜DSML｜ cal", false).content, "answer\n\n<｜DSML｜ cal");
}

TEST(CompletionParse, HoldsBackPossibleMarkers) {
  CompletionParser p(/*thinking=*/true);
  EXPECT_EQ(p.feed("abc</th").reasoning, "abc");
  const CompletionParser::Delta d = p.feed("ink>x\n");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "x");  // "\n" may start the tool-call opener
  EXPECT_EQ(p.feed("y").content, "\ny");
  EXPECT_EQ(p.feed("\xE4\xB8").content, "");  // half of 中
  EXPECT_EQ(p.feed("\xAD").content, "中");
  EXPECT_TRUE(p.feed(kCalls).tool_calls.size() == 2);
  EXPECT_EQ(p.finish().content, "");
  EXPECT_FALSE(p.result().ended);
}

TEST(CompletionParse, PartialMarkerSuffix) {
  EXPECT_EQ(partial_marker_suffix("abc</th", {"</think>"}), 4u);
  EXPECT_EQ(partial_marker_suffix("abc</think>", {"</think>"}), 0u);  // complete: not partial
  EXPECT_EQ(partial_marker_suffix("ab\n", {"\n\n<x", "b\n\n"}), 2u);
  // An empty marker holds nothing back (an empty stop string, say).
  EXPECT_EQ(partial_marker_suffix("abc", {""}), 0u);
  EXPECT_EQ(partial_marker_suffix("abc</th", {"", "</think>"}), 4u);
}

TEST(CompletionParse, ToolCallRoundTripsThroughTheEncoder) {
  // What encode_chat writes for an assistant tool call parses back to the same call.
  ChatMessage user;
  user.content = "q";
  ChatMessage assistant;
  assistant.role = ChatRole::kAssistant;
  assistant.content = "ok";
  assistant.tool_calls.push_back(
      {"", "f", "{\"a\": \"x\", \"b\": [1, {\"c\": null}], \"d\": 1.5}"});
  ChatOptions opt;
  const std::string prompt = encode_chat(std::vector<ChatMessage>{user, assistant}, opt);
  const std::string marker = "<｜Assistant｜></think>";
  const std::string completion = prompt.substr(prompt.find(marker) + marker.size());
  const ParsedCompletion r = parse_completion(completion, false);
  EXPECT_EQ(r.content, "ok");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "f");
  EXPECT_EQ(r.tool_calls[0].arguments, assistant.tool_calls[0].arguments);
  EXPECT_TRUE(r.ended);
}

TEST(CompletionParse, MalformedBlocksThrow) {
  const std::vector<std::string> bad = {
      "x\n\n<｜DSML｜ callsX\n</｜DSML｜ calls>",
      "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke nam=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
      "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" "
      "string=\"maybe\">1</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
      "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n<｜DSML｜ parameter name=\"a\" "
      "string=\"true\">1</｜DSML｜ parameter>\n<｜DSML｜ parameter name=\"a\" "
      "string=\"true\">2</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ calls>",
      "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n</｜DSML｜ invoke>\n</｜DSML｜ "
      "calls>tail",
      "x\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n",  // unterminated
      "done" + kEos + "more",
  };
  for (const std::string& text : bad) {
    EXPECT_THROW(parse_completion(text, false), Error) << text;
  }
}

}  // namespace
}  // namespace deepinfer
