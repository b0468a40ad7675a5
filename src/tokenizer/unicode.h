// Unicode character predicates the tokenizer needs beyond what its regexes cover.
#pragma once

#include <cstddef>
#include <string_view>

namespace deepinfer::unicode {

// The White_Space property.
bool is_white_space(char32_t cp);

// A "word" character as regex `\w` defines it: letters, marks, decimal digits, connector
// punctuation and the joiners.
bool is_word_char(char32_t cp);

// General category M (Mn, Mc, Me).
bool is_mark(char32_t cp);

// True if `text[..pos]` does not end with a word character.
bool at_word_boundary_before(std::string_view text, size_t pos);
// True if `text[pos..]` does not start with a word character.
bool at_word_boundary_after(std::string_view text, size_t pos);

// Start of the run of white space that ends at `pos`.
size_t whitespace_run_start(std::string_view text, size_t pos);
// End of the run of white space that starts at `pos`.
size_t whitespace_run_end(std::string_view text, size_t pos);

}  // namespace deepinfer::unicode
