#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"
#include "tokenizer/unicode.h"
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
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
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

}  // namespace

std::string rewrite_whitespace_classes(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[i + 1];
      ++i;
      if (n == 's') {
        if (in_class) {
          out += kWhiteSpaceClass;
        } else {
          out += '[';
          out += kWhiteSpaceClass;
          out += ']';
        }
      } else if (n == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceClass;
        out += ']';
      } else {
        out += c;
        out += n;
      }
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

struct Regex::Impl {
  pcre2_code* code = nullptr;
  std::string label;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, const std::string& label) : impl_(new Impl) {
  impl_->label = label;
  const std::string rewritten = rewrite_whitespace_classes(pattern);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
  if (impl_->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    throw Error(str_cat(label, ": cannot compile regex \"", pattern, "\" at offset ", error_offset,
                        ": ", reinterpret_cast<const char*>(message)));
  }
  // Without JIT support pcre2_match interprets the pattern: slower, same results.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

bool Regex::next_match(std::string_view text, size_t from, size_t& begin, size_t& end) const {
  if (from > text.size()) return false;
  MatchScratch& s = scratch();
  const int rc = pcre2_match(impl_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                             from, PCRE2_NO_UTF_CHECK, s.data, s.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof(message));
    throw Error(str_cat(impl_->label, ": regex match failed on a ", text.size(),
                        "-byte piece: ", reinterpret_cast<const char*>(message)));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
  begin = ov[0], end = ov[1];
  return true;
}

size_t Regex::advance_one(std::string_view text, size_t pos) {
  if (pos >= text.size()) return text.size() + 1;
  return pos + utf8::step(text, pos).len;
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
  const auto view = [&](size_t b, size_t e) { return piece.substr(b, e - b); };
  size_t pending = std::string::npos;  // start of a run not yet emitted
  switch (step.behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.match) out.push_back(view(s.begin, s.end));
      }
      break;
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) out.push_back(view(s.begin, s.end));
      break;
    case SplitBehavior::kMergedWithPrevious:
      // A match joins the text before it.
      for (const Span& s : spans) {
        if (pending == std::string::npos) pending = s.begin;
        if (s.match) {
          out.push_back(view(pending, s.end));
          pending = std::string::npos;
        }
      }
      if (pending != std::string::npos) out.push_back(view(pending, piece.size()));
      break;
    case SplitBehavior::kMergedWithNext:
      // A match joins the text after it.
      for (const Span& s : spans) {
        if (s.match && pending != std::string::npos) {
          out.push_back(view(pending, s.begin));
          pending = std::string::npos;
        }
        if (pending == std::string::npos) pending = s.begin;
      }
      if (pending != std::string::npos) out.push_back(view(pending, piece.size()));
      break;
    case SplitBehavior::kContiguous:
      // Consecutive matches form one piece.
      for (size_t i = 0; i < spans.size(); ++i) {
        size_t j = i;
        if (spans[i].match) {
          while (j + 1 < spans.size() && spans[j + 1].match) ++j;
        }
        out.push_back(view(spans[i].begin, spans[j].end));
        i = j;
      }
      break;
  }
}

}  // namespace

void PreTokenizer::split(std::string_view text, Pieces& out) const {
  const size_t first = out.items.size();
  out.items.push_back(text);
  std::vector<std::string_view> next;
  std::vector<Span> spans;
  for (const PreTokenizerStep& step : steps_) {
    next.clear();
    for (size_t i = first; i < out.items.size(); ++i) {
      std::string_view piece = out.items[i];
      if (step.kind == PreTokenizerStep::Kind::kByteLevel && step.add_prefix_space &&
          (piece.empty() || piece[0] != ' ')) {
        out.arena.push_back(" " + std::string(piece));
        piece = out.arena.back();
      }
      if (step.kind == PreTokenizerStep::Kind::kByteLevel && !step.regex) {
        next.push_back(piece);
      } else {
        split_piece(step, piece, next, spans);
      }
    }
    out.items.resize(first);
    for (const std::string_view p : next) {
      if (!p.empty()) out.items.push_back(p);
    }
  }
}

// --- normalization ---

std::string normalize(std::string_view text, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNFC:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNFD:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNFKC:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNFKD:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
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

AddedTokenMatcher::AddedTokenMatcher(std::vector<Token> tokens) : tokens_(std::move(tokens)) {
  nodes_.emplace_back();
  for (int32_t t = 0; t < int32_t(tokens_.size()); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;
    first_byte_[uint8_t(content[0])] = true;
    int32_t node = 0;
    for (const char c : content) {
      const uint8_t b = uint8_t(c);
      int32_t child = -1;
      for (const auto& [byte, index] : nodes_[node].children) {
        if (byte == b) child = index;
      }
      if (child < 0) {
        child = int32_t(nodes_.size());
        nodes_[node].children.emplace_back(b, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].token = t;  // a later duplicate wins, like a map keyed by content
  }
}

std::pair<size_t, int32_t> AddedTokenMatcher::longest_at(std::string_view text, size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const uint8_t b = uint8_t(text[i]);
    int32_t child = -1;
    for (const auto& [byte, index] : nodes_[node].children) {
      if (byte == b) {
        child = index;
        break;
      }
    }
    if (child < 0) break;
    node = child;
    if (nodes_[node].token >= 0) best = {i + 1 - pos, nodes_[node].token};
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t emitted = 0;  // end of the last segment pushed
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[uint8_t(text[pos])]) {
      ++pos;
      continue;
    }
    const auto [len, t] = longest_at(text, pos);
    if (t < 0) {
      ++pos;
      continue;
    }
    const Token& tok = tokens_[t];
    size_t begin = pos, end = pos + len;
    if (tok.single_word && !(unicode::at_word_boundary_before(text, begin) &&
                             unicode::at_word_boundary_after(text, end))) {
      ++pos;
      continue;
    }
    if (tok.lstrip) begin = std::max(emitted, unicode::whitespace_run_start(text, begin));
    if (tok.rstrip) end = unicode::whitespace_run_end(text, end);
    if (begin > emitted) out.push_back({emitted, begin, -1});
    out.push_back({begin, end, tok.id});
    emitted = pos = end;
  }
  if (emitted < text.size()) out.push_back({emitted, text.size(), -1});
}

}  // namespace deepinfer::tokenizer_internal
