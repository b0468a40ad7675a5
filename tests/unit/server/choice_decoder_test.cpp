// The per-choice text pipeline against independent oracles: Tokenizer::decode for the text,
// the offline runner's cut at the stop string, and parse_completion on the whole text for chat
// reasoning / content / tool calls, with tokens arriving one at a time.
#include <gtest/gtest.h>

#include <algorithm>

#include "server/openai_response.h"
#include "server_test_util.h"
#include "util/token_id.h"

namespace deepinfer::server {
namespace {

struct Decoded {
  ChoiceDelta all;
  std::vector<std::string> emitted;  // the text of every delta, in order
  std::vector<int32_t> ids;          // the tokens fed before the stop
  std::string stop_text;
};

// Feeds `ids` one by one, stopping like the engine does: when the decoded output contains a stop
// string (the first in list order), or after the last id.
Decoded drive(const Tokenizer* tok, const std::vector<int32_t>& ids,
              const std::vector<std::string>& stops, ChatMode chat = {}) {
  ChoiceDecoder dec(tok, stops, chat, false, 0);
  Decoded run;
  std::vector<int32_t> out;
  std::string stop_text;
  for (int32_t id : ids) {
    out.push_back(id);
    TokenEvent ev;
    ev.token = id;
    ChoiceDelta d = dec.push(ev);
    run.emitted.push_back(d.content);
    run.all.append(std::move(d));
    const std::string text = tok ? tok->decode(out, true) : "";
    for (const auto& s : stops)
      if (text.find(s) != std::string::npos) {
        stop_text = s;
        break;
      }
    if (!stop_text.empty()) break;
  }
  ChoiceDelta d = dec.finish(stop_text);
  run.emitted.push_back(d.content);
  run.all.append(std::move(d));
  EXPECT_EQ(dec.num_tokens(), int64_t(out.size()));
  EXPECT_EQ(run.all.token_ids, out) << "every token is reported exactly once";
  run.ids = out;
  run.stop_text = stop_text;
  return run;
}

TEST(ChoiceDecoder, WithoutTokenizerIdsPassStraightThrough) {
  ChoiceDecoder dec(nullptr, {}, {}, false, 0);
  for (int32_t id : {10, 20, 30}) {
    TokenEvent ev;
    ev.token = id;
    const ChoiceDelta d = dec.push(ev);
    EXPECT_EQ(d.token_ids, std::vector<int32_t>{id});
    EXPECT_TRUE(d.content.empty());
  }
  EXPECT_TRUE(dec.finish("").token_ids.empty());
}

TEST(ChoiceDecoder, TextIsTheDecodeOfAllTokens) {
  DI_REQUIRE_TOKENIZER(tok);
  const std::string text = "Grüße, 世界! 😀👩‍👩‍👧 end\n\ttabs";
  const std::vector<int32_t> ids = tok->encode(text, false);
  const Decoded r = drive(tok, ids, {});
  EXPECT_EQ(r.all.content, tok->decode(ids, true));
  EXPECT_EQ(r.all.content, text);
}

TEST(ChoiceDecoder, StopStringsCutTextAndNothingPastThemIsSent) {
  DI_REQUIRE_TOKENIZER(tok);
  const std::string text = "The quick brown fox jumps over the lazy dog";
  const std::vector<int32_t> ids = tok->encode(text, false);
  for (const std::vector<std::string>& stops :
       std::vector<std::vector<std::string>>{{"fox j"}, {"ver t", "brown"}, {"o"}, {"dog"}}) {
    // {"ver t", "brown"}: "brown" comes first in the text, so it ends the request.
    const Decoded r = drive(tok, ids, stops);
    // The offline runner's rule: decode everything, cut at the stop string that ended it.
    const std::string full = tok->decode(r.ids, true);
    ASSERT_FALSE(r.stop_text.empty());
    const std::string expected = full.substr(0, full.find(r.stop_text));
    EXPECT_EQ(r.all.content, expected) << stops[0];
    for (const auto& s : stops) EXPECT_EQ(r.all.content.find(s), std::string::npos) << s;
    std::string sent;
    for (const auto& piece : r.emitted) {
      sent += piece;
      EXPECT_EQ(expected.compare(0, sent.size(), sent), 0) << "sent text past the cut: " << sent;
    }
  }
}

TEST(ChoiceDecoder, HeldBackPrefixIsReleasedWhenNoStopComes) {
  DI_REQUIRE_TOKENIZER(tok);
  const std::string text = "It ends with a dog";
  const std::vector<int32_t> ids = tok->encode(text, false);
  ChoiceDecoder dec(tok, {"dog!"}, {}, false, 0);
  std::string sent;
  for (int32_t id : ids) {
    TokenEvent ev;
    ev.token = id;
    sent += dec.push(ev).content;
  }
  EXPECT_EQ(sent.find("dog"), std::string::npos) << "a possible stop-string start is held";
  sent += dec.finish("").content;  // ended by length: all of it goes out
  EXPECT_EQ(sent, text);
}

TEST(ChoiceDecoder, ChatSplitsReasoningContentAndToolCallsLikeTheParser) {
  DI_REQUIRE_TOKENIZER(tok);
  const std::string calls =
      "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n"
      "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
      "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  const std::string text = "The user wants weather.</think>Let me check." + calls;
  const std::vector<int32_t> ids = tok->encode(text, false);
  const ParsedCompletion want = parse_completion(text, true);
  ASSERT_EQ(want.tool_calls.size(), 1u);
  const Decoded r = drive(tok, ids, {}, ChatMode{true, true});
  EXPECT_EQ(r.all.reasoning, want.reasoning);
  EXPECT_EQ(r.all.content, want.content);
  ASSERT_EQ(r.all.tool_calls.size(), 1u);
  EXPECT_EQ(r.all.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.all.tool_calls[0].arguments, want.tool_calls[0].arguments);
  EXPECT_EQ(r.all.tool_calls[0].arguments, R"({"city": "Paris", "days": 3})");
  EXPECT_EQ(r.all.tool_calls[0].id.rfind("call_", 0), 0u);

  // Without thinking everything before the block is content.
  const Decoded plain = drive(tok, tok->encode("Sure." + calls, false), {}, ChatMode{true, false});
  EXPECT_EQ(plain.all.content, "Sure.");
  EXPECT_TRUE(plain.all.reasoning.empty());
  EXPECT_EQ(plain.all.tool_calls.size(), 1u);
}

// With the markers as special tokens (skipped from visible text), the parser still sees them:
// reasoning, content and every tool call come out as with plain-text markers, and the offline
// decode for the parser (Tokenizer::decode keeping chat_marker_tokens) gives the same parse.
TEST(ChoiceDecoder, MarkersThatAreSpecialTokensStillReachTheParser) {
  DI_REQUIRE_TOKENIZER(plain);
  const Tokenizer* tok = test::marker_special_tokenizer();
  ASSERT_NE(tok, nullptr);
  const std::string calls =
      "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n"
      "<｜DSML｜ parameter name=\"x\" string=\"false\">[1, 2]</｜DSML｜ parameter>\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  const std::string text = "Thinking hard.</think>The answer." + calls;
  const std::vector<int32_t> ids = tok->encode(text, false);
  // The markers really are special tokens of this tokenizer, and vanish from a skipping decode.
  for (const char* m : {"</think>", "｜DSML｜"}) {
    const int32_t id = token_id(*tok, m);
    ASSERT_GE(id, 0) << m;
    EXPECT_TRUE(tok->is_special(id)) << m;
    EXPECT_NE(std::find(ids.begin(), ids.end(), id), ids.end()) << m;
  }
  EXPECT_EQ(tok->decode(ids, true).find("</think>"), std::string::npos);
  const std::vector<int32_t> keep = chat_marker_tokens(*tok);
  EXPECT_EQ(tok->decode(ids, true, keep), text);
  EXPECT_TRUE(chat_marker_tokens(*plain).size() <= 1u);  // only end-of-sentence there

  const ParsedCompletion want = parse_completion(text, true);
  ASSERT_EQ(want.tool_calls.size(), 1u);
  const Decoded r = drive(tok, ids, {}, ChatMode{true, true});
  EXPECT_EQ(r.all.reasoning, "Thinking hard.");
  EXPECT_EQ(r.all.content, "The answer.");
  ASSERT_EQ(r.all.tool_calls.size(), 1u);
  EXPECT_EQ(r.all.tool_calls[0].name, "f");
  EXPECT_EQ(r.all.tool_calls[0].arguments, want.tool_calls[0].arguments);
  EXPECT_EQ(r.all.tool_calls[0].arguments, R"({"x": [1, 2]})");
  // Other special tokens stay out of the visible text in chat mode.
  const int32_t bos = token_id(*tok, "<｜begin▁of▁sentence｜>");
  ASSERT_TRUE(bos >= 0 && tok->is_special(bos));
  std::vector<int32_t> with_bos = tok->encode("a", false);
  with_bos.push_back(bos);
  const Decoded u = drive(tok, with_bos, {}, ChatMode{true, false});
  EXPECT_EQ(u.all.content, "a");
}

// What the renderer writes for an assistant turn parses back to the same reasoning, content and
// tool calls, streamed token by token, with the markers as plain text or as special tokens.
TEST(ChoiceDecoder, ParserRoundTripsTheRenderedAssistantTurn) {
  DI_REQUIRE_TOKENIZER(plain);
  const Tokenizer* special = test::marker_special_tokenizer();
  ASSERT_NE(special, nullptr);
  std::vector<ChatMessage> m(2);
  m[0].role = ChatRole::kUser;
  m[0].content = "Weather in Paris and Oslo?";
  m[1].role = ChatRole::kAssistant;
  m[1].reasoning_content = "Two cities, so two calls.\nBoth need the weather tool.";
  m[1].content = "Checking both — один момент.";
  m[1].tool_calls = {
      {"a", "get_weather", R"({"city": "Paris", "days": 3})"},
      {"b", "get_weather", R"({"city": "Oslo", "opts": {"unit": "C", "n": [1, 2]}})"}};
  ChatOptions o;
  o.thinking = true;
  o.tools_json = R"([{"type": "function", "function": {"name": "get_weather"}}])";
  const std::string prompt = encode_chat(m, o);
  const std::string head = "<｜Assistant｜><think>";
  const size_t at = prompt.rfind(head);
  ASSERT_NE(at, std::string::npos) << prompt;
  const std::string completion = prompt.substr(at + head.size());
  for (const Tokenizer* tok : {plain, special}) {
    const Decoded r = drive(tok, tok->encode(completion, false), {}, ChatMode{true, true});
    EXPECT_EQ(r.all.reasoning, m[1].reasoning_content);
    EXPECT_EQ(r.all.content, m[1].content);
    ASSERT_EQ(r.all.tool_calls.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(r.all.tool_calls[i].name, m[1].tool_calls[i].name);
      EXPECT_EQ(r.all.tool_calls[i].arguments, m[1].tool_calls[i].arguments);
    }
  }
}

TEST(ChoiceDecoder, MalformedToolCallBlockBecomesContent) {
  DI_REQUIRE_TOKENIZER(tok);
  const std::string text = "Answer.\n\n<｜DSML｜ calls>\nnot a call at all";
  const Decoded r = drive(tok, tok->encode(text, false), {}, ChatMode{true, false});
  EXPECT_EQ(r.all.content, text);
  EXPECT_TRUE(r.all.tool_calls.empty());
}

TEST(ChoiceDecoder, LogprobsOfTheSampledTokenAndTopAlternatives) {
  ChoiceDecoder dec(nullptr, {}, {}, true, 1);
  TokenEvent ev;
  ev.token = 6;
  ev.logprobs = {{5, -0.5f}, {6, -1.5f}, {7, -3.0f}};
  ChoiceDelta d = dec.push(ev);
  ASSERT_EQ(d.logprobs.size(), 1u);
  EXPECT_EQ(d.logprobs[0].token, 6);
  EXPECT_FLOAT_EQ(d.logprobs[0].logprob, -1.5f);
  ASSERT_EQ(d.logprobs[0].top.size(), 1u);
  EXPECT_EQ(d.logprobs[0].top[0].first, 5);
  // The engine appends the sampled token when it is not among the top alternatives: its true
  // logprob is reported, never a placeholder.
  ev.token = 9;
  ev.logprobs = {{5, -0.5f}, {6, -1.5f}, {7, -3.0f}, {9, -7.25f}};
  d = dec.push(ev);
  EXPECT_FLOAT_EQ(d.logprobs[0].logprob, -7.25f);
  ASSERT_EQ(d.logprobs[0].top.size(), 1u);
  EXPECT_EQ(d.logprobs[0].top[0].first, 5);
}

}  // namespace
}  // namespace deepinfer::server
