// Batch invariance of the model: a token's logits are bit-identical however its prompt is
// chunked and whatever else shares the step (V41_SPEC.md §12; DESIGN.md).
#include <gtest/gtest.h>

#include <cstring>

#include "model_harness.h"

namespace deepinfer::testing {
namespace {

class Invariance : public ::testing::TestWithParam<std::tuple<std::string, Numerics>> {};

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST_P(Invariance, ChunkingGivesIdenticalLogits) {
  const auto& [preset, numerics] = GetParam();
  LoadedModel m = load_model(preset, numerics);
  const int64_t n = 40;
  const auto tokens = random_tokens(n, m.model->config().vocab_size, 11);
  const auto whole = run_chunks(*m.model, tokens, {n});
  const auto stepwise = run_chunks(*m.model, tokens, std::vector<int64_t>(size_t(n), 1));
  EXPECT_TRUE(bit_equal(whole, stepwise)) << "prefill vs token-by-token";
  for (int64_t chunk : {2, 3, 5, 7, 16}) {
    std::vector<int64_t> sizes;
    for (int64_t p = 0; p < n; p += chunk) sizes.push_back(std::min(chunk, n - p));
    EXPECT_TRUE(bit_equal(whole, run_chunks(*m.model, tokens, sizes))) << "chunk " << chunk;
  }
}

TEST_P(Invariance, BatchGivesIdenticalLogits) {
  const auto& [preset, numerics] = GetParam();
  LoadedModel m = load_model(preset, numerics);
  const int64_t V = m.model->config().vocab_size;
  const std::vector<int64_t> lens = {23, 9, 31, 1};
  const std::vector<int64_t> prefix = {10, 0, 30,
                                       0};  // a chunk, a prompt, a decode, a 1-token prompt
  std::vector<std::vector<int32_t>> seqs;
  for (size_t i = 0; i < lens.size(); ++i) seqs.push_back(random_tokens(lens[i], V, 100 + i));
  const auto batched = run_batched(*m.model, seqs, prefix);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto alone = run_chunks(*m.model, seqs[i], {int64_t(seqs[i].size())});
    std::vector<float> tail(alone.begin() + long(prefix[i] * V), alone.end());
    EXPECT_TRUE(bit_equal(tail, batched[i])) << "sequence " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, Invariance,
                         ::testing::Combine(::testing::Values("tiny", "tiny-b", "tiny-c"),
                                            ::testing::Values(Numerics::Fp32, Numerics::Bf16)),
                         [](const auto& info) {
                           std::string s =
                               std::get<0>(info.param) +
                               (std::get<1>(info.param) == Numerics::Fp32 ? "_fp32" : "_bf16");
                           for (auto& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace deepinfer::testing
