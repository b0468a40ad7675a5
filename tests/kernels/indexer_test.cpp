// Indexer: the vector scores against indexer_scores_ref (bit-exact) over head counts, head dims,
// row counts and visibility, bf16 and fp32 numerics, ISAs and thread counts; select_top, and the
// top-k list and candidate blocks built on it, against a full sort with many ties.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/indexer.h"
#include "kernels/quant.h"

namespace deepinfer::testing {
namespace {

TEST(IndexerFast, ScoresMatchRef) {
  KernelEnvGuard guard;
  uint64_t seed = 1;
  for (int64_t Hi : {1, 4, 16, 17, 32, 64})
    for (int64_t Di : {32, 128})
      for (int64_t T : {1, 5, 63, 200})
        for (int mode = 0; mode < 2; ++mode) {
          std::mt19937_64 rng(seed++);
          std::normal_distribution<float> nd;
          std::vector<float> qi(size_t(Hi * Di)), keys(size_t(T * Di)), w(static_cast<size_t>(Hi));
          for (auto& v : qi) v = nd(rng);
          for (auto& v : keys) v = nd(rng);
          for (auto& v : w) v = round_bf16(nd(rng) / 64);
          if (mode == 0) {  // what the model feeds: fp4 (variant I) values
            for (int64_t h = 0; h < Hi; ++h) fp4i_qdq(qi.data() + h * Di, Di);
            for (int64_t t = 0; t < T; ++t) fp4i_qdq(keys.data() + t * Di, Di);
          }
          for (int64_t visible : {int64_t(0), T / 2, T}) {
            IndexerScoreArgs a{qi.data(), w.data(), keys.data(), T,     visible,
                               Hi,        Di,       mode == 0,   false, nullptr};
            std::vector<float> want(static_cast<size_t>(T));
            a.scores = want.data();
            indexer_scores_ref(a);
            for (Isa isa : machine_isas())
              for (int threads : {1, 2}) {
                set_cpu_isa(isa);
                if (ThreadPool::global().size() != threads) ThreadPool::set_global_threads(threads);
                std::vector<float> got(static_cast<size_t>(T), 123.0f);
                a.scores = got.data();
                indexer_scores(a);
                const int64_t d = first_diff(want.data(), got.data(), T);
                ASSERT_EQ(d, -1) << "Hi=" << Hi << " Di=" << Di << " T=" << T << " visible "
                                 << visible << " mode " << mode << " isa=" << isa_name(isa)
                                 << ": row " << d << " ref " << want[size_t(d)] << " got "
                                 << got[size_t(d)];
              }
          }
        }
}

// Scores with many exact ties (few distinct values) and some -inf.
std::vector<float> tied_scores(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> s(static_cast<size_t>(n));
  for (auto& v : s) v = rng() % 7 == 0 ? -INFINITY : float(int(rng() % 9)) * 0.25f;
  return s;
}

// The top-k list of V41_SPEC.md §6.6 over select_top, as model/indexer.cpp builds it: the
// min(k, visible) best rows among t < visible (ties -> lower row), ascending.
int64_t topk_rows(const float* scores, int64_t visible, int64_t k, int32_t* out) {
  std::vector<ScoredId> in, best(static_cast<size_t>(k));
  for (int64_t t = 0; t < visible; ++t) in.push_back({scores[t], int32_t(t)});
  const int64_t n = select_top(in.data(), int64_t(in.size()), k, best.data());
  for (int64_t i = 0; i < n; ++i) out[i] = best[size_t(i)].id;
  std::sort(out, out + n);
  return n;
}

// The candidate source's block filter (§6.5) over select_top: blocks of `cb` rows scored by their
// max, the block of the newest visible row forced in, the best `ck` finite ones kept; mask[t] = 1
// for rows of kept blocks.
void candidate_mask(const float* scores, int64_t T, int64_t visible, int64_t cb, int64_t ck,
                    uint8_t* mask) {
  std::fill(mask, mask + T, uint8_t(0));
  std::vector<ScoredId> blocks, kept(static_cast<size_t>(ck));
  for (int64_t b = 0; b * cb < T; ++b) {
    float m = -INFINITY;
    for (int64_t t = b * cb; t < std::min(T, (b + 1) * cb); ++t) m = std::max(m, scores[t]);
    blocks.push_back({visible > 0 && b == (visible - 1) / cb ? INFINITY : m, int32_t(b)});
  }
  const int64_t n = select_top(blocks.data(), int64_t(blocks.size()), ck, kept.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t t = kept[size_t(i)].id * cb; t < std::min(T, (kept[size_t(i)].id + 1) * cb); ++t)
      mask[t] = 1;
}

TEST(IndexerSelect, TopkRowsIsTheBestVisibleAscending) {
  for (int64_t n : {0, 1, 10, 300, 2000})
    for (int64_t k : {1, 7, 64, 512}) {
      const auto s = tied_scores(n, uint64_t(n * 31 + k));
      const int64_t visible = n * 3 / 4;
      std::vector<int32_t> got(static_cast<size_t>(k));
      const int64_t m = topk_rows(s.data(), visible, k, got.data());
      // Independent: stable sort of the visible finite rows by score, descending.
      std::vector<int32_t> rows;
      for (int64_t t = 0; t < visible; ++t)
        if (s[size_t(t)] != -INFINITY) rows.push_back(int32_t(t));
      std::stable_sort(rows.begin(), rows.end(),
                       [&](int32_t x, int32_t y) { return s[size_t(x)] > s[size_t(y)]; });
      rows.resize(std::min<size_t>(rows.size(), size_t(k)));
      std::sort(rows.begin(), rows.end());
      ASSERT_EQ(m, int64_t(rows.size())) << n << " " << k;
      for (int64_t i = 0; i < m; ++i) ASSERT_EQ(got[size_t(i)], rows[size_t(i)]) << n << " " << k;
    }
}

TEST(IndexerSelect, SelectTopBestFirst) {
  for (int64_t n : {0, 5, 1000})
    for (int64_t k : {1, 3, 100, 2000}) {
      const auto s = tied_scores(n, uint64_t(n + k));
      std::vector<ScoredId> in(static_cast<size_t>(n)), out(static_cast<size_t>(k));
      for (int64_t i = 0; i < n; ++i) in[size_t(i)] = {s[size_t(i)], int32_t(i * 3 % (n + 1))};
      std::vector<ScoredId> ref;
      for (const auto& e : in)
        if (e.score != -INFINITY) ref.push_back(e);
      std::sort(ref.begin(), ref.end(), better);
      ref.resize(std::min<size_t>(ref.size(), size_t(k)));
      const int64_t m = select_top(in.data(), n, k, out.data());
      ASSERT_EQ(m, int64_t(ref.size()));
      for (int64_t i = 0; i < m; ++i) {
        EXPECT_EQ(out[size_t(i)].id, ref[size_t(i)].id);
        EXPECT_EQ(out[size_t(i)].score, ref[size_t(i)].score);
      }
    }
}

// select_best keeps select_top's entries (in any order); sort_ids orders distinct ids as a sort
// does, dense (the bitmap) and sparse (comparisons), with zero and the largest ids.
TEST(IndexerSelect, SelectBestKeepsTheTopSetAndSortIdsAscends) {
  for (int64_t n : {0, 5, 1000})
    for (int64_t k : {1, 3, 100, 2000}) {
      const auto s = tied_scores(n, uint64_t(n * 7 + k));
      std::vector<ScoredId> in(static_cast<size_t>(n)), a(static_cast<size_t>(k)), b(a);
      for (int64_t i = 0; i < n; ++i) in[size_t(i)] = {s[size_t(i)], int32_t((n - 1 - i) * 5)};
      std::vector<ScoredId> in2 = in;
      const int64_t m = select_top(in.data(), n, k, a.data());
      ASSERT_EQ(select_best(in2.data(), n, k, b.data()), m);
      std::vector<int32_t> ia, ib;
      for (int64_t i = 0; i < m; ++i) ia.push_back(a[size_t(i)].id), ib.push_back(b[size_t(i)].id);
      std::sort(ia.begin(), ia.end());
      sort_ids(ib.data(), m);
      EXPECT_EQ(ia, ib) << n << " " << k;
    }
  std::mt19937_64 rng(9);
  for (int32_t range : {1, 64, 65, 1000, 100000, 2000000000})
    for (int64_t n : {1, 2, 50, 600}) {
      std::vector<int32_t> ids;
      for (int64_t i = 0; i < n && i < range; ++i) ids.push_back(int32_t(rng() % uint64_t(range)));
      if (range > 1) ids.push_back(range - 1);
      ids.push_back(0);
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      std::vector<int32_t> want = ids;
      std::shuffle(ids.begin(), ids.end(), rng);
      sort_ids(ids.data(), int64_t(ids.size()));
      EXPECT_EQ(ids, want) << range << " " << n;
    }
}

TEST(IndexerSelect, CandidateMaskKeepsBestBlocksAndTheNewest) {
  const int64_t T = 203, cb = 8, ck = 5;
  const auto s = tied_scores(T, 5);
  for (int64_t visible : {int64_t(0), int64_t(1), int64_t(100), T}) {
    std::vector<uint8_t> mask(static_cast<size_t>(T));
    candidate_mask(s.data(), T, visible, cb, ck, mask.data());
    const int64_t nb = (T + cb - 1) / cb;
    std::vector<std::pair<float, int64_t>> blocks;
    for (int64_t b = 0; b < nb; ++b) {
      float m = -INFINITY;
      for (int64_t t = b * cb; t < std::min(T, (b + 1) * cb); ++t) m = std::max(m, s[size_t(t)]);
      if (visible > 0 && b == (visible - 1) / cb) m = INFINITY;
      blocks.push_back({m, b});
    }
    std::stable_sort(blocks.begin(), blocks.end(),
                     [](const auto& x, const auto& y) { return x.first > y.first; });
    std::vector<uint8_t> want(static_cast<size_t>(T), 0);
    for (int64_t i = 0; i < std::min(ck, nb); ++i)
      if (blocks[size_t(i)].first != -INFINITY)
        for (int64_t t = blocks[size_t(i)].second * cb;
             t < std::min(T, (blocks[size_t(i)].second + 1) * cb); ++t)
          want[size_t(t)] = 1;
    EXPECT_EQ(mask, want) << "visible " << visible;
  }
}

}  // namespace
}  // namespace deepinfer::testing
