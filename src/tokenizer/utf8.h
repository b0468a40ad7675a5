// UTF-8 and Unicode helpers shared by the tokenizer, the streaming detokenizer, the completion
// parser and the Engram token map.
//
// Invalid input follows the Unicode "maximal subpart" practice (the one Rust's
// String::from_utf8_lossy and the WHATWG decoder use): every maximal prefix of a well-formed
// sequence that cannot be completed becomes one U+FFFD, and a byte that cannot start a sequence
// becomes one U+FFFD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deepinfer::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// What starts at one byte offset of a byte string.
struct Step {
  enum class Kind : uint8_t {
    kChar,       // a complete well-formed character of `len` bytes
    kInvalid,    // an ill-formed maximal subpart of `len` bytes (one U+FFFD)
    kTruncated,  // a well-formed prefix of `len` bytes cut by the end of the input
  };
  Kind kind;
  uint32_t len;
  char32_t cp;  // the code point for kChar
};

Step step(std::string_view s, size_t pos);

bool is_valid(std::string_view s);

// `s` with each ill-formed part (a truncated tail included) replaced by U+FFFD.
std::string lossy(std::string_view s);

// Length of the longest prefix of `s` whose lossy decoding no byte appended later can change:
// everything except a trailing truncated sequence.
size_t stable_prefix(std::string_view s);

void append(std::string& out, char32_t cp);

// The Unicode White_Space property.
bool is_white_space(char32_t cp);

// Unicode normalization forms a tokenizer.json normalizer may ask for.
enum class NormalForm : uint8_t { kNFC, kNFD, kNFKC, kNFKD };
std::string normalize(std::string_view text, NormalForm form);

}  // namespace deepinfer::utf8
