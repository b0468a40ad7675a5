// Structured outputs: the output shapes the API can ask for (a JSON object, a JSON schema, a
// call of the offered tools) as grammars the engine enforces token by token (grammar/grammar.h).
// Used by the server and the offline runner.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace deepinfer {
class Tokenizer;
}

namespace deepinfer::server {

// The model's tokens as the grammar sees their text: a token's bytes; special tokens that spell
// part of a chat marker ("</think>", the DSML tags) by their text; other special tokens and ids
// the tokenizer lacks never allowed. `eos_id` is the model's end of sequence.
std::shared_ptr<const grammar::TokenVocab> make_grammar_vocab(const Tokenizer& tok,
                                                              int64_t vocab_size, int32_t eos_id);

struct ToolSpec {
  std::string name;
  std::string parameters_json;  // the parameters' JSON schema; empty: none
};

struct OutputShape {
  enum class Kind { kFree, kJsonObject, kJsonSchema, kToolCalls };
  Kind kind = Kind::kFree;
  std::string schema_json;  // kJsonSchema
  // kToolCalls: the DeepSeek-V4.1 tool-call block (chat.h) calling one of these, with
  // arguments valid against their schemas; up to 16 calls, or exactly one.
  std::vector<ToolSpec> tools;
  bool parallel_tool_calls = true;
  // Chat in thinking mode: free reasoning up to "</think>" comes first.
  bool after_thinking = false;
};

// A shape as bytes and back: the key of GrammarCache, and the form in which a request's grammar
// travels to another rank, which compiles it there (SamplingParams::grammar_source). Decoding
// malformed bytes throws deepinfer::Error.
std::string encode_output_shape(const OutputShape& shape);
OutputShape decode_output_shape(std::string_view bytes);

// Compiled grammars by their source, the most recently used kept, so that the token masks one
// request computed serve the next one with the same schema. Thread-safe.
class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const grammar::TokenVocab> vocab)
      : vocab_(std::move(vocab)) {}
  // The grammar of `shape`. Throws deepinfer::Error naming the place in the schema that cannot
  // be compiled.
  std::shared_ptr<const grammar::Grammar> get(const OutputShape& shape);

 private:
  // The grammar of `key` moved to the front, or null. Under mu_.
  std::shared_ptr<const grammar::Grammar> find(const std::string& key);

  static constexpr size_t kCapacity = 16;  // few enough for a linear search
  std::shared_ptr<const grammar::TokenVocab> vocab_;
  std::mutex mu_;
  // By source, the most recently used first.
  std::list<std::pair<std::string, std::shared_ptr<const grammar::Grammar>>> lru_;
};

// The expression of a shape (for tests and the cache).
grammar::Expr output_shape_expr(const OutputShape& shape);

}  // namespace deepinfer::server
