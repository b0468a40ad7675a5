// Tokenizer: the tokenizer.json reader, and encoding and decoding over what it builds.
//
// The reader checks every field; anything this tokenizer cannot reproduce exactly (other model
// types, byte fallback, unsupported normalizers or pre-tokenizers) is refused with an error naming
// the file and the field rather than encoded differently.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer_internal {

struct TokenizerState {
  struct Entry {
    std::string token;  // as stored in tokenizer.json
    std::string bytes;  // what the id decodes to
    bool known = false;
    bool special = false;
  };
  std::vector<Entry> ids;  // [max_id + 1]; ids without a token are not `known`
  int32_t n_distinct = 0;

  std::unordered_map<std::string, int32_t> vocab;  // model vocabulary
  std::unordered_map<std::string, int32_t> added;  // added tokens by content

  AddedTokenMatcher raw_added;          // non-normalized
  AddedTokenMatcher normalized_added;   // normalized
  std::vector<NormalForm> normalizers;  // applied in order
  std::vector<PreTokenizerStep> pre_tokenizer;
  std::optional<BpeModel> bpe;

  int32_t bos = -1, eos = -1;

  // The entry of a known id, else null.
  const Entry* entry(int32_t id) const {
    return id >= 0 && size_t(id) < ids.size() && ids[size_t(id)].known ? &ids[size_t(id)] : nullptr;
  }
};

namespace {

using nlohmann::json;

// --- byte-level alphabet ---

// GPT-2's reversible byte <-> printable character map: byte b is represented by code point
// to_char[b]; to_byte[cp] is -1 for code points outside the alphabet.
struct ByteAlphabet {
  char32_t to_char[256];
  int to_byte[512];
  ByteAlphabet() {
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

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// The raw bytes of a token made only of byte-level characters; false for any other token.
bool byte_level_bytes(const std::string& token, std::string& out) {
  out.clear();
  for (size_t p = 0; p < token.size();) {
    const utf8::Step st = utf8::step(token, p);
    if (st.kind != utf8::Step::Kind::kChar || st.cp >= 512 || alphabet().to_byte[st.cp] < 0)
      return false;
    out.push_back(char(alphabet().to_byte[st.cp]));
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
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxId) {
      fail(where, str_cat("expected a token id (integer in [0, ", kMaxId, "])"));
    }
    return int32_t(v.get<int64_t>());
  }
  // Calls read(item, where) for each item of the array node[key] (a "Sequence" step's list).
  template <typename F>
  void for_each_item(const json& node, const char* key, const std::string& where, F read) const {
    const json& list = field(node, key, where);
    if (!list.is_array()) fail(where + "." + key, "expected an array");
    for (size_t i = 0; i < list.size(); ++i) read(list[i], str_cat(where, ".", key, "[", i, "]"));
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

constexpr std::pair<std::string_view, NormalForm> kNormalForms[] = {{"NFC", NormalForm::kNFC},
                                                                    {"NFD", NormalForm::kNFD},
                                                                    {"NFKC", NormalForm::kNFKC},
                                                                    {"NFKD", NormalForm::kNFKD}};

void read_normalizer(const Reader& r, const json& node, const std::string& where,
                     std::vector<NormalForm>& out) {
  if (node.is_null()) return;
  const std::string type = r.string_field(node, "type", where);
  if (type == "Sequence") {
    return r.for_each_item(node, "normalizers", where, [&](const json& n, const std::string& w) {
      read_normalizer(r, n, w, out);
    });
  }
  for (const auto& [name, form] : kNormalForms)
    if (type == name) return out.push_back(form);
  r.fail(where + ".type", "unsupported normalizer \"" + type + "\"");
}

constexpr std::pair<std::string_view, SplitBehavior> kSplitBehaviors[] = {
    {"Removed", SplitBehavior::kRemoved},
    {"Isolated", SplitBehavior::kIsolated},
    {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
    {"MergedWithNext", SplitBehavior::kMergedWithNext},
    {"Contiguous", SplitBehavior::kContiguous}};

SplitBehavior read_behavior(const Reader& r, const json& node, const std::string& where) {
  const std::string b = r.string_field(node, "behavior", where);
  for (const auto& [name, behavior] : kSplitBehaviors)
    if (b == name) return behavior;
  r.fail(where + ".behavior", "unknown split behavior \"" + b + "\"");
}

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is set.
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void read_pre_tokenizer(const Reader& r, const json& node, const std::string& where,
                        TokenizerState& impl, bool& byte_level) {
  if (node.is_null()) return;
  const std::string type = r.string_field(node, "type", where);
  if (type == "Sequence") {
    r.for_each_item(node, "pretokenizers", where, [&](const json& n, const std::string& w) {
      read_pre_tokenizer(r, n, w, impl, byte_level);
    });
  } else if (type == "Split") {
    PreTokenizerStep step;
    const json& pattern = r.field(node, "pattern", where);
    if (pattern.is_object() && pattern.contains("Regex")) {
      step.regex = compile_regex(r.string_field(pattern, "Regex", where + ".pattern"),
                                 r.label + ": " + where);
    } else if (pattern.is_object() && pattern.contains("String")) {
      step.literal = r.string_field(pattern, "String", where + ".pattern");
    } else {
      r.fail(where + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    step.behavior = read_behavior(r, node, where);
    step.invert = r.bool_field(node, "invert", where, false);
    impl.pre_tokenizer.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    PreTokenizerStep step;
    step.add_prefix_space = r.bool_field(node, "add_prefix_space", where, true);
    if (r.bool_field(node, "use_regex", where, true)) {
      step.regex = compile_regex(kByteLevelPattern, r.label + ": " + where);
    }
    impl.pre_tokenizer.push_back(std::move(step));
    byte_level = true;
  } else {
    r.fail(where + ".type", "unsupported pre-tokenizer \"" + type + "\"");
  }
}

void read_model(const Reader& r, const json& model, TokenizerState& impl) {
  const std::string where = "model";
  if (model.contains("type") && r.string_field(model, "type", where) != "BPE") {
    r.fail(where + ".type", "only \"BPE\" models are supported");
  }
  if (model.contains("dropout") && !model.at("dropout").is_null()) {
    r.fail(where + ".dropout", "BPE dropout is not supported (expected null)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model.at(key).is_null() && model.at(key) != "") {
      r.fail(where + "." + key, "not supported by byte-level BPE (expected null)");
    }
  }
  if (r.bool_field(model, "byte_fallback", where, false)) {
    r.fail(where + ".byte_fallback", "byte fallback is not supported (expected false)");
  }
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
  MergeTable table(merges.size());
  const auto lookup = [&](const std::string& token, size_t i) {
    const auto it = impl.vocab.find(token);
    if (it == impl.vocab.end()) {
      r.fail(str_cat(where, ".merges[", i, "]"), "token \"" + token + "\" is not in the vocab");
    }
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
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        r.fail(str_cat(where, ".merges[", i, "]"), "expected \"left right\"");
      }
      left = line.substr(0, space), right = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    } else {
      r.fail(str_cat(where, ".merges[", i, "]"), "expected \"left right\" or [left, right]");
    }
    table.insert(lookup(left, i), lookup(right, i), rank++, lookup(left + right, i));
  }

  // The initial symbols of a word are the ids of its bytes' characters.
  std::vector<int32_t> byte_ids(256, -1);
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8::append(ch, alphabet().to_char[b]);
    const auto it = impl.vocab.find(ch);
    if (it != impl.vocab.end()) byte_ids[b] = it->second;
  }
  std::unordered_map<std::string, int32_t> whole_words;
  if (ignore_merges) {
    for (const auto& [token, id] : impl.vocab)
      if (std::string raw; byte_level_bytes(token, raw)) whole_words.emplace(std::move(raw), id);
  }
  impl.bpe.emplace(std::move(table), std::move(byte_ids), std::move(whole_words));
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
  std::string content;
  if (v.is_string()) {
    content = v.get<std::string>();
  } else if (v.is_object()) {
    content = r.string_field(v, "content", key);
  } else {
    r.fail(key, "expected a string or an object with \"content\"");
  }
  // An added token, else a vocabulary token; -1 if neither.
  if (const auto it = impl.added.find(content); it != impl.added.end()) return it->second;
  const auto it = impl.vocab.find(content);
  return it != impl.vocab.end() ? it->second : -1;
}

void load_json(std::string_view tokenizer_json, std::string_view config_json,
               const std::string& label, TokenizerState& impl) {
  const json root = parse_json(tokenizer_json, label);
  const Reader r{label};
  if (!root.is_object()) r.fail("(root)", "expected an object");

  read_model(r, r.field(root, "model", "(root)"), impl);
  read_added_tokens(r, root.value("added_tokens", json()), impl);
  read_normalizer(r, root.value("normalizer", json()), "normalizer", impl.normalizers);
  bool byte_level = false;
  read_pre_tokenizer(r, root.value("pre_tokenizer", json()), "pre_tokenizer", impl, byte_level);
  if (!byte_level) r.fail("pre_tokenizer", "expected a ByteLevel step (byte-level BPE)");
  const json decoder = root.value("decoder", json());
  if (decoder.is_null() || r.string_field(decoder, "type", "decoder") != "ByteLevel") {
    r.fail("decoder", "expected a ByteLevel decoder");
  }

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
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str_cat("tokenizer: cannot open ", path.string()));
  std::string text(std::istreambuf_iterator<char>(in), {});
  if (in.bad()) throw Error(str_cat("tokenizer: cannot read ", path.string()));
  return text;
}

}  // namespace
}  // namespace deepinfer::tokenizer_internal

namespace deepinfer {

namespace fs = std::filesystem;
using namespace tokenizer_internal;

Tokenizer::Tokenizer() : impl_(new TokenizerState) {}
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::load(const std::string& path) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  const fs::path json_path = is_dir ? fs::path(path) / "tokenizer.json" : fs::path(path);
  if (!fs::is_regular_file(json_path, ec)) {
    throw Error(str_cat("tokenizer: ", json_path.string(),
                        " does not exist (expected a directory with tokenizer.json, or the "
                        "tokenizer.json file)"));
  }
  const fs::path config_path = json_path.parent_path() / "tokenizer_config.json";
  const std::string config =
      fs::is_regular_file(config_path, ec) ? read_file(config_path) : std::string();
  return from_json(read_file(json_path), config, json_path.string());
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json,
                                                std::string_view config_json,
                                                const std::string& label) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  load_json(tokenizer_json, config_json, label, *t->impl_);
  return t;
}

// --- encode ---

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  const TokenizerState& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_bos) {
    if (m.bos < 0) {
      throw Error("tokenizer: encode(add_bos=true) but tokenizer_config.json names no bos_token");
    }
    out.push_back(m.bos);
  }
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::lossy(text);
    text = repaired;
  }

  // Tokens marked non-normalized are matched on the raw text, the others on normalized text;
  // the text between them is pre-tokenized, then each piece goes through BPE.
  std::vector<AddedTokenMatcher::Segment> raw_segments, segments;
  Pieces pieces;
  m.raw_added.split(text, raw_segments);
  for (const auto& seg : raw_segments) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
      continue;
    }
    std::string normalized;
    std::string_view part = text.substr(seg.begin, seg.end - seg.begin);
    if (!m.normalizers.empty()) {
      normalized.assign(part);
      for (const auto form : m.normalizers) normalized = normalize(normalized, form);
      part = normalized;
    }
    m.normalized_added.split(part, segments);
    for (const auto& s : segments) {
      if (s.id >= 0) {
        out.push_back(s.id);
        continue;
      }
      pieces.items.clear();
      pre_tokenize(m.pre_tokenizer, part.substr(s.begin, s.end - s.begin), pieces);
      for (const std::string_view piece : pieces.items) m.bpe->encode_word(piece, out);
    }
  }
  return out;
}

// --- decode and lookups ---

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special,
                              std::span<const int32_t> keep) const {
  const TokenizerState& m = *impl_;
  std::string bytes;
  for (const int32_t id : ids) {
    const TokenizerState::Entry* e = m.entry(id);
    if (!e || (skip_special && e->special && !std::binary_search(keep.begin(), keep.end(), id)))
      continue;
    bytes += e->bytes;
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
  const TokenizerState::Entry* e = impl_->entry(id);
  if (!e) {
    throw Error(str_cat("tokenizer: unknown token id ", id, " (vocabulary has ids 0..",
                        int64_t(impl_->ids.size()) - 1, ")"));
  }
  return e->token;
}

bool Tokenizer::is_special(int32_t id) const {
  const TokenizerState::Entry* e = impl_->entry(id);
  return e && e->special;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  const TokenizerState::Entry* e = impl_->entry(id);
  return e ? std::string_view(e->bytes) : std::string_view();
}

int32_t Tokenizer::eos_id() const {
  return impl_->eos;
}

// --- streaming detokenizer ---

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id) &&
      !std::binary_search(keep_.begin(), keep_.end(), id))
    return {};
  pending_ += tokenizer_.token_bytes(id);
  const size_t stable = utf8::stable_prefix(pending_);
  if (stable == 0) return {};
  std::string out = utf8::lossy(std::string_view(pending_).substr(0, stable));
  pending_.erase(0, stable);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = utf8::lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace deepinfer
