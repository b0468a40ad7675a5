#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/parallel.h"
#include "unit/engine/engine_test_util.h"

namespace deepinfer {
namespace {

using testing::make_request;

TEST(Scheduler, ContextParallelBlocksComeFromPoolsInTurn) {
  SchedulerConfig cfg;
  cfg.block_tokens = 4;
  cfg.max_model_len = 1000;
  Scheduler s(cfg, 2, 3);  // pools of 2 blocks on 3 ranks
  EXPECT_EQ(s.add(make_request(1, 3, 8)), "");
  EXPECT_EQ(s.add(make_request(2, 20, 1)), "");
  EXPECT_EQ(s.add(make_request(3, 4, 8)), "");
  SchedOutput out;
  s.schedule(out);
  ASSERT_EQ(out.seqs.size(), 2u);
  EXPECT_EQ(out.seqs[0].new_blocks, std::vector<int32_t>{0});  // block 0 on rank 0
  // Blocks 0, 1, 2 on ranks 0, 1, 2; block 3 would be on rank 0, which is now empty: 12 of the
  // 20 tokens fit although 5 blocks were free.
  EXPECT_EQ(out.seqs[1].new_blocks, (std::vector<int32_t>{1, 0, 0}));
  EXPECT_EQ(out.seqs[1].tokens.size(), 12u);
  // Rank 0 has no block left for a block 0: the third request waits although 2 blocks are free.
  EXPECT_EQ(s.num_waiting(), 1u);
  EXPECT_EQ(s.blocks_used(), 4);
}

TEST(Scheduler, ContextParallelPoolsHoldCpTimesTheContext) {
  SchedulerConfig cfg;
  cfg.block_tokens = 4;
  cfg.max_model_len = 1000;
  Scheduler s(cfg, 4, 3);  // 4 blocks per rank, 3 ranks: 48 tokens
  EXPECT_EQ(s.blocks_total(), 12);
  EXPECT_EQ(s.add(make_request(1, 40, 8)), "");
  EXPECT_NE(s.add(make_request(2, 45, 8)), "");  // 53 tokens: 14 blocks
  std::vector<int32_t> sampled;
  while (s.has_work()) {
    SchedOutput out;
    s.schedule(out);
    sampled.assign(out.seqs.size(), 5);
    for (Sequence* q : s.update(out, sampled, std::vector<int32_t>(sampled.size(), 1)))
      if (q->num_generated() >= q->req.params.max_tokens) s.finish(q, FinishReason::Length);
  }
  EXPECT_EQ(s.blocks_used(), 0);
}

TEST(StepMessage, RoundTrip) {
  SchedOutput out;
  SchedSeq q;
  q.seq_id = 7;
  q.slot = 3;
  q.start_pos = 100;
  q.tokens = {1, 2, 3};
  q.n_padding = 5;
  q.reset_blocks = true;
  q.new_blocks = {9, 8};
  q.sample = true;
  out.seqs.push_back(q);
  out.released = {4, 5};
  const auto bytes = encode_sched_output(out);
  const SchedOutput back = decode_sched_output(bytes);
  ASSERT_EQ(back.seqs.size(), 1u);
  EXPECT_EQ(back.seqs[0].tokens, q.tokens);
  EXPECT_EQ(back.seqs[0].new_blocks, q.new_blocks);
  EXPECT_EQ(back.seqs[0].start_pos, 100);
  EXPECT_TRUE(back.seqs[0].reset_blocks && back.seqs[0].sample && !back.seqs[0].decode);
  EXPECT_EQ(back.released, out.released);
  std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 3);
  EXPECT_THROW(decode_sched_output(cut), Error);
}

TEST(ParallelConfig, RejectsUnsupportedShapes) {
  ParallelConfig c;
  c.cp = 2;
  c.ep = 4;
  EXPECT_THROW(c.validate(8), Error);  // within a replica both must be 1 or the replica size
  c = ParallelConfig();
  c.dp = 2;
  c.cp = 2;
  EXPECT_THROW(c.validate(8), Error);
  c = ParallelConfig();
  c.ep = 3;
  EXPECT_THROW(c.validate(8), Error);  // 3 does not divide 8 experts
  c = ParallelConfig();
  c.dp = 2;
  c.ep = 2;
  EXPECT_NO_THROW(c.validate(8));
  EXPECT_EQ(c.world_size(), 2);
}

}  // namespace
}  // namespace deepinfer
