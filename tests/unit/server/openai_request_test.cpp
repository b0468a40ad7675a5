// Request bodies -> engine requests: field mapping, defaults, the context-length rule, chat
// encoding (compared with encode_chat on the equivalent messages), and one refusal per kind of bad
// input with its status, param and code.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/api_request.h"
#include "server_test_util.h"
#include "tokenizer/chat.h"
#include "util/base64.h"
#include "util/grammar_matches.h"

namespace deepinfer::server {
namespace {

using test::model_info;

ApiError refusal(Endpoint ep, const std::string& body, const ModelInfo& info) {
  try {
    parse_api_request(ep, body, info);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "");
}

void expect_refusal(Endpoint ep, const std::string& body, const ModelInfo& info, int status,
                    const std::string& param, const std::string& code) {
  const ApiError e = refusal(ep, body, info);
  EXPECT_EQ(e.status, status) << body << ": " << e.what();
  EXPECT_EQ(e.param, param) << body << ": " << e.what();
  EXPECT_EQ(e.code, code) << body << ": " << e.what();
}

constexpr Endpoint kCmpl = Endpoint::kCompletions;
constexpr Endpoint kChat = Endpoint::kChat;

TEST(OpenAiRequest, CompletionDefaultsAndIds) {
  const ModelInfo info = model_info(nullptr);
  const ApiRequest r = parse_api_request(kCmpl, R"({"prompt": [5, 6, 7]})", info);
  EXPECT_EQ(r.model, "tiny");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0], (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(r.params.max_tokens, 16);
  EXPECT_EQ(r.params.temperature, 1.0f);
  EXPECT_FALSE(r.params.seed.has_value());
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.return_token_ids) << "without a tokenizer ids are the only output";
  EXPECT_FALSE(r.chat.enabled);
}

TEST(OpenAiRequest, CompletionFieldsMapToSamplingParams) {
  const ModelInfo info = model_info(nullptr);
  const ApiRequest r = parse_api_request(kCmpl, R"({
      "model": "/models/tiny", "prompt": [[1, 2], [3]], "max_tokens": 9, "temperature": 0.5,
      "top_p": 0.9, "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5,
      "frequency_penalty": -0.5, "repetition_penalty": 1.1, "seed": 42, "n": 3,
      "stream": true, "stream_options": {"include_usage": true}, "logprobs": 2,
      "ignore_eos": true, "stop_token_ids": [7, 8], "user": "someone"})",
                                         info);
  EXPECT_EQ(r.model, "tiny") << "an accepted alias is reported as the served name";
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[1], std::vector<int32_t>{3});
  const SamplingParams& p = r.params;
  EXPECT_EQ(p.max_tokens, 9);
  EXPECT_FLOAT_EQ(p.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_FLOAT_EQ(p.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_EQ(p.seed, 42u);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_GE(p.logprobs, 20) << "the sampled token is looked up among the engine's top 20";
}

TEST(OpenAiRequest, TextPromptsUseTheTokenizerWithoutBos) {
  DI_REQUIRE_TOKENIZER(tok);
  const ModelInfo info = model_info(tok);
  const ApiRequest r =
      parse_api_request(kCmpl, R"({"prompt": ["Hello world", "Bonjour"], "top_k": -1})", info);
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(r.prompts[0], tok->encode("Hello world", false));
  EXPECT_EQ(r.prompts[1], tok->encode("Bonjour", false));
  EXPECT_EQ(r.params.top_k, 0) << "-1 turns top-k off";
  EXPECT_FALSE(r.return_token_ids);
}

TEST(OpenAiRequest, MaxTokensAgainstTheContext) {
  const ModelInfo info = model_info(nullptr, 64);
  // The default of 16 shrinks to what the context leaves.
  std::string ids60 = "[";
  for (int i = 0; i < 60; ++i) ids60 += std::to_string(i + 1) + (i < 59 ? "," : "]");
  EXPECT_EQ(parse_api_request(kCmpl, R"({"prompt": )" + ids60 + "}", info).params.max_tokens, 4);
  EXPECT_EQ(parse_api_request(kCmpl, R"({"prompt": )" + ids60 + R"(, "max_tokens": 4})", info)
                .params.max_tokens,
            4);
  expect_refusal(kCmpl, R"({"prompt": )" + ids60 + R"(, "max_tokens": 5})", info, 400, "max_tokens",
                 "context_length_exceeded");
  std::string ids64 = "[";
  for (int i = 0; i < 64; ++i) ids64 += std::to_string(i + 1) + (i < 63 ? "," : "]");
  expect_refusal(kCmpl, R"({"prompt": )" + ids64 + "}", info, 400, "prompt",
                 "context_length_exceeded");
}

TEST(OpenAiRequest, RefusalsNameTheFieldAndReason) {
  const ModelInfo info = model_info(nullptr);
  expect_refusal(kCmpl, "{\"prompt\": [1, 2]", info, 400, "", "invalid_json");
  expect_refusal(kCmpl, "[1, 2]", info, 400, "", "invalid_json");
  expect_refusal(kCmpl, "", info, 400, "", "invalid_json");
  expect_refusal(kCmpl, R"({"prompt": [1], "model": "gpt-4"})", info, 404, "model",
                 "model_not_found");
  expect_refusal(kCmpl, R"({"prompt": [1], "model": 7})", info, 400, "model", "invalid_type");
  expect_refusal(kCmpl, R"({})", info, 400, "prompt", "missing");
  expect_refusal(kCmpl, R"({"prompt": 5})", info, 400, "prompt", "invalid_type");
  expect_refusal(kCmpl, R"({"prompt": []})", info, 400, "prompt", "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [[]]})", info, 400, "prompt", "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1, 129280]})", info, 400, "prompt[1]", "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1, -1]})", info, 400, "prompt[1]", "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1, 2.5]})", info, 400, "prompt[1]", "invalid_type");
  expect_refusal(kCmpl, R"({"prompt": [[1], "a"]})", info, 400, "prompt[1]", "invalid_type");
  expect_refusal(kCmpl, R"({"prompt": "text"})", info, 400, "prompt", "no_tokenizer");
  expect_refusal(kCmpl, R"({"prompt": [1], "max_tokens": "9"})", info, 400, "max_tokens",
                 "invalid_type");
  expect_refusal(kCmpl, R"({"prompt": [1], "max_tokens": 1.5})", info, 400, "max_tokens",
                 "invalid_type");
  expect_refusal(kCmpl, R"({"prompt": [1], "max_tokens": 0})", info, 400, "max_tokens",
                 "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1], "max_tokens": 18446744073709551615})", info, 400,
                 "max_tokens", "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1], "temperature": "hot"})", info, 400, "temperature",
                 "invalid_type");
  expect_refusal(kCmpl, R"({"prompt": [1], "temperature": -1})", info, 400, "temperature",
                 "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1], "top_p": 0})", info, 400, "top_p", "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1], "min_p": 2})", info, 400, "min_p", "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1], "presence_penalty": 3})", info, 400, "presence_penalty",
                 "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1], "repetition_penalty": 0})", info, 400,
                 "repetition_penalty", "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1], "n": 0})", info, 400, "n", "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1], "stream": "yes"})", info, 400, "stream", "invalid_type");
  expect_refusal(kCmpl, R"({"prompt": [1], "stream_options": {"include_usage": true}})", info, 400,
                 "stream_options", "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1], "stop": "x"})", info, 400, "stop", "no_tokenizer");
  expect_refusal(kCmpl, R"({"prompt": [1], "stop_token_ids": [1e3]})", info, 400,
                 "stop_token_ids[0]", "invalid_type");
  expect_refusal(kCmpl, R"({"prompt": [1], "logprobs": 21})", info, 400, "logprobs",
                 "invalid_value");
  expect_refusal(kCmpl, R"({"prompt": [1], "echo": true})", info, 400, "echo", "unsupported_value");
  expect_refusal(kCmpl, R"({"prompt": [1], "best_of": 2})", info, 400, "best_of",
                 "unsupported_value");
  expect_refusal(kCmpl, R"({"prompt": [1], "logit_bias": {"5": 1}})", info, 400, "logit_bias",
                 "unsupported_value");
  expect_refusal(kCmpl, R"({"prompt": [[1],[2],[3]], "n": 100})", info, 400, "prompt",
                 "invalid_value");
  expect_refusal(kChat, R"({"messages": [{"role": "user", "content": "hi"}]})", info, 400,
                 "messages", "no_tokenizer");
}

TEST(OpenAiRequest, DeepNestingIsRefusedBeforeParsing) {
  const ModelInfo info = model_info(nullptr);
  const std::string deep =
      "{\"prompt\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_refusal(kCmpl, deep, info, 400, "", "invalid_json");
  EXPECT_EQ(json_nesting_depth(R"({"a": "[[[[{{{", "b": [[1]]})"), 3);
  EXPECT_EQ(json_nesting_depth(R"("\"[[")"), 0);
}

TEST(OpenAiRequest, ErrorBodyHasOpenAiShape) {
  const nlohmann::json j =
      nlohmann::json::parse(error_body(ApiError(404, "no such model", "model", "model_not_found")));
  EXPECT_EQ(j["error"]["message"], "no such model");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "model");
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  const nlohmann::json k = nlohmann::json::parse(error_body(ApiError(500, "boom")));
  EXPECT_EQ(k["error"]["type"], "server_error");
  EXPECT_TRUE(k["error"]["param"].is_null());
  EXPECT_TRUE(k["error"]["code"].is_null());
  EXPECT_EQ(ApiError(401, "x").type, "authentication_error");
}

// --- chat ---

ChatMessage msg(ChatRole role, std::string content) {
  ChatMessage m;
  m.role = role;
  m.content = std::move(content);
  return m;
}

std::vector<int32_t> expected_chat_ids(const Tokenizer* tok, const std::vector<ChatMessage>& m,
                                       const ChatOptions& o) {
  return tok->encode(encode_chat(m, o), false);
}

TEST(OpenAiRequest, ChatMessagesEncodeLikeTheChatFormat) {
  DI_REQUIRE_TOKENIZER(tok);
  const ModelInfo info = model_info(tok, 4096);
  const ApiRequest r = parse_api_request(kChat, R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                   {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": "Hello!"},
      {"role": "user", "content": "What is 2+2?", "name": "ann"}],
      "max_completion_tokens": 7})",
                                         info);
  std::vector<ChatMessage> m = {
      msg(ChatRole::kSystem, "Be brief."), msg(ChatRole::kUser, "Hi\n\nthere"),
      msg(ChatRole::kAssistant, "Hello!"), msg(ChatRole::kUser, "What is 2+2?")};
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0], expected_chat_ids(tok, m, ChatOptions{}));
  EXPECT_TRUE(r.chat.enabled);
  EXPECT_FALSE(r.chat.thinking);
  EXPECT_EQ(r.params.max_tokens, 7);
}

// A 5x3 PNG (fuzz/seeds/image/rgb.png) as a data URL.
std::string png_url() {
  const std::string path = std::string(DEEPINFER_SOURCE_DIR) + "/fuzz/seeds/image/rgb.png";
  const std::string bytes = vision::image_source_bytes(path, "test", true);
  return "data:image/png;base64," + ::deepinfer::test::base64(bytes);
}

TEST(OpenAiRequest, ChatImagePartsBecomeImageTokens) {
  DI_REQUIRE_TOKENIZER(tok);
  ModelInfo info = model_info(tok, 4096);
  info.vision = {14, 3, 64, 56 * 56, 0.0};
  info.image_token_id = 129278;
  const std::string url = png_url();
  const ApiRequest r = parse_api_request(kChat,
                                         R"({"messages": [{"role": "user", "content": [
      {"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": ")" +
                                             url + R"("}},
      {"type": "text", "text": "What is it?"}]}]})",
                                         info);
  ASSERT_EQ(r.images.size(), 1u);
  const vision::ImagePatches want = vision::preprocess(
      vision::decode_image(vision::image_source_bytes(url, "x", false), "x"), info.vision);
  EXPECT_EQ(r.images[0].patches, want.patches);
  EXPECT_EQ(r.images[0].vit_h, want.plan.vit_h);
  // One image token where the part was; the text around it as the chat format writes it.
  const std::vector<int32_t>& ids = r.prompts[0];
  ASSERT_EQ(std::count(ids.begin(), ids.end(), info.image_token_id), 1);
  const auto at = std::find(ids.begin(), ids.end(), info.image_token_id);
  std::vector<int32_t> text(ids.begin(), at);
  EXPECT_TRUE(tok->decode(text).ends_with("Look:"));
  text.insert(text.end(), at + 1, ids.end());
  const std::vector<ChatMessage> plain = {msg(ChatRole::kUser, "Look:\n\nWhat is it?")};
  EXPECT_EQ(tok->decode(text), encode_chat(plain, ChatOptions{}));
  // Bad images, and images where they cannot go, are refusals naming the part.
  const auto body = [](const std::string& role, const std::string& u) {
    return R"({"messages": [{"role": ")" + role +
           R"(", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": ")" +
           u + R"("}}]}]})";
  };
  expect_refusal(kChat, body("user", "https://example.com/a.png"), info, 400,
                 "messages[0].content[1].image_url.url", "invalid_image");
  expect_refusal(kChat, body("user", "data:image/png;base64,AAAA"), info, 400,
                 "messages[0].content[1].image_url.url", "invalid_image");
  expect_refusal(kChat, body("user", "/etc/passwd"), info, 400,
                 "messages[0].content[1].image_url.url", "invalid_image");
  expect_refusal(kChat, body("assistant", url), info, 400, "messages[0].content[1].type",
                 "unsupported_value");
  info.vision.max_tokens = 0;  // no tower
  expect_refusal(kChat, body("user", url), info, 400, "messages[0].content[1].type",
                 "unsupported_value");
}

TEST(OpenAiRequest, ChatDefaultsToTheRestOfTheContext) {
  DI_REQUIRE_TOKENIZER(tok);
  const ModelInfo info = model_info(tok, 4096);
  const ApiRequest r =
      parse_api_request(kChat, R"({"messages": [{"role": "user", "content": "Hi"}]})", info);
  EXPECT_EQ(r.params.max_tokens, 4096 - int64_t(r.prompts[0].size()));
}

TEST(OpenAiRequest, ThinkingSwitchAndEffort) {
  DI_REQUIRE_TOKENIZER(tok);
  const ModelInfo info = model_info(tok, 4096);
  const std::vector<ChatMessage> m = {msg(ChatRole::kUser, "Hi")};
  const std::string msgs = R"("messages": [{"role": "user", "content": "Hi"}])";
  struct Case {
    std::string extra;
    bool thinking;
    int effort;
  };
  for (const Case& c :
       std::vector<Case>{{R"("thinking": true)", true, 0},
                         {R"("thinking": {"type": "enabled"})", true, 0},
                         {R"("thinking": {"type": "disabled"})", false, 0},
                         {R"("chat_template_kwargs": {"thinking": true})", true, 0},
                         {R"("reasoning_effort": "max")", true, 100},
                         {R"("reasoning_effort": "medium")", true, 75},
                         {R"("reasoning_effort": "xhigh")", true, 75},
                         {R"("reasoning_effort": 30, "thinking": false)", false, 30},
                         {R"("reasoning_effort": "low", "thinking": true)", true, 50},
                         {R"("reasoning_effort": "none")", false, 0},
                         {R"("chat_template_kwargs": {"reasoning_effort": "none"})", false, 0}}) {
    const ApiRequest r = parse_api_request(kChat, "{" + msgs + ", " + c.extra + "}", info);
    ChatOptions o;
    o.thinking = c.thinking;
    o.reasoning_effort = c.effort;
    EXPECT_EQ(r.prompts[0], expected_chat_ids(tok, m, o)) << c.extra;
    EXPECT_EQ(r.chat.thinking, c.thinking) << c.extra;
  }
  expect_refusal(kChat, "{" + msgs + R"(, "reasoning_effort": "extreme"})", info, 400,
                 "reasoning_effort", "invalid_value");
  expect_refusal(kChat, "{" + msgs + R"(, "reasoning_effort": 101})", info, 400, "reasoning_effort",
                 "invalid_value");
  expect_refusal(kChat, "{" + msgs + R"(, "thinking": {"type": "on"}})", info, 400, "thinking.type",
                 "invalid_value");
  expect_refusal(kChat, "{" + msgs + R"(, "thinking": true, "reasoning_effort": "none"})", info,
                 400, "reasoning_effort", "invalid_value");
}

// chat_template_kwargs.drop_thinking: false keeps the reasoning of earlier turns.
TEST(OpenAiRequest, DropThinkingCanBeTurnedOff) {
  DI_REQUIRE_TOKENIZER(tok);
  const ModelInfo info = model_info(tok, 4096);
  const std::string msgs = R"("messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": "b", "reasoning_content": "thought one"},
      {"role": "user", "content": "c"}], "thinking": true)";
  std::vector<ChatMessage> m = {msg(ChatRole::kUser, "a"), msg(ChatRole::kAssistant, "b"),
                                msg(ChatRole::kUser, "c")};
  m[1].reasoning_content = "thought one";
  ChatOptions o;
  o.thinking = true;
  const ApiRequest dropped = parse_api_request(kChat, "{" + msgs + "}", info);
  EXPECT_EQ(dropped.prompts[0], expected_chat_ids(tok, m, o));
  EXPECT_EQ(tok->decode(dropped.prompts[0]).find("thought one"), std::string::npos);
  o.drop_thinking = false;
  const ApiRequest kept = parse_api_request(
      kChat, "{" + msgs + R"(, "chat_template_kwargs": {"drop_thinking": false}})", info);
  EXPECT_EQ(kept.prompts[0], expected_chat_ids(tok, m, o));
  EXPECT_NE(tok->decode(kept.prompts[0]).find("thought one"), std::string::npos);
}

// response_format: the schema goes into the system message under "## Response Format:" (an empty
// system message is added when there is none), json_object renders the format object itself;
// integers of any size keep every digit, in schemas and in tool-call arguments.
TEST(OpenAiRequest, ResponseFormatAndBigNumbersRenderLikeTheEncoder) {
  DI_REQUIRE_TOKENIZER(tok);
  const ModelInfo info = model_info(tok, 4096);
  const ApiRequest r = parse_api_request(kChat, R"({"messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema":
        {"type": "object", "properties": {"id": {"type": "integer",
         "maximum": 123456789012345678901234567890}, "p": {"type": "number", "minimum": 1e3}}}}}})",
                                         info);
  const std::string text = tok->decode(r.prompts[0]);
  EXPECT_NE(text.find("<｜System｜>\n\n## Response Format:\n\nYou MUST strictly adhere to the "
                      "following schema to reply:\n{\"type\": \"object\", \"properties\": "
                      "{\"id\": {\"type\": \"integer\", \"maximum\": "
                      "123456789012345678901234567890}, \"p\": {\"type\": \"number\", "
                      "\"minimum\": 1000.0}}}<｜User｜>x"),
            std::string::npos)
      << text;
  const ApiRequest obj = parse_api_request(
      kChat,
      R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "x"}],
          "response_format": {"type": "json_object"}})",
      info);
  EXPECT_NE(tok->decode(obj.prompts[0])
                .find("S\n\n## Response Format:\n\nYou MUST strictly adhere to the following "
                      "schema to reply:\n{\"type\": \"json_object\"}<｜User｜>x"),
            std::string::npos)
      << tok->decode(obj.prompts[0]);
  // A tool call's arguments given as an object, with a 25-digit integer.
  const ApiRequest call = parse_api_request(kChat, R"({"messages": [
      {"role": "user", "content": "x"},
      {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f",
        "arguments": {"n": 1234567890123456789012345, "s": "t"}}}]},
      {"role": "user", "content": "y"}]})",
                                            info);
  EXPECT_NE(
      tok->decode(call.prompts[0]).find("name=\"n\" string=\"false\">1234567890123456789012345<"),
      std::string::npos)
      << tok->decode(call.prompts[0]);
  expect_refusal(kChat,
                 R"({"messages": [{"role": "user", "content": "x"}],
                     "response_format": {"type": "json_schema", "json_schema": {"name": "n"}}})",
                 info, 400, "response_format.json_schema.schema", "missing");
  expect_refusal(kChat,
                 R"({"messages": [{"role": "user", "content": "x"}],
                     "response_format": {"type": "grammar"}})",
                 info, 400, "response_format.type", "invalid_value");
  // The format is enforced: a grammar of the schema, after the reasoning in thinking mode.
  ASSERT_TRUE(r.params.grammar);
  EXPECT_TRUE(matches(r.params.grammar, R"({"id": 5, "p": 1000.5})"));
  EXPECT_FALSE(matches(r.params.grammar, R"({"id": 5, "p": 999})"));
  ASSERT_TRUE(obj.params.grammar);
  EXPECT_TRUE(matches(obj.params.grammar, R"({"a": [1, "b"]})"));
  const ApiRequest think = parse_api_request(kChat, R"({"messages": [{"role": "user", "content":
      "x"}], "thinking": true, "response_format": {"type": "json_object"}})",
                                             info);
  EXPECT_TRUE(matches(think.params.grammar, "Let me see.</think>{}"));
  EXPECT_FALSE(matches(think.params.grammar, "{}"));
  // Its source compiles to the same grammar elsewhere (another data-parallel replica).
  EXPECT_EQ(info.grammars->get(decode_output_shape(think.params.grammar_source)),
            think.params.grammar);
  EXPECT_TRUE(decode_output_shape(think.params.grammar_source).after_thinking);
  const ApiRequest comp =
      parse_api_request(Endpoint::kCompletions,
                        R"({"prompt": "x", "response_format": {"type": "json_object"}})", info);
  EXPECT_TRUE(comp.params.grammar && matches(comp.params.grammar, "{}"));
  expect_refusal(kChat,
                 R"({"messages": [{"role": "user", "content": "x"}],
                     "response_format": {"type": "json_schema", "json_schema": {"name": "n",
                       "schema": {"type": "string", "pattern": "^a+$"}}}})",
                 info, 400, "response_format.json_schema.schema", "unsupported_schema");
  // A schema no value satisfies is refused, not run (a matcher had no state to start from).
  expect_refusal(kChat,
                 R"({"messages": [{"role": "user", "content": "x"}],
                     "response_format": {"type": "json_schema", "json_schema": {"name": "n",
                       "schema": false}}})",
                 info, 400, "response_format.json_schema.schema", "unsupported_schema");
  // Without a tokenizer there is no vocabulary to constrain.
  expect_refusal(Endpoint::kCompletions,
                 R"({"prompt": [1, 2], "response_format": {"type": "json_object"}})",
                 model_info(nullptr), 400, "response_format", "no_tokenizer");
}

TEST(OpenAiRequest, ToolsAndToolResultsEncodeLikeTheChatFormat) {
  DI_REQUIRE_TOKENIZER(tok);
  const ModelInfo info = model_info(tok, 4096);
  // Key order of the schema is kept ("type" before "properties"), as the model expects.
  const std::string tools =
      R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather now",)"
      R"( "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])";
  const ApiRequest r = parse_api_request(kChat, R"({"tools": )" + tools + R"(, "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"}]})",
                                         info);
  std::vector<ChatMessage> m(3);
  m[0] = msg(ChatRole::kUser, "Weather in Paris?");
  m[1].role = ChatRole::kAssistant;
  m[1].tool_calls = {{"call_1", "get_weather", R"({"city": "Paris"})"}};
  m[2].role = ChatRole::kTool;
  m[2].content = "18C, sunny";
  m[2].tool_call_id = "call_1";
  ChatOptions o;
  o.tools_json = tools;
  EXPECT_EQ(r.prompts[0], expected_chat_ids(tok, m, o));
  const std::string text = tok->decode(r.prompts[0], false);
  EXPECT_NE(text.find("get_weather"), std::string::npos);
  EXPECT_NE(text.find("<tool_result>18C, sunny</tool_result>"), std::string::npos) << text;

  // tool_choice "none" keeps the tools out of the prompt.
  const ApiRequest none =
      parse_api_request(kChat,
                        R"({"tool_choice": "none", "tools": )" + tools +
                            R"(, "messages": [{"role": "user", "content": "Hi"}]})",
                        info);
  EXPECT_EQ(none.prompts[0], expected_chat_ids(tok, {msg(ChatRole::kUser, "Hi")}, ChatOptions{}));
  // tool_choice "required" or a named function constrains the output to a call.
  const ApiRequest req =
      parse_api_request(kChat,
                        R"({"tool_choice": "required", "tools": )" + tools +
                            R"(, "messages": [{"role": "user", "content": "Hi"}]})",
                        info);
  ASSERT_TRUE(req.params.grammar);
  EXPECT_TRUE(matches(
      req.params.grammar,
      "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"get_weather\">\n<｜DSML｜ parameter "
      "name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n</｜DSML｜ invoke>\n</｜DSML｜ "
      "calls>"));
  EXPECT_FALSE(matches(req.params.grammar, "Sure!"));
  const ApiRequest named = parse_api_request(
      kChat,
      R"({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "tools": )" +
          tools + R"(, "messages": [{"role": "user", "content": "Hi"}]})",
      info);
  EXPECT_TRUE(named.params.grammar);
  expect_refusal(
      kChat,
      R"({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": )" + tools +
          R"(, "messages": [{"role": "user", "content": "Hi"}]})",
      info, 400, "tool_choice.function.name", "invalid_value");
  expect_refusal(kChat,
                 R"({"tool_choice": "required", "messages": [{"role": "user", "content": "Hi"}]})",
                 info, 400, "tool_choice", "invalid_value");
  expect_refusal(kChat,
                 R"({"tool_choice": "sometimes", "tools": )" + tools +
                     R"(, "messages": [{"role": "user", "content": "Hi"}]})",
                 info, 400, "tool_choice", "invalid_value");
  expect_refusal(
      kChat,
      R"({"tools": [{"type": "function"}], "messages": [{"role": "user", "content": "Hi"}]})", info,
      400, "tools[0].function", "missing");
  expect_refusal(kChat, R"({"tools": {}, "messages": [{"role": "user", "content": "Hi"}]})", info,
                 400, "tools", "invalid_type");
}

TEST(OpenAiRequest, ChatRefusals) {
  DI_REQUIRE_TOKENIZER(tok);
  const ModelInfo info = model_info(tok, 4096);
  expect_refusal(kChat, R"({})", info, 400, "messages", "missing");
  expect_refusal(kChat, R"({"messages": {}})", info, 400, "messages", "invalid_type");
  expect_refusal(kChat, R"({"messages": []})", info, 400, "messages", "invalid_value");
  expect_refusal(kChat, R"({"messages": ["hi"]})", info, 400, "messages[0]", "invalid_type");
  expect_refusal(kChat, R"({"messages": [{"content": "hi"}]})", info, 400, "messages[0].role",
                 "missing");
  expect_refusal(kChat, R"({"messages": [{"role": "robot", "content": "hi"}]})", info, 400,
                 "messages[0].role", "invalid_value");
  expect_refusal(kChat, R"({"messages": [{"role": "user", "content": 5}]})", info, 400,
                 "messages[0].content", "invalid_type");
  expect_refusal(
      kChat,
      R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
      info, 400, "messages[0].content[0].type", "unsupported_value");
  expect_refusal(kChat, R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": 1})", info,
                 400, "logprobs", "invalid_type");
  expect_refusal(kChat, R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})",
                 info, 400, "top_logprobs", "invalid_value");
  expect_refusal(kChat,
                 R"({"messages": [{"role": "user", "content": "hi"}], "response_format": 5})", info,
                 400, "response_format", "invalid_type");
  // The chat format's own refusals come back as 400s on "messages".
  expect_refusal(kChat, R"({"messages": [{"role": "developer", "content": ""}]})", info, 400,
                 "messages", "invalid_value");
}

TEST(OpenAiRequest, ChoiceSeedsAreDistinctAndKeepTheFirst) {
  EXPECT_EQ(choice_seed(1234, 0), 1234u);
  EXPECT_NE(choice_seed(1234, 1), choice_seed(1234, 2));
  EXPECT_NE(choice_seed(1234, 1), 1234u);
}

TEST(OpenAiRequest, TokenizeAndDetokenize) {
  DI_REQUIRE_TOKENIZER(tok);
  const ModelInfo info = model_info(tok, 4096);
  EXPECT_EQ(parse_tokenize_request(R"({"prompt": "Hello"})", info), tok->encode("Hello", false));
  EXPECT_EQ(parse_tokenize_request(R"({"prompt": "Hello", "add_special_tokens": true})", info),
            tok->encode("Hello", true));
  EXPECT_EQ(parse_tokenize_request(R"({"messages": [{"role": "user", "content": "Hi"}]})", info),
            expected_chat_ids(tok, {msg(ChatRole::kUser, "Hi")}, ChatOptions{}));
  EXPECT_EQ(parse_detokenize_request(R"({"tokens": [1, 2]})", info), (std::vector<int32_t>{1, 2}));
  EXPECT_THROW(parse_detokenize_request(R"({"tokens": [1, 129280]})", info), ApiError);
  EXPECT_THROW(parse_tokenize_request(R"({})", info), ApiError);
  EXPECT_THROW(parse_tokenize_request(R"({"prompt": "a"})", model_info(nullptr)), ApiError);
}

}  // namespace
}  // namespace deepinfer::server
