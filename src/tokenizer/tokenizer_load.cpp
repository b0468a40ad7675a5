// tokenizer.json reader. Every field is checked; anything this tokenizer cannot reproduce
// exactly (other model types, byte fallback, unsupported normalizers or pre-tokenizers) is
// refused with an error naming the file and the field rather than encoded differently.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer_internal {

using nlohmann::json;

// --- byte-level alphabet ---

const std::vector<char32_t>& byte_to_char() {
  static const std::vector<char32_t> table = [] {
    // Printable Latin-1 bytes stand for themselves; the others are shifted past U+00FF in
    // byte order.
    std::vector<char32_t> t(256);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[b] = printable ? char32_t(b) : next++;
    }
    return t;
  }();
  return table;
}

int char_to_byte(char32_t cp) {
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(512, -1);
    for (int b = 0; b < 256; ++b) inv[byte_to_char()[b]] = b;
    return inv;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

namespace {

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
};

json parse_json(std::string_view text, const std::string& label) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw Error(str_cat(label, ": invalid JSON: ", e.what()));
  }
}

// --- sections ---

void set_token(TokenizerState& impl, int32_t id, const std::string& content) {
  if (size_t(id) >= impl.tokens.size()) {
    impl.tokens.resize(size_t(id) + 1);
    impl.has_token.resize(size_t(id) + 1, 0);
    impl.special.resize(size_t(id) + 1, 0);
  }
  impl.tokens[id] = content;
  impl.has_token[id] = 1;
}

void read_normalizer(const Reader& r, const json& node, const std::string& where,
                     std::vector<NormalForm>& out) {
  if (node.is_null()) return;
  const std::string type = r.string_field(node, "type", where);
  if (type == "Sequence") {
    const json& list = r.field(node, "normalizers", where);
    if (!list.is_array()) r.fail(where + ".normalizers", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      read_normalizer(r, list[i], str_cat(where, ".normalizers[", i, "]"), out);
    }
  } else if (type == "NFC") {
    out.push_back(NormalForm::kNFC);
  } else if (type == "NFD") {
    out.push_back(NormalForm::kNFD);
  } else if (type == "NFKC") {
    out.push_back(NormalForm::kNFKC);
  } else if (type == "NFKD") {
    out.push_back(NormalForm::kNFKD);
  } else {
    r.fail(where + ".type", "unsupported normalizer \"" + type + "\"");
  }
}

SplitBehavior read_behavior(const Reader& r, const json& node, const std::string& where) {
  const std::string b = r.string_field(node, "behavior", where);
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
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
    const json& list = r.field(node, "pretokenizers", where);
    if (!list.is_array()) r.fail(where + ".pretokenizers", "expected an array");
    for (size_t i = 0; i < list.size(); ++i) {
      read_pre_tokenizer(r, list[i], str_cat(where, ".pretokenizers[", i, "]"), impl, byte_level);
    }
  } else if (type == "Split") {
    PreTokenizerStep step;
    const json& pattern = r.field(node, "pattern", where);
    if (pattern.is_object() && pattern.contains("Regex")) {
      step.regex = std::make_unique<Regex>(r.string_field(pattern, "Regex", where + ".pattern"),
                                           r.label + ": " + where);
    } else if (pattern.is_object() && pattern.contains("String")) {
      step.literal = r.string_field(pattern, "String", where + ".pattern");
    } else {
      r.fail(where + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    step.behavior = read_behavior(r, node, where);
    step.invert = r.bool_field(node, "invert", where, false);
    impl.pre_tokenizer.add(std::move(step));
  } else if (type == "ByteLevel") {
    PreTokenizerStep step;
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = r.bool_field(node, "add_prefix_space", where, true);
    if (r.bool_field(node, "use_regex", where, true)) {
      step.regex = std::make_unique<Regex>(kByteLevelPattern, r.label + ": " + where);
    }
    impl.pre_tokenizer.add(std::move(step));
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
  MergeTable table;
  table.reserve(merges.size());
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
    utf8::append(ch, byte_to_char()[b]);
    const auto it = impl.vocab.find(ch);
    if (it != impl.vocab.end()) byte_ids[b] = it->second;
  }
  std::unordered_map<std::string, int32_t> whole_words;
  if (ignore_merges) {
    for (const auto& [token, id] : impl.vocab) {
      std::string raw;
      bool ok = true;
      for (size_t p = 0; p < token.size() && ok;) {
        const utf8::Step st = utf8::step(token, p);
        const int b = st.kind == utf8::Step::Kind::kChar ? char_to_byte(st.cp) : -1;
        ok = b >= 0;
        raw.push_back(char(b));
        p += st.len;
      }
      if (ok) whole_words.emplace(std::move(raw), id);
    }
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
    set_token(impl, id, content);
    impl.special[id] = r.bool_field(t, "special", where, false) ? 1 : 0;
    impl.added[content] = id;
  }
  if (!raw.empty()) impl.raw_added.emplace(std::move(raw));
  if (!normalized.empty()) impl.normalized_added.emplace(std::move(normalized));
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
  if (const auto it = impl.added.find(content); it != impl.added.end()) return it->second;
  if (const auto it = impl.vocab.find(content); it != impl.vocab.end()) return it->second;
  return -1;
}

}  // namespace

void load_tokenizer_json(std::string_view tokenizer_json, std::string_view config_json,
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
  impl.bytes.resize(impl.tokens.size());
  for (size_t id = 0; id < impl.tokens.size(); ++id) {
    if (!impl.has_token[id]) continue;
    const std::string& token = impl.tokens[id];
    std::string out;
    bool mapped = true;
    for (size_t p = 0; p < token.size() && mapped;) {
      const utf8::Step st = utf8::step(token, p);
      const int b = st.kind == utf8::Step::Kind::kChar ? char_to_byte(st.cp) : -1;
      mapped = b >= 0;
      out.push_back(char(b));
      p += st.len;
    }
    impl.bytes[id] = mapped ? std::move(out) : token;
  }
  std::unordered_map<std::string, int32_t> distinct = impl.vocab;
  distinct.insert(impl.added.begin(), impl.added.end());
  impl.n_distinct = int32_t(distinct.size());

  if (!config_json.empty()) {
    const std::string config_label = label + " (tokenizer_config.json)";
    const json config = parse_json(config_json, config_label);
    const Reader rc{config_label};
    if (!config.is_object()) rc.fail("(root)", "expected an object");
    impl.bos = config_token_id(rc, config, "bos_token", impl);
    impl.eos = config_token_id(rc, config, "eos_token", impl);
  }
}

}  // namespace deepinfer::tokenizer_internal
