#include "tokenizer/engram_map.h"

#include <utf8proc.h>

#include <unordered_map>

#include "tokenizer/utf8.h"

namespace deepinfer {

std::string engram_normalize(std::string_view text) {
  const std::string nfd =
      utf8::normalize(utf8::normalize(text, utf8::NormalForm::kNFKC), utf8::NormalForm::kNFD);

  // Marks dropped, each character lowercased, each run of [ \t\r\n] made one space (no
  // lowercase mapping makes or takes a blank, so one pass does all three).
  std::u32string cps;
  for (size_t i = 0; i < nfd.size();) {
    const utf8::Step st = utf8::step(nfd, i);
    i += st.len;
    const char32_t cp = st.kind == utf8::Step::Kind::kChar ? st.cp : char32_t(0xFFFD);
    if (utf8proc_category_string(utf8proc_int32_t(cp))[0] == 'M') continue;  // a mark
    if (cp == U' ' || cp == U'\t' || cp == U'\r' || cp == U'\n') {
      if (cps.empty() || cps.back() != U' ') cps.push_back(U' ');
    } else if (cp == 0x130) {
      // Per-character full lowercase mapping; U+0130 is the one character whose lowercase is
      // two characters with no context condition.
      cps += U"i\u0307";
    } else {
      cps.push_back(char32_t(utf8proc_tolower(utf8proc_int32_t(cp))));
    }
  }
  if (cps == U" ") return " ";  // a lone space survives the strip

  size_t begin = 0, end = cps.size();
  while (begin < end && utf8::is_white_space(cps[begin])) ++begin;
  while (end > begin && utf8::is_white_space(cps[end - 1])) --end;
  std::string out;
  out.reserve(end - begin);
  for (size_t i = begin; i < end; ++i) utf8::append(out, cps[i]);
  return out;
}

EngramTokenMap build_engram_token_map(const Tokenizer& tokenizer) {
  EngramTokenMap map;
  const int32_t n = tokenizer.vocab_size();
  map.compressed.resize(size_t(n));
  std::unordered_map<std::string, int32_t> key_to_id;
  key_to_id.reserve(size_t(n));
  for (int32_t id = 0; id < n; ++id) {
    const std::string text = tokenizer.decode({&id, 1});
    // A token with U+FFFD in its text is never empty, so only a normalised key can be.
    std::string key = text.find(utf8::kReplacement) != std::string::npos
                          ? std::string(tokenizer.id_to_token(id))
                          : engram_normalize(text);
    if (key.empty()) key = text;
    const auto [it, inserted] = key_to_id.emplace(std::move(key), int32_t(key_to_id.size()));
    map.compressed[size_t(id)] = it->second;
  }
  map.compressed_vocab_size = int32_t(key_to_id.size());
  return map;
}

}  // namespace deepinfer
