#include "tokenizer/utf8.h"

#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"

namespace deepinfer::utf8 {

Step step(std::string_view s, size_t pos) {
  const auto byte = [&](size_t i) { return uint8_t(s[i]); };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) return {Step::Kind::kChar, 1, char32_t(b0)};

  // Table 3-7 of the Unicode standard: the lead byte (C2..F4) fixes the length, the payload
  // bits it carries and the range allowed for the second byte; later bytes are always 80..BF.
  if (b0 < 0xC2 || b0 > 0xF4) return {Step::Kind::kInvalid, 1, 0};
  const uint32_t len = b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
  char32_t cp = b0 & (0x7F >> len);
  const uint8_t lo = b0 == 0xE0 ? 0xA0 : b0 == 0xF0 ? 0x90 : 0x80;
  const uint8_t hi = b0 == 0xED ? 0x9F : b0 == 0xF4 ? 0x8F : 0xBF;
  for (uint32_t k = 1; k < len; ++k) {
    if (pos + k >= s.size()) return {Step::Kind::kTruncated, k, 0};
    const uint8_t b = byte(pos + k);
    const uint8_t min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) return {Step::Kind::kInvalid, k, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Step::Kind::kChar, len, cp};
}

bool is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    // ASCII runs dominate real text; skip them eight bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const Step st = step(s, i);
    if (st.kind != Step::Kind::kChar) return false;
    i += st.len;
  }
  return true;
}

std::string lossy(std::string_view s) {
  if (is_valid(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    const Step st = step(s, i);
    out.append(st.kind == Step::Kind::kChar ? s.substr(i, st.len) : kReplacement);
    i += st.len;
  }
  return out;
}

size_t stable_prefix(std::string_view s) {
  // Only the last (at most four) bytes can be a truncated sequence, but where the last sequence
  // starts depends on how the bytes before it were split, so walk back to a position that is
  // certainly a sequence start: ASCII, or a lead byte at most three bytes from the end.
  size_t start = s.size() > 4 ? s.size() - 4 : 0;
  while (start > 0 && (uint8_t(s[start]) & 0xC0) == 0x80) --start;
  // A continuation byte can only be consumed by a lead byte at most three bytes before it, so
  // from here on the split into sequences matches a scan from the beginning once it reaches a
  // byte that is not a continuation byte; scanning from `start` is therefore exact.
  for (size_t i = start; i < s.size();) {
    const Step st = step(s, i);
    if (st.kind == Step::Kind::kTruncated) return i;
    i += st.len;
  }
  return s.size();
}

void append(std::string& out, char32_t cp) {
  utf8proc_uint8_t buf[4];
  out.append(reinterpret_cast<const char*>(buf),
             size_t(utf8proc_encode_char(utf8proc_int32_t(cp), buf)));
}

bool is_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

std::string normalize(std::string_view text, NormalForm form) {
  // Indexed by NormalForm: NFC, NFD, NFKC, NFKD.
  constexpr int kOptions[] = {UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE,
                              UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                              UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
  const int options = UTF8PROC_STABLE | kOptions[int(form)];
  if (text.empty()) return {};
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   utf8proc_ssize_t(text.size()), &dst, utf8proc_option_t(options));
  if (n < 0) throw Error(str_cat("unicode normalization failed: ", utf8proc_errmsg(n)));
  std::string out(reinterpret_cast<const char*>(dst), size_t(n));
  std::free(dst);
  return out;
}

}  // namespace deepinfer::utf8
