// Response shapes: the fields OpenAI clients read, for completions and chat, streaming and not,
// built from synthetic engine updates.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/openai_response.h"
#include "server/structured_output.h"
#include "server_test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::server {
namespace {

using nlohmann::json;

CallUpdate token(int32_t choice, int32_t id) {
  CallUpdate u;
  u.choice = choice;
  u.token.token = id;
  return u;
}

CallUpdate end(int32_t choice, FinishReason why) {
  CallUpdate u;
  u.choice = choice;
  u.end = true;
  u.finish = why;
  return u;
}

ApiRequest id_request(int32_t n, bool stream) {
  ApiRequest r;
  r.model = "tiny";
  r.prompts = {{1, 2, 3}, {4, 5}};
  r.n = n;
  r.stream = stream;
  r.return_token_ids = true;
  return r;
}

TEST(OpenAiResponse, CompletionBodyNumbersChoicesPromptMajor) {
  const ModelInfo info = test::model_info(nullptr);
  ResponseBuilder b(id_request(2, false), info, "cmpl-x", 123);
  EXPECT_TRUE(b.stream_start().empty());
  for (int32_t c = 0; c < 4; ++c) {
    EXPECT_TRUE(b.on_update(token(c, 100 + c)).empty());
    EXPECT_FALSE(b.all_ended());
    b.on_update(end(c, c == 3 ? FinishReason::Stop : FinishReason::Length));
  }
  ASSERT_TRUE(b.all_ended());
  const json j = json::parse(b.full_body());
  EXPECT_EQ(j["id"], "cmpl-x");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 123);
  EXPECT_EQ(j["model"], "tiny");
  ASSERT_EQ(j["choices"].size(), 4u);
  for (int c = 0; c < 4; ++c) {
    const json& ch = j["choices"][c];
    EXPECT_EQ(ch["index"], c);
    EXPECT_EQ(ch["text"], "");
    EXPECT_EQ(ch["token_ids"], json::array({100 + c}));
    EXPECT_EQ(ch["prompt_token_ids"], c < 2 ? json::array({1, 2, 3}) : json::array({4, 5}));
    EXPECT_EQ(ch["finish_reason"], c == 3 ? "stop" : "length");
    EXPECT_TRUE(ch["logprobs"].is_null());
  }
  // Each prompt counts once, however many choices it has.
  EXPECT_EQ(j["usage"],
            json({{"prompt_tokens", 5}, {"completion_tokens", 4}, {"total_tokens", 9}}));
}

TEST(OpenAiResponse, CompletionStreamChunksAndUsage) {
  const ModelInfo info = test::model_info(nullptr);
  ApiRequest r = id_request(1, true);
  r.prompts.resize(1);
  r.include_usage = true;
  ResponseBuilder b(r, info, "cmpl-y", 1);
  const std::string chunk = b.on_update(token(0, 7));
  ASSERT_FALSE(chunk.empty());
  json c = json::parse(chunk);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["token_ids"], json::array({7}));
  EXPECT_EQ(c["choices"][0]["prompt_token_ids"], json::array({1, 2, 3})) << "first chunk only";
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(c.contains("usage") && c["usage"].is_null());
  c = json::parse(b.on_update(token(0, 8)));
  EXPECT_FALSE(c["choices"][0].contains("prompt_token_ids"));
  c = json::parse(b.on_update(end(0, FinishReason::Length)));
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  const std::string tail = b.stream_end();
  ASSERT_FALSE(tail.empty());
  c = json::parse(tail);
  EXPECT_TRUE(c["choices"].empty());
  EXPECT_EQ(c["usage"]["completion_tokens"], 2);
  EXPECT_EQ(c["usage"]["prompt_tokens"], 3);
}

TEST(OpenAiResponse, ChatStreamOpensWithTheRoleAndReportsToolCalls) {
  DI_REQUIRE_TOKENIZER(tok);
  const ModelInfo info = test::model_info(tok, 4096);
  ApiRequest r;
  r.endpoint = Endpoint::kChat;
  r.model = "tiny";
  r.prompts = {{1}};
  r.stream = true;
  r.chat = {true, false};
  ResponseBuilder b(r, info, "chatcmpl-z", 1);
  const std::string start = b.stream_start();
  ASSERT_FALSE(start.empty());
  json c = json::parse(start);
  EXPECT_EQ(c["object"], "chat.completion.chunk");
  EXPECT_EQ(c["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  const std::string text =
      "Checking.\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n"
      "<｜DSML｜ parameter name=\"x\" string=\"false\">1</｜DSML｜ parameter>\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  std::string content;
  json call;
  for (int32_t id : tok->encode(text, false)) {
    if (const std::string s = b.on_update(token(0, id)); !s.empty()) {
      const json d = json::parse(s)["choices"][0]["delta"];
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls")) call = d["tool_calls"];
    }
  }
  const std::string last = b.on_update(end(0, FinishReason::Stop));
  ASSERT_FALSE(last.empty());
  EXPECT_EQ(json::parse(last)["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(content, "Checking.");
  ASSERT_EQ(call.size(), 1u);
  EXPECT_EQ(call[0]["index"], 0);
  EXPECT_EQ(call[0]["type"], "function");
  EXPECT_EQ(call[0]["function"]["name"], "f");
  EXPECT_EQ(call[0]["function"]["arguments"], "{\"x\": 1}");
  EXPECT_TRUE(b.stream_end().empty()) << "no usage chunk unless asked";
}

TEST(OpenAiResponse, ChatBodyWithReasoningAndLogprobs) {
  DI_REQUIRE_TOKENIZER(tok);
  const ModelInfo info = test::model_info(tok, 4096);
  ApiRequest r;
  r.endpoint = Endpoint::kChat;
  r.model = "tiny";
  r.prompts = {{1, 2}};
  r.chat = {true, true};
  r.logprobs = true;
  r.top_logprobs = 1;
  ResponseBuilder b(r, info, "chatcmpl-w", 1);
  const std::vector<int32_t> ids = tok->encode("Hmm.</think>Hello", false);
  for (int32_t id : ids) {
    CallUpdate u = token(0, id);
    u.token.logprobs = {{id, -0.25f}};
    b.on_update(u);
  }
  b.on_update(end(0, FinishReason::Stop));
  const json j = json::parse(b.full_body());
  EXPECT_EQ(j["object"], "chat.completion");
  const json& m = j["choices"][0]["message"];
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["reasoning_content"], "Hmm.");
  EXPECT_EQ(m["content"], "Hello");
  EXPECT_FALSE(m.contains("tool_calls"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const json& lp = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), ids.size());
  EXPECT_EQ(lp[0]["logprob"], -0.25);
  EXPECT_EQ(lp[0]["top_logprobs"].size(), 1u);
  EXPECT_EQ(lp[0]["token"], std::string(tok->token_bytes(ids[0])));
  EXPECT_EQ(j["usage"]["completion_tokens"], int64_t(ids.size()));
}

TEST(OpenAiResponse, FinishReasonNames) {
  EXPECT_STREQ(api_finish_reason(FinishReason::Stop, false), "stop");
  EXPECT_STREQ(api_finish_reason(FinishReason::Stop, true), "tool_calls");
  EXPECT_STREQ(api_finish_reason(FinishReason::Length, true), "length");
  EXPECT_STREQ(api_finish_reason(FinishReason::Abort, false), "abort");
}

TEST(StructuredOutput, GrammarVocabCoversIdsPastTheTokenCount) {
  // Ids 0..255 are the bytes, then a gap: the added token "zz" has id 300, so the tokenizer
  // counts 257 tokens while its ids reach 300.
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0, shifted = 0; b < 256; ++b) {
    // ByteLevel's byte characters: printable Latin-1 stays, the rest map from U+0100 upward.
    const bool kept = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const int cp = kept ? b : 0x100 + shifted++;
    std::string ch;
    utf8::append(ch, char32_t(cp));
    vocab[ch] = b;
  }
  const nlohmann::json j = {
      {"version", "1.0"},
      {"added_tokens",
       {{{"id", 300}, {"content", "zz"}, {"special", false}, {"normalized", false}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  const auto tok = Tokenizer::from_json(j.dump(), "", "gap.json");
  ASSERT_LT(tok->vocab_size(), 301);
  const auto v = make_grammar_vocab(*tok, 301, 0);
  EXPECT_EQ(v->bytes(300), "zz");
  EXPECT_EQ(v->bytes('a'), "a");
  EXPECT_EQ(v->bytes(299), "");
}

TEST(StructuredOutput, ShapesTravelAsBytes) {
  OutputShape tools;
  tools.kind = OutputShape::Kind::kToolCalls;
  tools.parallel_tool_calls = false;
  tools.after_thinking = true;
  tools.tools = {{"get_weather", R"({"type":"object","properties":{"city":{"type":"string"}}})"},
                 {"noop", ""}};
  OutputShape schema;
  schema.kind = OutputShape::Kind::kJsonSchema;
  schema.schema_json = R"({"type":"integer"})";
  for (const OutputShape& s : {tools, schema, OutputShape{}}) {
    const std::string bytes = encode_output_shape(s);
    const OutputShape back = decode_output_shape(bytes);
    EXPECT_EQ(back.kind, s.kind);
    EXPECT_EQ(back.parallel_tool_calls, s.parallel_tool_calls);
    EXPECT_EQ(back.after_thinking, s.after_thinking);
    EXPECT_EQ(back.schema_json, s.schema_json);
    ASSERT_EQ(back.tools.size(), s.tools.size());
    for (size_t i = 0; i < s.tools.size(); ++i) {
      EXPECT_EQ(back.tools[i].name, s.tools[i].name);
      EXPECT_EQ(back.tools[i].parameters_json, s.tools[i].parameters_json);
    }
    EXPECT_EQ(encode_output_shape(back), bytes);
    // Every cut of the bytes is refused with an error, never read past.
    for (size_t n = 0; n < bytes.size(); ++n)
      EXPECT_THROW(decode_output_shape(std::string_view(bytes).substr(0, n)), Error) << n;
  }
  std::string bad = encode_output_shape(schema);
  bad[0] = 9;
  EXPECT_THROW(decode_output_shape(bad), Error);
  // The same shape from another process compiles to a grammar that accepts the same output.
  GrammarCache& cache = *test::model_info(test::deepseek_tokenizer()).grammars;
  EXPECT_EQ(cache.get(decode_output_shape(encode_output_shape(schema))), cache.get(schema));
}

}  // namespace
}  // namespace deepinfer::server
