// Text splitting ahead of BPE: added tokens, normalizers and pre-tokenizers of tokenizer.json.
//
// Regexes run on PCRE2 (UTF + UCP, JIT when available). `\s` and `\S` are rewritten to the
// Unicode White_Space property, which is what the reference's regex engine matches (PCRE2's
// own `\s` also takes U+180E).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deepinfer::tokenizer_internal {

// A compiled regex (pretokenizer.cpp). Throws deepinfer::Error naming `label` (the pattern's
// origin) when the pattern does not compile.
class Regex;
std::shared_ptr<const Regex> compile_regex(const std::string& pattern, const std::string& label);

// The rewrite of `\s` / `\S` described above (exposed for tests).
std::string rewrite_whitespace_classes(const std::string& pattern);

// Pieces are views into the input text or into `arena`, which keeps any text a step had to
// create (e.g. a prefix space) alive.
struct Pieces {
  std::vector<std::string_view> items;
  std::deque<std::string> arena;
};

enum class SplitBehavior : uint8_t {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous
};

// One pre-tokenizer step: a Split (regex or literal), or ByteLevel's own regex split (isolated
// matches; without its regex, no split at all).
struct PreTokenizerStep {
  std::shared_ptr<const Regex> regex;  // null for a literal split or a ByteLevel without regex
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel: a space is put before each piece lacking one
};

// Splits `text` (valid UTF-8) by each step in turn into pre-tokens, appended to `out.items`.
void pre_tokenize(const std::vector<PreTokenizerStep>& steps, std::string_view text, Pieces& out);

// Unicode normalization forms a tokenizer.json normalizer may ask for.
enum class NormalForm : uint8_t { kNFC, kNFD, kNFKC, kNFKD };
std::string normalize(std::string_view text, NormalForm form);

// Leftmost-longest matcher over the added tokens of one kind (normalized or not).
class AddedTokenMatcher {
 public:
  struct Token {
    std::string content;
    int32_t id;
    bool single_word, lstrip, rstrip;
  };
  explicit AddedTokenMatcher(std::vector<Token> tokens = {});

  struct Segment {
    size_t begin, end;
    int32_t id;  // -1 for plain text
  };
  // Sets `out` to plain segments and added-token segments covering `text` entirely.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  // Length of the longest token starting at `pos` and its index, or {0, -1}.
  std::pair<size_t, int32_t> longest_at(std::string_view text, size_t pos) const;

  // The trie of the tokens' contents: node 0 is the root; children_ maps (node, byte) to a node.
  static uint64_t edge(int32_t node, char byte) { return uint64_t(node) << 8 | uint8_t(byte); }
  std::vector<Token> tokens_;
  std::vector<int32_t> token_at_;  // [node]: index into tokens_ ending there, or -1
  std::unordered_map<uint64_t, int32_t> children_;
  bool first_byte_[256] = {};
};

}  // namespace deepinfer::tokenizer_internal
