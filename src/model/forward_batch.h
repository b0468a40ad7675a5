// The input of one model step (DESIGN.md §1, §4.5). Built by the runner from the scheduler's
// output, read by Model::forward. Plain data: nothing here owns KV bytes or knows about requests.
//
// A step holds several sequences, each a run of consecutive tokens at positions
// [start_pos, start_pos + n_tokens): a prompt chunk starting anywhere (start_pos > 0 included) or
// one decode token. Tokens of all sequences are flattened into `tokens` in sequence order.
// Rows [n_tokens - n_padding, n_tokens) of a sequence are placeholders (prefill buckets): they are
// computed like any row but write no state and are seen by no real token.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_cache.h"

namespace deepinfer {

struct ForwardSeq {
  int64_t start_pos = 0;  // position of the sequence's first token in this step
  int64_t n_tokens = 0;   // rows of this sequence in the step (real + padding)
  int64_t n_padding = 0;  // trailing placeholder rows
  SeqKv kv;               // its slot and block table
  // Logits are produced for rows [logits_from, n_tokens - n_padding) of this sequence
  // (n_tokens - n_padding for none, n_tokens - n_padding - 1 for the last real token).
  int64_t logits_from = 0;
};

struct ForwardBatch {
  std::vector<int32_t> tokens;   // [total rows]
  std::vector<ForwardSeq> seqs;  // in the order their rows appear in `tokens`

  int64_t n_rows() const { return int64_t(tokens.size()); }
  int64_t n_logit_rows() const {
    int64_t n = 0;
    for (const auto& s : seqs) n += s.n_tokens - s.n_padding - s.logits_from;
    return n;
  }
};

}  // namespace deepinfer
