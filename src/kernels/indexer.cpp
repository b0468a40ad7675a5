#include "kernels/indexer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace deepinfer {

void indexer_scores_ref(const IndexerScoreArgs& a) {
  for (int64_t t = 0; t < a.T; ++t) {
    if (t >= a.visible) {
      a.scores[t] = -INFINITY;
      continue;
    }
    const float* k = a.keys + t * a.Di;
    double sd = 0;
    float sf = 0;
    for (int64_t h = 0; h < a.Hi; ++h) {
      float d =
          a.exact ? dot_f64(a.qi + h * a.Di, k, a.Di) : canonical_dot(a.qi + h * a.Di, k, a.Di);
      if (a.bf16) d = round_bf16(d);
      float term = std::max(d, 0.0f) * a.w[h];
      if (a.bf16) term = round_bf16(term);
      sd += term;
      sf += term;
    }
    const float s = a.exact ? f32(sd) : sf;
    a.scores[t] = a.bf16 ? round_bf16(s) : s;
  }
}

void indexer_scores(const IndexerScoreArgs& a) {
  indexer_scores_ref(a);
}

void candidate_mask(const float* scores, int64_t T, int64_t visible, int64_t cb, int64_t ck,
                    uint8_t* mask) {
  std::fill(mask, mask + T, uint8_t(0));
  const int64_t nblocks = (T + cb - 1) / cb;
  if (nblocks == 0) return;
  std::vector<float> bs(size_t(nblocks), -INFINITY);
  for (int64_t t = 0; t < T; ++t) bs[size_t(t / cb)] = std::max(bs[size_t(t / cb)], scores[t]);
  if (visible > 0) bs[size_t((visible - 1) / cb)] = INFINITY;
  std::vector<int64_t> order(static_cast<size_t>(nblocks));
  for (int64_t b = 0; b < nblocks; ++b) order[size_t(b)] = b;
  const int64_t keep = std::min(ck, nblocks);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int64_t x, int64_t y) {
    return bs[size_t(x)] != bs[size_t(y)] ? bs[size_t(x)] > bs[size_t(y)] : x < y;
  });
  for (int64_t i = 0; i < keep; ++i) {
    const int64_t b = order[size_t(i)];
    if (bs[size_t(b)] == -INFINITY) continue;
    for (int64_t t = b * cb; t < std::min(T, (b + 1) * cb); ++t) mask[t] = 1;
  }
}

int64_t select_top(ScoredId* in, int64_t n, int64_t k, ScoredId* out) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i)
    if (in[i].score != -INFINITY) in[m++] = in[i];
  const int64_t keep = std::min(k, m);
  std::partial_sort(in, in + keep, in + m, better);
  std::copy(in, in + keep, out);
  return keep;
}

int64_t topk_rows(const float* scores, int64_t visible, int64_t k, int32_t* out) {
  std::vector<int32_t> rows;
  rows.reserve(static_cast<size_t>(visible));
  for (int64_t t = 0; t < visible; ++t)
    if (scores[t] != -INFINITY) rows.push_back(int32_t(t));
  const int64_t n = std::min<int64_t>(k, int64_t(rows.size()));
  std::partial_sort(rows.begin(), rows.begin() + n, rows.end(), [&](int32_t x, int32_t y) {
    return scores[x] != scores[y] ? scores[x] > scores[y] : x < y;
  });
  std::sort(rows.begin(), rows.begin() + n);
  std::copy(rows.begin(), rows.begin() + n, out);
  return n;
}

}  // namespace deepinfer
