#include "tokenizer/tokenizer.h"

#include <algorithm>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace deepinfer {

namespace fs = std::filesystem;
using tokenizer_internal::AddedTokenMatcher;
using tokenizer_internal::Pieces;
using tokenizer_internal::TokenizerState;

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(str_cat("tokenizer: cannot open ", path.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(str_cat("tokenizer: cannot read ", path.string()));
  return ss.str();
}

}  // namespace

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
  tokenizer_internal::load_tokenizer_json(tokenizer_json, config_json, label, *t->impl_);
  return t;
}

// --- encode ---

void tokenizer_internal::TokenizerState::encode_plain(std::string_view text,
                                                      std::vector<int32_t>& out) const {
  if (text.empty()) return;
  Pieces pieces;
  pre_tokenizer.split(text, pieces);
  for (const std::string_view piece : pieces.items) bpe->encode_word(piece, out);
}

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

  // Tokens marked non-normalized are matched on the raw text, the others on normalized text.
  std::vector<AddedTokenMatcher::Segment> raw_segments, segments;
  if (m.raw_added) {
    m.raw_added->split(text, raw_segments);
  } else {
    raw_segments.push_back({0, text.size(), -1});
  }
  for (const auto& seg : raw_segments) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
      continue;
    }
    std::string normalized;
    std::string_view part = text.substr(seg.begin, seg.end - seg.begin);
    if (!m.normalizers.empty()) {
      normalized.assign(part);
      for (const auto form : m.normalizers) {
        normalized = tokenizer_internal::normalize(normalized, form);
      }
      part = normalized;
    }
    if (!m.normalized_added) {
      m.encode_plain(part, out);
      continue;
    }
    segments.clear();
    m.normalized_added->split(part, segments);
    for (const auto& s : segments) {
      if (s.id >= 0) {
        out.push_back(s.id);
      } else {
        m.encode_plain(part.substr(s.begin, s.end - s.begin), out);
      }
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
    if (id < 0 || size_t(id) >= m.tokens.size() || !m.has_token[id]) continue;
    if (skip_special && m.special[id] && !std::binary_search(keep.begin(), keep.end(), id))
      continue;
    bytes += m.bytes[id];
  }
  return utf8::lossy(bytes);
}

std::vector<int32_t> Tokenizer::special_ids() const {
  std::vector<int32_t> out;
  for (const auto& [content, id] : impl_->added)
    if (impl_->special[size_t(id)]) out.push_back(id);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int32_t Tokenizer::vocab_size() const {
  return impl_->n_distinct;
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  const std::string key(token);
  if (const auto it = impl_->added.find(key); it != impl_->added.end()) return it->second;
  if (const auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return -1;
}

std::string_view Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->tokens.size() || !impl_->has_token[id]) {
    throw Error(str_cat("tokenizer: unknown token id ", id, " (vocabulary has ids 0..",
                        int64_t(impl_->tokens.size()) - 1, ")"));
  }
  return impl_->tokens[id];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->special.size() && impl_->special[id];
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->bytes.size()) return {};
  return impl_->bytes[id];
}

int32_t Tokenizer::bos_id() const {
  return impl_->bos;
}
int32_t Tokenizer::eos_id() const {
  return impl_->eos;
}

}  // namespace deepinfer
