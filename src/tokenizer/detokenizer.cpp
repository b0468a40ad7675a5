#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

#include <algorithm>

namespace deepinfer {

std::string IncrementalDetokenizer::push(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id) &&
      !std::binary_search(keep_.begin(), keep_.end(), id))
    return {};
  pending_ += tokenizer_.token_bytes(id);
  const size_t stable = utf8::stable_prefix(pending_);
  if (stable == 0) return {};
  std::string out = utf8::lossy(std::string_view(pending_).substr(0, stable));
  pending_.erase(0, stable);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = utf8::lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace deepinfer
