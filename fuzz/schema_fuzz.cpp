// JSON Schema -> grammar: any bytes either compile or throw deepinfer::Error. A schema that
// compiles is walked a few steps through a small vocabulary: the mask equals the plain per-token
// check, and every allowed token is accepted.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"

using namespace deepinfer;

namespace {
std::shared_ptr<const grammar::TokenVocab> vocab() {
  static const auto v = [] {
    std::vector<std::string> t{""};  // 0: EOS
    for (int b = 1; b < 256; ++b) t.push_back(std::string(1, char(b)));
    for (const char* w : {"{\"", "\":", "\",", "\"}", "true", "false", "null", "12", "-1", ".5",
                          "e+", "\n  ", "]}", "[{", "\\u00", "é", "\xc3", "ab\""})
      t.push_back(w);
    return std::make_shared<grammar::TokenVocab>(std::move(t), 0);
  }();
  return v;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::shared_ptr<const grammar::Grammar> g;
  try {
    g = grammar::Grammar::compile(grammar::JsonSchema(text, /*max_length=*/64).value(), vocab(),
                                  /*max_states=*/20000);
  } catch (const Error&) {
    return 0;
  }
  grammar::Matcher m(g);
  uint64_t pick = size;
  for (int step = 0; step < 24 && !m.finished(); ++step) {
    const uint64_t* mask = m.allowed();
    // The plain per-token check: a copy of the matcher accepts each token on its own.
    std::vector<uint64_t> ref(vocab()->words(), 0);
    for (int32_t t = 0; t < vocab()->size(); ++t)
      if (grammar::Matcher copy = m; copy.accept(t)) ref[size_t(t) / 64] |= uint64_t(1) << (t % 64);
    std::vector<int32_t> ok;
    for (int32_t t = 0; t < vocab()->size(); ++t)
      if ((mask[t / 64] >> (t % 64)) & 1) ok.push_back(t);
    if (std::vector<uint64_t>(mask, mask + vocab()->words()) != ref || ok.empty()) __builtin_trap();
    pick = pick * 6364136223846793005ull + 1442695040888963407ull;
    if (!m.accept(ok[(pick >> 33) % ok.size()])) __builtin_trap();
  }
  return 0;
}
