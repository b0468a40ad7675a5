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
#include <vector>

namespace deepinfer::tokenizer_internal {

// A compiled regex; `label` names the pattern's origin in errors.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& label);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  // Calls on_match(begin, end) for each non-overlapping match, left to right. `text` must be
  // valid UTF-8.
  template <typename F>
  void for_each_match(std::string_view text, F&& on_match) const {
    size_t pos = 0;
    size_t begin = 0, end = 0;
    while (next_match(text, pos, begin, end)) {
      on_match(begin, end);
      pos = end > begin ? end : advance_one(text, end);
    }
  }

 private:
  bool next_match(std::string_view text, size_t from, size_t& begin, size_t& end) const;
  static size_t advance_one(std::string_view text, size_t pos);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

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

// One pre-tokenizer step: a Split (regex or literal), or ByteLevel's own regex split.
struct PreTokenizerStep {
  enum class Kind : uint8_t { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  std::unique_ptr<Regex> regex;  // null for a literal split or a ByteLevel without regex
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
};

class PreTokenizer {
 public:
  void add(PreTokenizerStep step) { steps_.push_back(std::move(step)); }
  bool empty() const { return steps_.empty(); }
  // Splits `text` (valid UTF-8) into pre-tokens, appended to `out.items`.
  void split(std::string_view text, Pieces& out) const;

 private:
  std::vector<PreTokenizerStep> steps_;
};

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
  explicit AddedTokenMatcher(std::vector<Token> tokens);
  bool empty() const { return tokens_.empty(); }

  struct Segment {
    size_t begin, end;
    int32_t id;  // -1 for plain text
  };
  // Splits `text` into plain segments and added-token segments covering it entirely.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  // Length of the longest token starting at `pos` and its index, or {0, -1}.
  std::pair<size_t, int32_t> longest_at(std::string_view text, size_t pos) const;

  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // (byte, node)
    int32_t token = -1;                                 // index into tokens_ ending here
  };
  std::vector<Token> tokens_;
  std::vector<Node> nodes_;  // nodes_[0] is the root
  bool first_byte_[256] = {};
};

}  // namespace deepinfer::tokenizer_internal
