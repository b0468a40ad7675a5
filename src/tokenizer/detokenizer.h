// Streaming detokenization: ids in, text out, one id at a time.
//
// Text is emitted only once it can no longer change: bytes that may still become a UTF-8
// character wait for the next ids, so a character is never split across outputs and the
// concatenation of every push() and the final flush() equals Tokenizer::decode() of all ids
// pushed, for any way of splitting them. An ill-formed sequence is emitted as U+FFFD as soon as
// it is known to be ill-formed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deepinfer {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object. With `skip_special`, special tokens produce no text,
  // except those in `keep` (sorted).
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = false,
                                  std::vector<int32_t> keep = {})
      : tokenizer_(tokenizer), skip_special_(skip_special), keep_(std::move(keep)) {}

  // The text that `id` completes (possibly empty).
  std::string push(int32_t id);
  // Whatever is still held back, repaired to valid UTF-8; the detokenizer is then empty.
  std::string flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> keep_;
  std::string pending_;
};

}  // namespace deepinfer
