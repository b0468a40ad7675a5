// Indexer selection of compressed rows (V41_SPEC.md §6.3-§6.6): weighted relu scores over the
// index keys, and the selection of the best rows or candidate blocks (model/indexer.cpp builds
// the candidate-block filter and the top-k list on it). Ties break toward the lower index
// everywhere.
#pragma once

#include <cstdint>

namespace deepinfer {

struct IndexerScoreArgs {
  const float* qi;    // [Hi, Di] fp4-I values of one query
  const float* w;     // [Hi] head weights
  const float* keys;  // [T, Di] fp4-I values
  int64_t T;          // rows that exist
  int64_t visible;    // rows this query may see (t < visible); the rest score -inf
  int64_t Hi, Di;
  bool bf16;      // round dot products, weighted terms and the sum to bf16 (§6.3)
  bool exact;     // dot products and the head sum in double (else canonical fp32 orders)
  float* scores;  // [T]
};

void indexer_scores(const IndexerScoreArgs& a);
void indexer_scores_ref(const IndexerScoreArgs& a);

// A scored row or block. Selection everywhere takes the highest scores, ties to the lower id.
struct ScoredId {
  float score;
  int32_t id;
};
inline bool better(const ScoredId& a, const ScoredId& b) {
  return a.score != b.score ? a.score > b.score : a.id < b.id;
}
// The best min(k, #finite) entries of in[0..n) with a finite score (-inf never), best first,
// written to out[0..k); returns how many. `in` is used as scratch.
int64_t select_top(ScoredId* in, int64_t n, int64_t k, ScoredId* out);
// The same entries in no particular order (for callers that order them by id).
int64_t select_best(ScoredId* in, int64_t n, int64_t k, ScoredId* out);
// Sorts ids[0..n) (distinct, non-negative) ascending: through a bitmap of the range when they
// are dense enough in it, else by comparisons.
void sort_ids(int32_t* ids, int64_t n);

}  // namespace deepinfer
