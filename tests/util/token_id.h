// A token's id found through the tokenizer's public accessors.
#pragma once

#include <cstdint>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace deepinfer {

// The id whose token (as stored in tokenizer.json) is `token`, or -1: a scan of the known ids
// (an unknown id contributes no bytes) below the tokenizer's id limit.
inline int32_t token_id(const Tokenizer& t, std::string_view token) {
  for (int32_t id = 0; id < t.id_limit(); ++id)
    if (!t.token_bytes(id).empty() && t.id_to_token(id) == token) return id;
  return -1;
}

}  // namespace deepinfer
