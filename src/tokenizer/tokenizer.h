// Byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (+ `tokenizer_config.json`).
//
// Encoding follows the reference `tokenizers` library step by step: added tokens are cut out
// first (leftmost, longest first; tokens marked non-normalized before the normalizer runs, the
// others after), the rest is normalized, split by the pre-tokenizer sequence (Split regexes,
// ByteLevel) and merged by BPE. Decoding concatenates each token's bytes (a byte-level token
// maps its characters back to bytes; a token with characters outside that alphabet, such as
// DeepSeek's `<｜begin▁of▁sentence｜>`, contributes its own UTF-8) and repairs the result to
// valid UTF-8, one U+FFFD per ill-formed part.
//
// Input that is not valid UTF-8 is repaired the same way before encoding, so
// encode(s) == encode(lossy(s)). Ids the tokenizer does not know decode to nothing, as in the
// reference.
//
// A Tokenizer is immutable after load and safe to use from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

namespace tokenizer_internal {
struct TokenizerState;
// tokenizer.json regexes get `\s` and `\S` rewritten to the Unicode White_Space property, which
// is what the reference's regex engine matches (PCRE2's own `\s` also takes U+180E). Exposed for
// tests.
std::string rewrite_whitespace_classes(const std::string& pattern);
}  // namespace tokenizer_internal

class Tokenizer {
 public:
  // `path` is a directory holding tokenizer.json (and optionally tokenizer_config.json), or the
  // tokenizer.json file itself (a tokenizer_config.json beside it is read too).
  static std::unique_ptr<Tokenizer> load(const std::string& path);
  // The same from file contents; `config_json` may be empty. `label` names the source in errors.
  static std::unique_ptr<Tokenizer> from_json(std::string_view tokenizer_json,
                                              std::string_view config_json,
                                              const std::string& label);
  ~Tokenizer();  // not copyable (the state is owned)

  // With `add_bos`, the bos_token of tokenizer_config.json comes first (an error where it names
  // no known token).
  std::vector<int32_t> encode(std::string_view text, bool add_bos = false) const;
  // With `skip_special`, special tokens produce no text, except those listed in `keep` (sorted).
  std::string decode(std::span<const int32_t> ids, bool skip_special = false,
                     std::span<const int32_t> keep = {}) const;

  // Number of distinct tokens, added tokens included (the reference's len(tokenizer)).
  int32_t vocab_size() const;
  // One past the largest id that has a token: every known id is below it (ids may have gaps).
  int32_t id_limit() const;
  // The token's string as stored in tokenizer.json (byte-level characters for BPE tokens);
  // throws deepinfer::Error for an unknown id.
  std::string_view id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // The bytes `id` contributes to decode() before UTF-8 repair; empty for an unknown id.
  std::string_view token_bytes(int32_t id) const;
  // The end of sequence from tokenizer_config.json; -1 when it is absent or names no known token.
  int32_t eos_id() const;

 private:
  Tokenizer();
  std::unique_ptr<tokenizer_internal::TokenizerState> impl_;
};

// Streaming detokenization: ids in, text out, one id at a time.
//
// Text is emitted only once it can no longer change: bytes that may still become a UTF-8
// character wait for the next ids, so a character is never split across outputs and the
// concatenation of every push() and the final flush() equals Tokenizer::decode() of all ids
// pushed, for any way of splitting them. An ill-formed sequence is emitted as U+FFFD as soon as
// it is known to be ill-formed.
class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object. With `skip_special`, special tokens produce no text,
  // except those in `keep` (sorted).
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = false,
                                  std::vector<int32_t> keep = {})
      : tokenizer_(tokenizer), skip_special_(skip_special), keep_(std::move(keep)) {}

  // The text that `id` completes (possibly empty).
  std::string push(int32_t id);
  // Whatever is still held back, repaired to valid UTF-8; the detokenizer is then empty.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> keep_;
  std::string pending_;
};

}  // namespace deepinfer
