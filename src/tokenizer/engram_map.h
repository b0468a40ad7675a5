// Engram compressed token map (V41_SPEC.md §9.1): tokens that normalise alike share an id, so
// the Engram n-gram hashes see " The", "the" and "THE" as one token.
//
// For each id in [0, vocab_size): decode the id alone (special tokens kept, no clean-up). If the
// text holds U+FFFD (an incomplete UTF-8 sequence, typically), the key is the raw token string;
// otherwise the key is engram_normalize(text), or the text itself when that is empty. Distinct
// keys are numbered 0, 1, 2, ... in order of first appearance, scanning ids upwards.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deepinfer {

struct EngramTokenMap {
  std::vector<int32_t> compressed;    // [vocab_size]: raw id -> compressed id
  int32_t compressed_vocab_size = 0;  // number of distinct keys
};

EngramTokenMap build_engram_token_map(const Tokenizer& tokenizer);

// The normalisation of §9.1, in order: NFKC; NFD; remove combining marks (category M);
// lowercase each character; each run of [ \t\r\n] -> one space; a text that is exactly " "
// survives the strip (it is kept as " "); strip White_Space at both ends.
std::string engram_normalize(std::string_view text);

}  // namespace deepinfer
