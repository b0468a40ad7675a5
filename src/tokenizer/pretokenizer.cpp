#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer_internal {

// --- regex ---

namespace {

// Class body of the Unicode White_Space property.
constexpr std::string_view kWhiteSpaceClass =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// Per-thread match scratch: one match data (only the whole-match offsets are read) and a JIT
// stack large enough for long whitespace runs under `\s+(?!\S)`.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  MatchScratch() {
    if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(code, message, sizeof(message));
  return reinterpret_cast<const char*>(message);
}

}  // namespace

std::string rewrite_whitespace_classes(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[++i];
      if (n == 's')
        out += in_class ? std::string(kWhiteSpaceClass) : str_cat("[", kWhiteSpaceClass, "]");
      else if (n == 'S' && !in_class)
        out += str_cat("[^", kWhiteSpaceClass, "]");
      else
        out += {c, n};
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& label) : label_(label) {
    const std::string rewritten = rewrite_whitespace_classes(pattern);
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr));
    if (!code_) {
      throw Error(str_cat(label, ": cannot compile regex \"", pattern, "\" at offset ",
                          error_offset, ": ", pcre2_message(error)));
    }
    // Without JIT support pcre2_match interprets the pattern: slower, same results.
    pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE);
  }

  // Calls on_match(begin, end) for each non-overlapping match, left to right. `text` must be
  // valid UTF-8.
  template <typename F>
  void for_each_match(std::string_view text, F&& on_match) const {
    MatchScratch& s = scratch();
    for (size_t pos = 0; pos <= text.size();) {
      const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()),
                                 text.size(), pos, PCRE2_NO_UTF_CHECK, s.data, s.context);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        throw Error(str_cat(label_, ": regex match failed on a ", text.size(),
                            "-byte piece: ", pcre2_message(rc)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
      on_match(size_t(ov[0]), size_t(ov[1]));
      // After an empty match, resume one character later.
      pos = ov[1] > ov[0]          ? ov[1]
            : ov[1] >= text.size() ? text.size() + 1
                                   : ov[1] + utf8::step(text, ov[1]).len;
    }
  }

 private:
  std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> code_{nullptr, pcre2_code_free};
  std::string label_;
};

std::shared_ptr<const Regex> compile_regex(const std::string& pattern, const std::string& label) {
  return std::make_shared<const Regex>(pattern, label);
}

// --- pre-tokenizer ---

namespace {

// Byte ranges of `text` tagged as regex match or not, covering it entirely.
struct Span {
  size_t begin, end;
  bool match;
};

void find_spans(const PreTokenizerStep& step, std::string_view text, std::vector<Span>& spans) {
  spans.clear();
  size_t prev = 0;
  const auto on_match = [&](size_t b, size_t e) {
    if (b > prev) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = e;
  };
  if (step.regex) {
    step.regex->for_each_match(text, on_match);
  } else if (!step.literal.empty()) {
    for (size_t at = text.find(step.literal); at != std::string_view::npos;
         at = text.find(step.literal, prev)) {
      on_match(at, at + step.literal.size());
    }
  }
  if (prev < text.size()) spans.push_back({prev, text.size(), false});
  if (step.invert) {
    for (Span& s : spans) s.match = !s.match;
  }
}

void split_piece(const PreTokenizerStep& step, std::string_view piece,
                 std::vector<std::string_view>& out, std::vector<Span>& spans) {
  find_spans(step, piece, spans);
  // A piece ends after span i where the behavior cuts between spans i and i + 1: Removed (which
  // then drops the matches) and Isolated always; MergedWithPrevious after a match (it joins the
  // text before it); MergedWithNext before one (it joins the text after it); Contiguous except
  // between two matches.
  using B = SplitBehavior;
  const B b = step.behavior;
  size_t start = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    const bool next_match = i + 1 < spans.size() && spans[i + 1].match;
    const bool cut = i + 1 == spans.size() || b == B::kRemoved || b == B::kIsolated ||
                     (b == B::kMergedWithPrevious && s.match) ||
                     (b == B::kMergedWithNext && next_match) ||
                     (b == B::kContiguous && !(s.match && next_match));
    if (!cut) continue;
    if ((b != B::kRemoved || !s.match) && s.end > start)
      out.push_back(piece.substr(start, s.end - start));
    start = s.end;
  }
}

}  // namespace

void pre_tokenize(const std::vector<PreTokenizerStep>& steps, std::string_view text, Pieces& out) {
  const size_t first = out.items.size();
  out.items.push_back(text);
  std::vector<std::string_view> next;
  std::vector<Span> spans;
  for (const PreTokenizerStep& step : steps) {
    next.clear();
    for (size_t i = first; i < out.items.size(); ++i) {
      std::string_view piece = out.items[i];
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
        out.arena.push_back(" " + std::string(piece));
        piece = out.arena.back();
      }
      split_piece(step, piece, next, spans);
    }
    out.items.resize(first);
    out.items.insert(out.items.end(), next.begin(), next.end());
  }
}

// --- normalization ---

std::string normalize(std::string_view text, NormalForm form) {
  // Indexed by NormalForm: NFC, NFD, NFKC, NFKD.
  constexpr int kOptions[] = {UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE,
                              UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                              UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
  const int options = UTF8PROC_STABLE | kOptions[int(form)];
  if (text.empty()) return {};
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   utf8proc_ssize_t(text.size()), &dst, utf8proc_option_t(options));
  if (n < 0) {
    throw Error(str_cat("unicode normalization failed: ", utf8proc_errmsg(n)));
  }
  std::string out(reinterpret_cast<const char*>(dst), size_t(n));
  std::free(dst);
  return out;
}

// --- added tokens ---

namespace {

// A "word" character as regex `\w` defines it: letters, marks, decimal digits, connector
// punctuation and the joiners.
bool is_word_char(char32_t cp) {
  constexpr uint32_t kWordCategories =
      1u << UTF8PROC_CATEGORY_LU | 1u << UTF8PROC_CATEGORY_LL | 1u << UTF8PROC_CATEGORY_LT |
      1u << UTF8PROC_CATEGORY_LM | 1u << UTF8PROC_CATEGORY_LO | 1u << UTF8PROC_CATEGORY_NL |
      1u << UTF8PROC_CATEGORY_MN | 1u << UTF8PROC_CATEGORY_MC | 1u << UTF8PROC_CATEGORY_ME |
      1u << UTF8PROC_CATEGORY_ND | 1u << UTF8PROC_CATEGORY_PC;
  return cp == 0x200C || cp == 0x200D ||
         (kWordCategories >> utf8proc_category(utf8proc_int32_t(cp)) & 1) != 0;
}

// The code point ending at `pos` (text is valid UTF-8, pos > 0) and where it starts.
char32_t char_before(std::string_view text, size_t pos, size_t& start) {
  start = pos - 1;
  while (start > 0 && (uint8_t(text[start]) & 0xC0) == 0x80) --start;
  return utf8::step(text, start).cp;
}

// Neither the character before `begin` nor the one at `end` is a word character.
bool is_whole_word(std::string_view text, size_t begin, size_t end) {
  size_t start;
  return (begin == 0 || !is_word_char(char_before(text, begin, start))) &&
         (end >= text.size() || !is_word_char(utf8::step(text, end).cp));
}

// Start of the run of white space that ends at `pos`.
size_t whitespace_run_start(std::string_view text, size_t pos) {
  for (size_t start; pos > 0 && utf8::is_white_space(char_before(text, pos, start));) pos = start;
  return pos;
}

// End of the run of white space that starts at `pos`.
size_t whitespace_run_end(std::string_view text, size_t pos) {
  for (utf8::Step st; pos < text.size() && utf8::is_white_space((st = utf8::step(text, pos)).cp);)
    pos += st.len;
  return pos;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<Token> tokens) : tokens_(std::move(tokens)) {
  token_at_.push_back(-1);  // the root
  for (int32_t t = 0; t < int32_t(tokens_.size()); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;
    first_byte_[uint8_t(content[0])] = true;
    int32_t node = 0;
    for (const char c : content) {
      const auto [it, added] = children_.try_emplace(edge(node, c), int32_t(token_at_.size()));
      if (added) token_at_.push_back(-1);
      node = it->second;
    }
    token_at_[node] = t;  // a later duplicate wins, like a map keyed by content
  }
}

std::pair<size_t, int32_t> AddedTokenMatcher::longest_at(std::string_view text, size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  if (!first_byte_[uint8_t(text[pos])]) return best;  // the common case, without a lookup
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto it = children_.find(edge(node, text[i]));
    if (it == children_.end()) break;
    node = it->second;
    if (token_at_[node] >= 0) best = {i + 1 - pos, token_at_[node]};
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  out.clear();
  size_t emitted = 0;  // end of the last segment pushed
  size_t pos = 0;
  while (pos < text.size()) {
    const auto [len, t] = longest_at(text, pos);
    if (t < 0 || (tokens_[t].single_word && !is_whole_word(text, pos, pos + len))) {
      ++pos;
      continue;
    }
    const Token& tok = tokens_[t];
    size_t begin = pos, end = pos + len;
    if (tok.lstrip) begin = std::max(emitted, whitespace_run_start(text, begin));
    if (tok.rstrip) end = whitespace_run_end(text, end);
    if (begin > emitted) out.push_back({emitted, begin, -1});
    out.push_back({begin, end, tok.id});
    emitted = pos = end;
  }
  if (emitted < text.size()) out.push_back({emitted, text.size(), -1});
}

}  // namespace deepinfer::tokenizer_internal
