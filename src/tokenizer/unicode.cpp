#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include "tokenizer/utf8.h"

namespace deepinfer::unicode {

bool is_white_space(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_word_char(char32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(utf8proc_int32_t(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

bool is_mark(char32_t cp) {
  const auto cat = utf8proc_category(utf8proc_int32_t(cp));
  return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME;
}

namespace {

// The code point ending at `pos` (text is valid UTF-8) and where it starts.
char32_t char_before(std::string_view text, size_t pos, size_t& start) {
  start = pos - 1;
  while (start > 0 && (uint8_t(text[start]) & 0xC0) == 0x80) --start;
  return utf8::step(text, start).cp;
}

}  // namespace

bool at_word_boundary_before(std::string_view text, size_t pos) {
  if (pos == 0) return true;
  size_t start;
  return !is_word_char(char_before(text, pos, start));
}

bool at_word_boundary_after(std::string_view text, size_t pos) {
  return pos >= text.size() || !is_word_char(utf8::step(text, pos).cp);
}

size_t whitespace_run_start(std::string_view text, size_t pos) {
  while (pos > 0) {
    size_t start;
    if (!is_white_space(char_before(text, pos, start))) break;
    pos = start;
  }
  return pos;
}

size_t whitespace_run_end(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    const utf8::Step st = utf8::step(text, pos);
    if (!is_white_space(st.cp)) break;
    pos += st.len;
  }
  return pos;
}

}  // namespace deepinfer::unicode
