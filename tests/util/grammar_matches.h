// Whether a text is a complete sentence of a grammar, checked through the public Matcher.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace deepinfer::grammar {

// The vocabulary's one-byte token for each byte (-1 where none spells it alone), built once
// per vocabulary: the table of the last one asked for is kept with a grammar that holds it,
// and while that grammar lives, the vocabulary's address cannot name another one.
inline const std::vector<int32_t>& byte_tokens(const std::shared_ptr<const Grammar>& g) {
  struct Cache {
    std::weak_ptr<const Grammar> owner;
    std::vector<int32_t> byte_token;
  };
  thread_local Cache cache;
  const std::shared_ptr<const Grammar> owner = cache.owner.lock();
  if (owner && &owner->vocab() == &g->vocab()) return cache.byte_token;
  const TokenVocab& v = g->vocab();
  cache.owner = g;
  cache.byte_token.assign(256, -1);
  for (int32_t id = 0; id < v.size(); ++id)
    if (id != v.eos() && v.bytes(id).size() == 1) cache.byte_token[uint8_t(v.bytes(id)[0])] = id;
  return cache.byte_token;
}

// Feeds `text` one byte at a time, each as the vocabulary's one-byte token for it (a byte the
// vocabulary cannot spell alone does not match), and asks whether the output is complete.
inline bool matches(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  const std::vector<int32_t>& byte_token = byte_tokens(g);
  Matcher m(g);
  for (const char c : text)
    if (!m.accept(byte_token[uint8_t(c)])) return false;
  return m.complete();
}

}  // namespace deepinfer::grammar
