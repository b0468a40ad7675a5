// Tokenizer: the tokenizer.json reader, the text splitting ahead of BPE (added tokens,
// normalizers, pre-tokenizers), BPE itself, and encoding and decoding over what the reader
// builds.
//
// The reader checks every field; anything this tokenizer cannot reproduce exactly (other model
// types, byte fallback, unsupported normalizers or pre-tokenizers) is refused with an error naming
// the file and the field rather than encoded differently.
//
// Regexes run on PCRE2 (UTF + UCP, JIT when available), after rewrite_whitespace_classes.
#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <bit>
#include <deque>
#include <filesystem>
#include <iterator>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/file.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer_internal {

using utf8::NormalForm;

std::string rewrite_whitespace_classes(const std::string& pattern) {
  // Class body of the Unicode White_Space property.
  constexpr std::string_view kWhiteSpaceClass =
      "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
      "\\x{205F}\\x{3000}";
  std::string out;
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

namespace {

// --- regex ---

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

std::string pcre2_message(int code) {
  PCRE2_UCHAR message[256];
  pcre2_get_error_message(code, message, sizeof(message));
  return reinterpret_cast<const char*>(message);
}

// A compiled regex, or with `literal` a plain string to find. Throws deepinfer::Error naming
// `label` (the pattern's origin) when the pattern does not compile.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& label, bool literal = false)
      : label_(label) {
    const std::string rewritten = literal ? pattern : rewrite_whitespace_classes(pattern);
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                              PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP), &error,
                              &error_offset, nullptr));
    DI_REQUIRE(code_, label, ": cannot compile regex \"", pattern, "\" at offset ", error_offset,
               ": ", pcre2_message(error));
    // Without JIT support pcre2_match interprets the pattern: slower, same results.
    pcre2_jit_compile(code_.get(), PCRE2_JIT_COMPLETE);
  }

  // Calls on_match(begin, end) for each non-overlapping match, left to right. `text` must be
  // valid UTF-8.
  template <typename F>
  void for_each_match(std::string_view text, F&& on_match) const {
    thread_local MatchScratch s;
    for (size_t pos = 0; pos <= text.size();) {
      const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(text.data()),
                                 text.size(), pos, PCRE2_NO_UTF_CHECK, s.data, s.context);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      DI_REQUIRE(rc >= 0, label_, ": regex match failed on a ", text.size(),
                 "-byte piece: ", pcre2_message(rc));
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

// --- pre-tokenizer ---

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One pre-tokenizer step: a Split (regex or literal), or ByteLevel's own regex split (isolated
// matches; without its regex, no split at all).
struct PreTokenizerStep {
  std::shared_ptr<const Regex> regex;  // null: no match (an empty literal, a ByteLevel without)
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel: a space is put before each piece lacking one
};

// Byte ranges of `text` tagged as regex match or not, covering it entirely.
struct Span {
  size_t begin, end;
  bool match;
};

// Appends the pieces `step` splits `piece` into to `out`; `spans` is scratch.
void split_piece(const PreTokenizerStep& step, std::string_view piece,
                 std::vector<std::string_view>& out, std::vector<Span>& spans) {
  spans.clear();
  size_t prev = 0;
  const auto on_match = [&](size_t b, size_t e) {
    if (b > prev) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = e;
  };
  if (step.regex) step.regex->for_each_match(piece, on_match);
  if (prev < piece.size()) spans.push_back({prev, piece.size(), false});
  if (step.invert)
    for (Span& s : spans) s.match = !s.match;
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

// Splits `text` (valid UTF-8) by each step in turn into the pre-tokens `out`: views into `text`
// or into `arena`, which keeps any text a step had to create (a prefix space) alive.
void pre_tokenize(const std::vector<PreTokenizerStep>& steps, std::string_view text,
                  std::vector<std::string_view>& out, std::deque<std::string>& arena) {
  out.assign(1, text);
  std::vector<std::string_view> next;
  std::vector<Span> spans;
  for (const PreTokenizerStep& step : steps) {
    next.clear();
    for (std::string_view piece : out) {
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' '))
        piece = arena.emplace_back(" " + std::string(piece));
      split_piece(step, piece, next, spans);
    }
    out.swap(next);
  }
}

// --- added tokens ---

// A "word" character as regex `\w` defines it: letters, marks, decimal digits, connector
// punctuation and the joiners.
bool is_word_char(char32_t cp) {
  const std::string_view category = utf8proc_category_string(utf8proc_int32_t(cp));
  return cp == 0x200C || cp == 0x200D || category[0] == 'L' || category[0] == 'M' ||
         category == "Nd" || category == "Nl" || category == "Pc";
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

// Leftmost-longest matcher over the added tokens of one kind (normalized or not).
class AddedTokenMatcher {
 public:
  struct Token {
    std::string content;
    int32_t id;
    bool single_word, lstrip, rstrip;
  };

  explicit AddedTokenMatcher(std::vector<Token> tokens = {}) : tokens_(std::move(tokens)) {
    token_at_.push_back(-1);  // the root
    for (int32_t t = 0; t < int32_t(tokens_.size()); ++t) {
      const std::string& content = tokens_[t].content;  // never empty
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

  // Cuts `text` into plain text and added tokens: on_segment(text, id) for each segment in
  // order, the id -1 for plain text.
  template <typename F>
  void split(std::string_view text, F&& on_segment) const {
    size_t emitted = 0;  // end of the last segment pushed
    for (size_t pos = 0; pos < text.size();) {
      const auto [len, t] = longest_at(text, pos);
      if (t < 0 || (tokens_[t].single_word && !is_whole_word(text, pos, pos + len))) {
        ++pos;
        continue;
      }
      const Token& tok = tokens_[t];
      size_t begin = pos, end = pos + len;
      // lstrip takes in the white space before the token (back to the last segment), rstrip
      // the white space after it.
      for (size_t start;
           tok.lstrip && begin > emitted && utf8::is_white_space(char_before(text, begin, start));)
        begin = start;
      for (utf8::Step st; tok.rstrip && end < text.size() &&
                          utf8::is_white_space((st = utf8::step(text, end)).cp);)
        end += st.len;
      if (begin > emitted) on_segment(text.substr(emitted, begin - emitted), -1);
      on_segment(text.substr(begin, end - begin), tok.id);
      emitted = pos = end;
    }
    if (emitted < text.size()) on_segment(text.substr(emitted), -1);
  }

 private:
  // Length of the longest token starting at `pos` and its index, or {0, -1}.
  std::pair<size_t, int32_t> longest_at(std::string_view text, size_t pos) const {
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

  // The trie of the tokens' contents: node 0 is the root; children_ maps (node, byte) to a node.
  static uint64_t edge(int32_t node, char byte) { return uint64_t(node) << 8 | uint8_t(byte); }
  std::vector<Token> tokens_;
  std::vector<int32_t> token_at_;  // [node]: index into tokens_ ending there, or -1
  std::unordered_map<uint64_t, int32_t> children_;
  bool first_byte_[256] = {};
};

// --- byte-level BPE ---
//
// A pre-token is a byte string; its initial symbols are the vocabulary ids of the byte-level
// characters of its bytes (bytes whose character is not in the vocabulary are dropped, as the
// reference does when there is no unknown token). Merges are applied lowest rank first, the
// leftmost occurrence first among equal ranks, through a binary heap of candidate pairs with
// lazy invalidation, so a word of n bytes costs O(n log n). Results are cached per pre-token.

// Open-addressing map from a symbol pair to (rank, merged id); built once, read-only after.
class MergeTable {
 public:
  struct Entry {
    uint64_t key;  // (left << 32) | right; kEmpty marks a free slot
    uint32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);

  // Room for `n` pairs: the slots are sized once, at most half full.
  explicit MergeTable(size_t n = 0) {
    const size_t cap = std::bit_ceil(std::max<size_t>(16, 2 * n));
    slots_.assign(cap, Entry{kEmpty, 0, 0});
    shift_ = 64 - __builtin_ctzll(cap);
  }
  // Later insertions of the same pair replace earlier ones (the reference builds a hash map
  // from the merge list, so the last duplicate wins). At most `n` distinct pairs.
  void insert(int32_t left, int32_t right, uint32_t rank, int32_t merged) {
    const uint64_t key = pack(left, right);
    slots_[probe(key)] = Entry{key, rank, merged};
  }
  const Entry* find(int32_t left, int32_t right) const {
    const Entry& e = slots_[probe(pack(left, right))];
    return e.key == kEmpty ? nullptr : &e;
  }

 private:
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  // The slot holding `key`, or the free slot where it would go (linear probing).
  size_t probe(uint64_t key) const {
    size_t i = size_t((key * 0x9E3779B97F4A7C15ull) >> shift_);
    while (slots_[i].key != key && slots_[i].key != kEmpty) i = (i + 1) & (slots_.size() - 1);
    return i;
  }

  std::vector<Entry> slots_;  // [capacity], capacity a power of two
  int shift_ = 64;
};

struct BpeModel {
  MergeTable merges;
  // byte_ids[b] = vocabulary id of the byte-level character of byte b, or -1 if absent.
  std::array<int32_t, 256> byte_ids;
  // Raw bytes -> id; non-empty only for models with `ignore_merges`, where a pre-token that is
  // itself a vocabulary entry skips the merge loop.
  std::unordered_map<std::string, int32_t> whole_words;

  // Repeated pre-tokens (common words, whitespace runs) dominate text; caching their ids makes
  // the merge loop rare. Bounded: cleared when full.
  static constexpr size_t kCacheMaxEntries = 1 << 18;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  // Appends the ids of one pre-token (raw bytes) to `out`.
  void encode_word(std::string_view bytes, std::vector<int32_t>& out) const {
    if (bytes.empty()) return;
    if (!whole_words.empty()) {
      const auto it = whole_words.find(std::string(bytes));
      if (it != whole_words.end()) return out.push_back(it->second);
    }
    if (bytes.size() == 1) {
      if (const int32_t id = byte_ids[uint8_t(bytes[0])]; id >= 0) out.push_back(id);
      return;
    }
    if (bytes.size() > kCacheMaxWordBytes) return merge_word(bytes, out);
    std::string key(bytes);
    {
      std::lock_guard<std::mutex> lock(cache_mutex);
      if (const auto it = cache.find(key); it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t first = out.size();
    merge_word(bytes, out);
    std::vector<int32_t> ids(out.begin() + first, out.end());
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kCacheMaxEntries) cache.clear();
    cache.emplace(std::move(key), std::move(ids));
  }

  void merge_word(std::string_view bytes, std::vector<int32_t>& out) const {
    struct Symbol {
      int32_t id;
      int32_t prev;  // index of the previous live symbol, -1 at the start
      int32_t next;  // index of the next live symbol, -1 at the end (and once merged away)
    };
    struct Candidate {
      uint32_t rank;
      int32_t pos;  // index of the left symbol
      int32_t merged;
      // std::priority_queue is a max-heap: "less" means lower priority, i.e. a higher rank or,
      // for equal ranks, a position further right.
      bool operator<(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : pos > o.pos;
      }
    };
    std::vector<Symbol> sym;  // [n_bytes] at most
    sym.reserve(bytes.size());
    for (const char c : bytes) {
      const int32_t id = byte_ids[uint8_t(c)];
      if (id < 0) continue;
      const int32_t i = int32_t(sym.size());
      sym.push_back({id, i - 1, -1});
      if (i > 0) sym[i - 1].next = i;
    }
    std::vector<Candidate> storage;
    storage.reserve(sym.size());
    std::priority_queue<Candidate> heap(std::less<Candidate>(), std::move(storage));
    const auto push_pair = [&](int32_t left) {
      const int32_t right = sym[left].next;
      if (right < 0) return;
      if (const MergeTable::Entry* e = merges.find(sym[left].id, sym[right].id))
        heap.push({e->rank, left, e->merged});
    };
    for (int32_t i = 0; i + 1 < int32_t(sym.size()); ++i) push_pair(i);

    while (!heap.empty()) {
      const Candidate top = heap.top();
      heap.pop();
      Symbol& left = sym[top.pos];
      if (left.next < 0) continue;
      // The pair may have changed since this candidate was queued; it is still valid only if
      // the current pair merges into the same id.
      const MergeTable::Entry* e = merges.find(left.id, sym[left.next].id);
      if (e == nullptr || e->merged != top.merged) continue;
      Symbol& right = sym[left.next];
      left.id = top.merged;
      left.next = right.next;
      if (right.next >= 0) sym[right.next].prev = top.pos;
      right.next = -1;
      if (left.prev >= 0) push_pair(left.prev);
      push_pair(top.pos);
    }
    for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
  }
};

}  // namespace

struct TokenizerState {
  struct Entry {
    std::string token;  // as stored in tokenizer.json
    std::string bytes;  // what the id decodes to
    bool known = false, special = false;
  };
  std::vector<Entry> ids;  // [max_id + 1]; ids without a token are not `known`
  int32_t n_distinct = 0;

  std::unordered_map<std::string, int32_t> vocab;  // model vocabulary
  std::unordered_map<std::string, int32_t> added;  // added tokens by content

  AddedTokenMatcher raw_added;          // non-normalized
  AddedTokenMatcher normalized_added;   // normalized
  std::vector<NormalForm> normalizers;  // applied in order
  std::vector<PreTokenizerStep> pre_tokenizer;
  BpeModel bpe;

  int32_t bos = -1, eos = -1;

  // The entry of `id`; one not `known` (no token, no bytes, not special) for an unknown id.
  const Entry& entry(int32_t id) const {
    static const Entry kUnknown;
    return id >= 0 && size_t(id) < ids.size() ? ids[size_t(id)] : kUnknown;
  }
};

namespace {

using nlohmann::json;

// --- byte-level alphabet ---

// GPT-2's reversible byte <-> printable character map: byte b is represented by code point
// to_char[b]; to_byte[cp] is -1 for code points outside the alphabet.
struct ByteAlphabet {
  char32_t to_char[256] = {};
  int to_byte[512] = {};
  constexpr ByteAlphabet() {
    // Printable Latin-1 bytes stand for themselves; the others are shifted past U+00FF in
    // byte order.
    std::fill(std::begin(to_byte), std::end(to_byte), -1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_char[b] = printable ? char32_t(b) : next++;
      to_byte[to_char[b]] = b;
    }
  }
};

constexpr ByteAlphabet kAlphabet;

// The raw bytes of a token made only of byte-level characters; false for any other token.
bool byte_level_bytes(const std::string& token, std::string& out) {
  out.clear();
  for (size_t p = 0; p < token.size();) {
    const utf8::Step st = utf8::step(token, p);
    if (st.kind != utf8::Step::Kind::kChar || st.cp >= 512 || kAlphabet.to_byte[st.cp] < 0)
      return false;
    out.push_back(char(kAlphabet.to_byte[st.cp]));
    p += st.len;
  }
  return true;
}

// --- checked field access ---

struct Reader {
  const std::string& label;

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw Error(str_cat(label, ": field ", where, ": ", what));
  }
  const json& field(const json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object()) fail(where, "expected an object");
    const auto it = obj.find(key);
    if (it == obj.end()) fail(where + "." + key, "missing");
    return *it;
  }
  std::string string_field(const json& obj, const char* key, const std::string& where) const {
    const json& v = field(obj, key, where);
    if (!v.is_string()) fail(where + "." + key, "expected a string");
    return v.get<std::string>();
  }
  bool bool_field(const json& obj, const char* key, const std::string& where, bool fallback) const {
    if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) return fallback;
    const json& v = obj.at(key);
    if (!v.is_boolean()) fail(where + "." + key, "expected true or false");
    return v.get<bool>();
  }
  int32_t id_value(const json& v, const std::string& where) const {
    // Ids index dense tables, so a wild id would cost memory, not just a wrong answer.
    constexpr int64_t kMaxId = (int64_t(1) << 24) - 1;
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxId)
      fail(where, str_cat("expected a token id (integer in [0, ", kMaxId, "])"));
    return int32_t(v.get<int64_t>());
  }
  // Calls read(step, type, where) for the step `node` or, for a "Sequence", for each step of
  // its array node[key], nested sequences included. A null node has no steps.
  template <typename F>
  void for_each_step(const json& node, const char* key, const std::string& where, F read) const {
    if (node.is_null()) return;
    const std::string type = string_field(node, "type", where);
    if (type != "Sequence") return read(node, type, where);
    const json& list = field(node, key, where);
    if (!list.is_array()) fail(where + "." + key, "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      for_each_step(list[i], key, str_cat(where, ".", key, "[", i, "]"), read);
  }
};

json parse_json(std::string_view text, const std::string& label) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(str_cat(label, ": invalid JSON: ", e.what()));
  }
}

// --- sections ---

TokenizerState::Entry& set_token(TokenizerState& impl, int32_t id, const std::string& content) {
  if (size_t(id) >= impl.ids.size()) impl.ids.resize(size_t(id) + 1);
  TokenizerState::Entry& e = impl.ids[size_t(id)];
  e.token = content;
  e.known = true;
  return e;
}

// Indexed by NormalForm.
constexpr std::string_view kNormalForms[] = {"NFC", "NFD", "NFKC", "NFKD"};

// Indexed by SplitBehavior.
constexpr std::string_view kSplitBehaviors[] = {"Removed", "Isolated", "MergedWithPrevious",
                                                "MergedWithNext", "Contiguous"};

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is set.
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// One step of the pre-tokenizer sequence; sets `byte_level` for a ByteLevel step.
void read_pre_tokenizer(const Reader& r, const json& node, const std::string& type,
                        const std::string& where, TokenizerState& impl, bool& byte_level) {
  if (type == "Split") {
    PreTokenizerStep step;
    const json& pattern = r.field(node, "pattern", where);
    if (pattern.is_object() && pattern.contains("Regex")) {
      step.regex = std::make_shared<const Regex>(
          r.string_field(pattern, "Regex", where + ".pattern"), r.label + ": " + where);
    } else if (pattern.is_object() && pattern.contains("String")) {
      const std::string literal = r.string_field(pattern, "String", where + ".pattern");
      if (!literal.empty())  // an empty string matches nowhere
        step.regex = std::make_shared<const Regex>(literal, r.label + ": " + where, true);
    } else {
      r.fail(where + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    const std::string behavior = r.string_field(node, "behavior", where);
    const auto* b = std::ranges::find(kSplitBehaviors, behavior);
    if (b == std::end(kSplitBehaviors))
      r.fail(where + ".behavior", "unknown split behavior \"" + behavior + "\"");
    step.behavior = SplitBehavior(b - kSplitBehaviors);
    step.invert = r.bool_field(node, "invert", where, false);
    impl.pre_tokenizer.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    PreTokenizerStep step;
    step.add_prefix_space = r.bool_field(node, "add_prefix_space", where, true);
    if (r.bool_field(node, "use_regex", where, true))
      step.regex = std::make_shared<const Regex>(kByteLevelPattern, r.label + ": " + where);
    impl.pre_tokenizer.push_back(std::move(step));
    byte_level = true;
  } else {
    r.fail(where + ".type", "unsupported pre-tokenizer \"" + type + "\"");
  }
}

void read_model(const Reader& r, const json& model, TokenizerState& impl) {
  const std::string where = "model";
  if (model.contains("type") && r.string_field(model, "type", where) != "BPE")
    r.fail(where + ".type", "only \"BPE\" models are supported");
  if (model.contains("dropout") && !model.at("dropout").is_null())
    r.fail(where + ".dropout", "BPE dropout is not supported (expected null)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model.at(key).is_null() && model.at(key) != "")
      r.fail(where + "." + key, "not supported by byte-level BPE (expected null)");
  if (r.bool_field(model, "byte_fallback", where, false))
    r.fail(where + ".byte_fallback", "byte fallback is not supported (expected false)");
  const bool ignore_merges = r.bool_field(model, "ignore_merges", where, false);

  const json& vocab = r.field(model, "vocab", where);
  if (!vocab.is_object()) r.fail(where + ".vocab", "expected an object of token -> id");
  impl.vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = r.id_value(it.value(), where + ".vocab[\"" + it.key() + "\"]");
    impl.vocab[it.key()] = id;
    set_token(impl, id, it.key());
  }

  const json& merges = r.field(model, "merges", where);
  if (!merges.is_array()) r.fail(where + ".merges", "expected an array");
  impl.bpe.merges = MergeTable(merges.size());
  const auto lookup = [&](const std::string& token, size_t i) {
    const auto it = impl.vocab.find(token);
    if (it == impl.vocab.end())
      r.fail(str_cat(where, ".merges[", i, "]"), "token \"" + token + "\" is not in the vocab");
    return it->second;
  };
  uint32_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    std::string left, right;
    if (m.is_string()) {
      // "left right"; the legacy text format may carry a "#version" line.
      const std::string line = m.get<std::string>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        r.fail(str_cat(where, ".merges[", i, "]"), "expected \"left right\"");
      left = line.substr(0, space), right = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    } else {
      r.fail(str_cat(where, ".merges[", i, "]"), "expected \"left right\" or [left, right]");
    }
    impl.bpe.merges.insert(lookup(left, i), lookup(right, i), rank++, lookup(left + right, i));
  }

  // The initial symbols of a word are the ids of its bytes' characters.
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8::append(ch, kAlphabet.to_char[b]);
    const auto it = impl.vocab.find(ch);
    impl.bpe.byte_ids[b] = it != impl.vocab.end() ? it->second : -1;
  }
  if (ignore_merges) {
    for (const auto& [token, id] : impl.vocab)
      if (std::string raw; byte_level_bytes(token, raw))
        impl.bpe.whole_words.emplace(std::move(raw), id);
  }
}

void read_added_tokens(const Reader& r, const json& list, TokenizerState& impl) {
  if (list.is_null()) return;
  if (!list.is_array()) r.fail("added_tokens", "expected an array");
  std::vector<AddedTokenMatcher::Token> raw, normalized;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = str_cat("added_tokens[", i, "]");
    const json& t = list[i];
    const int32_t id = r.id_value(r.field(t, "id", where), where + ".id");
    const std::string content = r.string_field(t, "content", where);
    if (content.empty()) r.fail(where + ".content", "must not be empty");
    if (!utf8::is_valid(content)) r.fail(where + ".content", "not valid UTF-8");
    AddedTokenMatcher::Token tok{content, id, r.bool_field(t, "single_word", where, false),
                                 r.bool_field(t, "lstrip", where, false),
                                 r.bool_field(t, "rstrip", where, false)};
    (r.bool_field(t, "normalized", where, true) ? normalized : raw).push_back(tok);
    set_token(impl, id, content).special = r.bool_field(t, "special", where, false);
    impl.added[content] = id;
  }
  impl.raw_added = AddedTokenMatcher(std::move(raw));
  impl.normalized_added = AddedTokenMatcher(std::move(normalized));
}

// A special-token entry of tokenizer_config.json: a string or {"content": ...}.
int32_t config_token_id(const Reader& r, const json& config, const char* key,
                        const TokenizerState& impl) {
  if (!config.contains(key) || config.at(key).is_null()) return -1;
  const json& v = config.at(key);
  if (!v.is_string() && !v.is_object())
    r.fail(key, "expected a string or an object with \"content\"");
  const std::string content =
      v.is_string() ? v.get<std::string>() : r.string_field(v, "content", key);
  // An added token, else a vocabulary token; -1 if neither.
  if (const auto it = impl.added.find(content); it != impl.added.end()) return it->second;
  const auto it = impl.vocab.find(content);
  return it != impl.vocab.end() ? it->second : -1;
}

}  // namespace
}  // namespace deepinfer::tokenizer_internal

namespace deepinfer {

namespace fs = std::filesystem;
using namespace tokenizer_internal;

Tokenizer::Tokenizer() : impl_(new TokenizerState) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json,
                                                std::string_view config_json,
                                                const std::string& label) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  TokenizerState& impl = *t->impl_;
  const json root = parse_json(tokenizer_json, label);
  const Reader r{label};
  if (!root.is_object()) r.fail("(root)", "expected an object");

  read_model(r, r.field(root, "model", "(root)"), impl);
  read_added_tokens(r, root.value("added_tokens", json()), impl);
  r.for_each_step(root.value("normalizer", json()), "normalizers", "normalizer",
                  [&](const json&, const std::string& type, const std::string& where) {
                    const auto* form = std::ranges::find(kNormalForms, type);
                    if (form == std::end(kNormalForms))
                      r.fail(where + ".type", "unsupported normalizer \"" + type + "\"");
                    impl.normalizers.push_back(NormalForm(form - kNormalForms));
                  });
  bool byte_level = false;
  r.for_each_step(root.value("pre_tokenizer", json()), "pretokenizers", "pre_tokenizer",
                  [&](const json& node, const std::string& type, const std::string& where) {
                    read_pre_tokenizer(r, node, type, where, impl, byte_level);
                  });
  if (!byte_level) r.fail("pre_tokenizer", "expected a ByteLevel step (byte-level BPE)");
  const json decoder = root.value("decoder", json());
  if (decoder.is_null() || r.string_field(decoder, "type", "decoder") != "ByteLevel")
    r.fail("decoder", "expected a ByteLevel decoder");

  // What each id decodes to: a token made only of byte-level characters maps back to those
  // bytes; any other token (special tokens, typically) is its own UTF-8.
  for (TokenizerState::Entry& e : impl.ids)
    if (e.known && !byte_level_bytes(e.token, e.bytes)) e.bytes = e.token;
  impl.n_distinct = int32_t(impl.vocab.size());
  for (const auto& [content, id] : impl.added) impl.n_distinct += !impl.vocab.count(content);

  if (!config_json.empty()) {
    const std::string config_label = label + " (tokenizer_config.json)";
    const json config = parse_json(config_json, config_label);
    const Reader rc{config_label};
    if (!config.is_object()) rc.fail("(root)", "expected an object");
    impl.bos = config_token_id(rc, config, "bos_token", impl);
    impl.eos = config_token_id(rc, config, "eos_token", impl);
  }
  return t;
}

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  const fs::path json_path = is_dir ? fs::path(path) / "tokenizer.json" : fs::path(path);
  if (!fs::is_regular_file(json_path, ec))
    throw Error(str_cat("tokenizer: ", json_path.string(),
                        " does not exist (expected a directory with tokenizer.json, or the "
                        "tokenizer.json file)"));
  const fs::path config_path = json_path.parent_path() / "tokenizer_config.json";
  auto read = [](const fs::path& p) { return read_file(p.string(), "tokenizer: " + p.string()); };
  const std::string config = fs::is_regular_file(config_path, ec) ? read(config_path) : "";
  return from_json(read(json_path), config, json_path.string());
}

// --- encode ---

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  const TokenizerState& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_bos) {
    if (m.bos < 0)
      throw Error("tokenizer: encode(add_bos=true) but tokenizer_config.json names no bos_token");
    out.push_back(m.bos);
  }
  std::string repaired;
  if (!utf8::is_valid(text)) text = repaired = utf8::lossy(text);

  // Tokens marked non-normalized are matched on the raw text, the others on normalized text;
  // the text between them is pre-tokenized, then each piece goes through BPE.
  std::vector<std::string_view> pieces;
  std::deque<std::string> arena;
  m.raw_added.split(text, [&](std::string_view raw, int32_t raw_id) {
    if (raw_id >= 0) return out.push_back(raw_id);
    std::string normalized(raw);
    for (const auto form : m.normalizers) normalized = utf8::normalize(normalized, form);
    m.normalized_added.split(normalized, [&](std::string_view plain, int32_t id) {
      if (id >= 0) return out.push_back(id);
      pre_tokenize(m.pre_tokenizer, plain, pieces, arena);
      for (const std::string_view piece : pieces) m.bpe.encode_word(piece, out);
    });
  });
  return out;
}

// --- decode and lookups ---

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special,
                              std::span<const int32_t> keep) const {
  const TokenizerState& m = *impl_;
  std::string bytes;
  for (const int32_t id : ids) {
    const TokenizerState::Entry& e = m.entry(id);
    if (!(skip_special && e.special && !std::ranges::binary_search(keep, id))) bytes += e.bytes;
  }
  return utf8::lossy(bytes);
}

int32_t Tokenizer::vocab_size() const {
  return impl_->n_distinct;
}

int32_t Tokenizer::id_limit() const {
  return int32_t(impl_->ids.size());
}

std::string_view Tokenizer::id_to_token(int32_t id) const {
  const TokenizerState::Entry& e = impl_->entry(id);
  if (!e.known)
    throw Error(str_cat("tokenizer: unknown token id ", id, " (vocabulary has ids 0..",
                        int64_t(impl_->ids.size()) - 1, ")"));
  return e.token;
}

bool Tokenizer::is_special(int32_t id) const {
  return impl_->entry(id).special;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  return impl_->entry(id).bytes;
}

int32_t Tokenizer::eos_id() const {
  return impl_->eos;
}

// --- streaming detokenizer ---

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id) && !std::ranges::binary_search(keep_, id))
    return {};
  pending_ += tokenizer_.token_bytes(id);
  const size_t stable = utf8::stable_prefix(pending_);
  if (stable == 0) return {};
  std::string out = utf8::lossy(std::string_view(pending_).substr(0, stable));
  pending_.erase(0, stable);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  return utf8::lossy(std::exchange(pending_, {}));
}

}  // namespace deepinfer
