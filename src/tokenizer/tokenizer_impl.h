// State of a loaded Tokenizer, shared by the loader (tokenizer_load.cpp) and the encoder and
// decoder (tokenizer.cpp).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::tokenizer_internal {

struct TokenizerState {
  // Indexed by id, [max_id + 1]; ids without a token have has_token = 0.
  std::vector<std::string> tokens;
  std::vector<std::string> bytes;  // what each id decodes to
  std::vector<uint8_t> has_token;
  std::vector<uint8_t> special;
  int32_t n_distinct = 0;

  std::unordered_map<std::string, int32_t> vocab;  // model vocabulary
  std::unordered_map<std::string, int32_t> added;  // added tokens by content

  std::optional<AddedTokenMatcher> raw_added;         // non-normalized
  std::optional<AddedTokenMatcher> normalized_added;  // normalized
  std::vector<NormalForm> normalizers;                // applied in order
  PreTokenizer pre_tokenizer;
  std::optional<BpeModel> bpe;

  int32_t bos = -1, eos = -1;

  // Encodes text that holds no added token: pre-tokenize, then BPE each piece.
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
};

// Parses tokenizer.json / tokenizer_config.json contents into `impl`.
void load_tokenizer_json(std::string_view tokenizer_json, std::string_view config_json,
                         const std::string& label, TokenizerState& impl);

// GPT-2's reversible byte <-> printable character map: byte b is represented by code point
// byte_to_char()[b]; char_to_byte(cp) is -1 for code points outside the alphabet.
const std::vector<char32_t>& byte_to_char();
int char_to_byte(char32_t cp);

}  // namespace deepinfer::tokenizer_internal
