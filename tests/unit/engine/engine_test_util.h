// Helpers shared by the engine unit tests.
#pragma once

#include <cstdint>

#include "engine/request.h"

namespace deepinfer::testing {

// A request of `prompt` copies of one token id that wants `max_tokens` tokens.
inline Request make_request(RequestId id, int64_t prompt, int64_t max_tokens) {
  Request r;
  r.id = id;
  r.prompt_ids.assign(size_t(prompt), 7);
  r.params.max_tokens = max_tokens;
  return r;
}

}  // namespace deepinfer::testing
