// Whether a text is a complete sentence of a grammar, checked through the public Matcher.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace deepinfer::grammar {

// Feeds `text` one byte at a time, each as the vocabulary's one-byte token for it (a byte the
// vocabulary cannot spell alone does not match), and asks whether the output is complete.
inline bool matches(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  const TokenVocab& v = g->vocab();
  std::vector<int32_t> byte_token(256, -1);
  for (int32_t id = 0; id < v.size(); ++id)
    if (id != v.eos() && v.bytes(id).size() == 1) byte_token[uint8_t(v.bytes(id)[0])] = id;
  Matcher m(g);
  for (const char c : text)
    if (!m.accept(byte_token[uint8_t(c)])) return false;
  return m.complete();
}

}  // namespace deepinfer::grammar
