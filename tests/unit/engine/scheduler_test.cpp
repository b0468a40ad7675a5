// The scheduler on its own: no model, sampled tokens are made up. Checks the scheduling rule,
// budgets, chunking, buckets, prompt-as-decode, preemption and exact block accounting.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/scheduler.h"
#include "unit/engine/engine_test_util.h"

namespace deepinfer {
namespace {

using testing::make_request;

// Runs the scheduler to completion, finishing each sequence after max_tokens; checks budgets
// every step. Returns the number of steps.
int64_t drive(Scheduler& s, const SchedulerConfig& cfg, std::map<RequestId, int64_t>* generated) {
  int64_t steps = 0;
  while (s.has_work()) {
    SchedOutput out;
    s.schedule(out);
    EXPECT_FALSE(out.empty()) << "no progress at step " << steps;
    if (out.empty()) break;
    int64_t rows = 0, prompt_rows = 0;
    for (const auto& q : out.seqs) {
      rows += int64_t(q.tokens.size()) + q.n_padding;
      prompt_rows += q.decode ? 0 : int64_t(q.tokens.size());
    }
    EXPECT_LE(rows, cfg.max_num_batched_tokens);
    EXPECT_LE(prompt_rows, cfg.max_num_prefill_tokens);
    EXPECT_LE(int64_t(out.seqs.size()), cfg.max_num_seqs);
    std::vector<int32_t> sampled;
    for (const auto& q : out.seqs) {
      if (cfg.prompt_as_decode) {
        EXPECT_EQ(q.tokens.size(), 1u);
      }
      if (cfg.prefill_bucket > 0 && !q.decode) {
        EXPECT_EQ(int64_t(q.tokens.size()) + q.n_padding, cfg.prefill_bucket);
      } else {
        EXPECT_EQ(q.n_padding, 0);
      }
      if (q.sample) sampled.push_back(int32_t(q.seq_id % 100));
    }
    for (Sequence* seq : s.update(out, sampled, std::vector<int32_t>(sampled.size(), 1))) {
      (*generated)[seq->req.id] = seq->num_generated();
      if (seq->num_generated() >= seq->req.params.max_tokens) s.finish(seq, FinishReason::Length);
    }
    ++steps;
  }
  return steps;
}

TEST(Scheduler, DecodeRowsFirstThenPromptsFcfs) {
  SchedulerConfig cfg;
  cfg.max_num_batched_tokens = 10;
  cfg.max_num_prefill_tokens = 10;
  Scheduler s(cfg, 100);
  ASSERT_EQ(s.add(make_request(1, 4, 3)), "");
  SchedOutput a;
  s.schedule(a);
  ASSERT_EQ(a.seqs.size(), 1u);
  EXPECT_TRUE(a.seqs[0].sample);
  s.update(a, {5}, {1});
  ASSERT_EQ(s.add(make_request(2, 20, 3)), "");
  SchedOutput b;
  s.schedule(b);
  ASSERT_EQ(b.seqs.size(), 2u);
  EXPECT_EQ(b.seqs[0].seq_id, 1u);  // the decode row first
  EXPECT_TRUE(b.seqs[0].decode);
  EXPECT_EQ(b.seqs[1].seq_id, 2u);  // then a 9-row chunk of the new prompt
  EXPECT_EQ(b.seqs[1].tokens.size(), 9u);
  EXPECT_FALSE(b.seqs[1].sample);
  EXPECT_TRUE(b.seqs[1].reset_blocks);
}

TEST(Scheduler, RejectsWhatCanNeverRun) {
  SchedulerConfig cfg;
  cfg.max_model_len = 100;
  cfg.block_tokens = 16;
  Scheduler s(cfg, 4);
  EXPECT_NE(s.add(make_request(1, 90, 20)), "");  // past max_model_len
  EXPECT_NE(s.add(make_request(2, 60, 10)), "");  // 70 tokens need 5 blocks of 16, pool has 4
  EXPECT_EQ(s.add(make_request(3, 50, 10)), "");
  EXPECT_FALSE(s.add(make_request(4, 1, 1)).size() > 0);
}

struct Case {
  int32_t seqs, blocks;
  int64_t rows, prompt_rows, bucket, block_tokens;
  bool as_decode;
};

class SchedulerWorkload : public ::testing::TestWithParam<Case> {};

TEST_P(SchedulerWorkload, EveryRequestCompletesWithoutLeaks) {
  const Case c = GetParam();
  SchedulerConfig cfg;
  cfg.max_num_seqs = c.seqs;
  cfg.max_num_batched_tokens = c.rows;
  cfg.max_num_prefill_tokens = c.prompt_rows;
  cfg.prefill_bucket = c.bucket;
  cfg.block_tokens = c.block_tokens;
  cfg.prompt_as_decode = c.as_decode;
  cfg.max_model_len = 1 << 20;
  Scheduler s(cfg, c.blocks);
  std::mt19937 rng(11);
  std::map<RequestId, int64_t> want, got;
  for (RequestId id = 0; id < 200; ++id) {
    const int64_t p = 1 + rng() % 60, m = 1 + rng() % 20;
    if (s.add(make_request(id, p, m)) == "") want[id] = m;
  }
  drive(s, cfg, &got);
  EXPECT_EQ(got, want);
  EXPECT_EQ(s.blocks_used(), 0) << "blocks leaked";
  EXPECT_EQ(s.num_running() + s.num_waiting(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, SchedulerWorkload,
    ::testing::Values(Case{16, 1000, 2048, 2048, 0, 16, false},  // roomy
                      Case{16, 6, 2048, 2048, 0, 16, false},     // preemption galore
                      Case{4, 12, 64, 16, 0, 8, false},          // small budgets, chunking
                      Case{8, 10, 64, 64, 16, 16, false},        // buckets
                      Case{8, 10, 64, 64, 0, 16, true},          // prompt as decode
                      Case{1, 5, 7, 3, 0, 16, false}));          // one at a time, tiny chunks

TEST(Scheduler, PreemptsTheNewestAndRecomputesIt) {
  SchedulerConfig cfg;
  cfg.block_tokens = 4;
  Scheduler s(cfg, 4);
  ASSERT_EQ(s.add(make_request(1, 8, 8)), "");  // 2 blocks, grows to 4
  ASSERT_EQ(s.add(make_request(2, 8, 8)), "");  // 2 blocks
  SchedOutput a;
  s.schedule(a);
  ASSERT_EQ(a.seqs.size(), 2u);
  s.update(a, {1, 2}, {1, 1});
  // Both now need a third block with none free: the older keeps running, the newer is preempted.
  SchedOutput b;
  s.schedule(b);
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(b.seqs[0].seq_id, 1u);
  EXPECT_EQ(s.stats().preemptions, 1);
  EXPECT_EQ(s.find(2)->num_computed, 0);
  EXPECT_EQ(s.find(2)->tokens.size(), 9u);  // its generated token is kept for recomputation
  EXPECT_TRUE(s.abort(2));
  EXPECT_FALSE(s.abort(2));
}

TEST(Scheduler, AbortFreesBlocks) {
  SchedulerConfig cfg;
  Scheduler s(cfg, 10);
  ASSERT_EQ(s.add(make_request(1, 100, 5)), "");
  SchedOutput out;
  s.schedule(out);
  s.update(out, {3}, {1});
  EXPECT_GT(s.blocks_used(), 0);
  EXPECT_TRUE(s.abort(1));
  EXPECT_EQ(s.blocks_used(), 0);
  EXPECT_EQ(s.take_finished().size(), 1u);
}

}  // namespace
}  // namespace deepinfer
