#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/engine.h"

namespace deepinfer {
namespace {

struct Fixture {
  std::vector<float> logits;
  std::vector<int32_t> tokens{1, 2, 3};
  SamplingParams p;
  int32_t draw(uint64_t seed, TopLogprobs* top = nullptr) {
    Sampler s(int64_t(logits.size()));
    return s.sample({logits.data(), &p, &tokens, 3, seed}, top);
  }
};

TEST(Sampler, GreedyTakesTheLowestIdOnTies) {
  Fixture f;
  f.logits = {0.5f, 2.0f, 2.0f, 1.0f};
  f.p.temperature = 0;
  EXPECT_EQ(f.draw(1), 1);
  f.p.temperature = 1;
  f.p.top_k = 1;
  EXPECT_EQ(f.draw(1), 1);
}

TEST(Sampler, LogprobsOfTheRawDistribution) {
  Fixture f;
  f.logits = {0.0f, std::log(3.0f), 0.0f, 0.0f};
  f.p.temperature = 0;
  f.p.logprobs = 2;
  TopLogprobs top;
  f.draw(1, &top);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].first, 1);
  EXPECT_NEAR(top[0].second, std::log(0.5), 1e-6);
  EXPECT_EQ(top[1].first, 0);  // ties toward the lower id
  EXPECT_NEAR(top[1].second, std::log(1.0 / 6), 1e-6);
}

// The chosen token's logprob is always there: after the top-K when it is not among them (here a
// penalty makes greedy pick a token the raw distribution ranks second).
TEST(Sampler, TheChosenTokensLogprobFollowsTheTopK) {
  Fixture f;
  f.logits = {0.0f, std::log(3.0f), 0.0f, std::log(2.0f)};
  f.tokens = {1, 1};  // token 1 is in the output...
  f.p.temperature = 0;
  f.p.presence_penalty = 10;  // ...and penalised away
  f.p.logprobs = 1;
  TopLogprobs top;
  // Tokens [1, 1] with num_prompt 3 would leave no output: use a prompt of one token.
  Sampler s(4);
  const int32_t t = s.sample({f.logits.data(), &f.p, &f.tokens, 1, 0}, &top);
  EXPECT_EQ(t, 3);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].first, 1);
  EXPECT_NEAR(top[0].second, std::log(3.0 / 7), 1e-6);
  EXPECT_EQ(top[1].first, 3);
  EXPECT_NEAR(top[1].second, std::log(2.0 / 7), 1e-6);
  // Among the top-K already: nothing is added.
  f.p.presence_penalty = 0;
  EXPECT_EQ(s.sample({f.logits.data(), &f.p, &f.tokens, 1, 0}, &top), 1);
  EXPECT_EQ(top.size(), 1u);
}

TEST(Sampler, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  Fixture f;
  f.logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::map<int32_t, int> count;
  for (uint64_t seed = 0; seed < 20000; ++seed) {
    const int32_t t = f.draw(seed);
    EXPECT_EQ(t, f.draw(seed));
    ++count[t];
  }
  EXPECT_NEAR(count[0] / 20000.0, 0.5, 0.02);
  EXPECT_NEAR(count[1] / 20000.0, 0.3, 0.02);
  EXPECT_NEAR(count[2] / 20000.0, 0.2, 0.02);
}

TEST(Sampler, TopPMinPAndTopKCutTheTail) {
  Fixture f;
  f.logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  for (auto [cut, allowed] : std::vector<std::pair<int, int>>{{0, 2}, {1, 2}, {2, 3}}) {
    f.p = SamplingParams();
    if (cut == 0) f.p.top_p = 0.75f;  // 0.5 + 0.3 passes 0.75: two tokens
    if (cut == 1) f.p.min_p = 0.5f;   // >= 0.25: two tokens
    if (cut == 2) f.p.top_k = 3;
    for (uint64_t seed = 0; seed < 3000; ++seed) ASSERT_LT(f.draw(seed), allowed) << cut;
  }
}

// A grammar's mask: only allowed tokens are chosen, greedy or sampled; logprobs stay the raw
// distribution's.
TEST(Sampler, TheAllowedMaskRestrictsTheChoiceOnly) {
  Fixture f;
  f.logits.assign(130, 0.0f);
  f.logits[3] = 5.0f;  // the favourite, not allowed
  std::vector<uint64_t> allowed(3, 0);
  for (int t : {7, 70, 129}) allowed[t / 64] |= uint64_t(1) << (t % 64);
  f.logits[70] = 1.0f;
  Sampler s(130);
  f.p.temperature = 0;
  f.p.logprobs = 1;
  TopLogprobs top;
  SampleInput in{f.logits.data(), &f.p, &f.tokens, 3, 1, allowed.data()};
  EXPECT_EQ(s.sample(in, &top), 70);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].first, 3);  // the raw distribution's best
  EXPECT_EQ(top[1].first, 70);
  f.p.temperature = 1;
  f.p.logprobs = 0;
  std::map<int32_t, int> seen;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    in.seed = seed;
    ++seen[s.sample(in, nullptr)];
  }
  for (const auto& [t, n] : seen) EXPECT_TRUE(t == 7 || t == 70 || t == 129) << t;
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_GT(seen[70], seen[7]);
}

TEST(Sampler, PenaltiesMoveTheArgmax) {
  Fixture f;
  f.logits = {1.0f, 0.9f, 0.0f, 0.0f};
  f.tokens = {3, 3, 0, 0};  // prompt of 3 (3, 3, 0), then one generated 0
  f.p.temperature = 0;
  EXPECT_EQ(f.draw(0), 0);
  f.p.frequency_penalty = 0.2f;  // token 0 appeared once in the output
  EXPECT_EQ(f.draw(0), 1);
  f.p = SamplingParams();
  f.p.temperature = 0;
  f.p.repetition_penalty = 1.2f;  // 1.0 / 1.2 < 0.9
  EXPECT_EQ(f.draw(0), 1);
}

// The penalties' per-token counts are kept between calls: one call's history must not leak into
// the next one's logits.
TEST(Sampler, PenaltiesSeeOnlyTheirOwnHistory) {
  const std::vector<float> logits = {1.0f, 0.9f, 0.8f, 0.0f};
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.05f;
  p.presence_penalty = 0.01f;
  const std::vector<int32_t> a = {2, 0, 1, 0, 0, 1}, b = {1, 2, 0};
  Sampler reused(4);
  TopLogprobs top_a, top_b, fresh_b;
  p.logprobs = 4;
  EXPECT_EQ(reused.sample({logits.data(), &p, &a, 3, 0}, &top_a), 2);
  // b: 0.5 - 0.06, 0.9 / 2, 0.8 / 2 - 0.06, 0.0: token 1.
  EXPECT_EQ(reused.sample({logits.data(), &p, &b, 1, 0}, &top_b), 1);
  Sampler fresh(4);
  EXPECT_EQ(fresh.sample({logits.data(), &p, &b, 1, 0}, &fresh_b), 1);
  EXPECT_EQ(top_b, fresh_b);
  // And the same history twice gives the same choice.
  EXPECT_EQ(reused.sample({logits.data(), &p, &a, 3, 0}, &top_b), 2);
}

}  // namespace
}  // namespace deepinfer
