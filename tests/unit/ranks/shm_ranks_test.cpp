// Runs of several processes over shared memory, started the way the engine starts them: the
// test starts the leader, the leader spawns the followers. The rank program (tests/ranks) checks
// every result against sums it computes itself; here we check that every rank got to the end.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "core/error.h"
#include "run_worker.h"

namespace deepinfer::ranks::test {
namespace {

// Every rank printed `line` (with its rank in front), and the run ended cleanly.
void expect_clean(const WorkerRun& run, int ranks, const std::string& line) {
  ASSERT_FALSE(run.timed_out) << run.describe();
  ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 0) << run.describe();
  for (int r = 0; r < ranks; ++r) {
    EXPECT_NE(run.out.find(str_cat("rank ", r, " of ", ranks, " pid ")), std::string::npos)
        << run.describe();
    EXPECT_NE(run.out.find(str_cat("rank ", r, " ", line)), std::string::npos)
        << "rank " << r << " did not report '" << line << "'\n"
        << run.describe();
    EXPECT_NE(run.out.find(str_cat("rank ", r, " done")), std::string::npos) << run.describe();
  }
  EXPECT_EQ(run.out.find("backend single"), std::string::npos) << run.describe();
  EXPECT_TRUE(run.orphans.empty()) << run.describe();
  EXPECT_TRUE(run.left_alive.empty()) << run.describe();
  EXPECT_TRUE(run.shm_left.empty()) << run.describe();
  EXPECT_EQ(run.err.find("FAIL"), std::string::npos) << run.describe();
}

class ShmCollectives : public ::testing::TestWithParam<int> {};

// Sizes 0, 1, odd and beyond one 4 KiB slot, on the world and on split groups.
TEST_P(ShmCollectives, SmallSlot) {
  const int ranks = GetParam();
  const WorkerRun run = run_worker({"collectives", str_cat("ranks=", ranks), "slot=4096"});
  expect_clean(run, ranks, "ok collectives");
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmCollectives, ::testing::Values(2, 3, 4));

// The default slot (256 KiB) with data several slots long.
TEST(ShmCollectivesDefaultSlot, ThreeRanks) {
  const WorkerRun run = run_worker({"collectives", "ranks=3"});
  expect_clean(run, 3, "ok collectives");
}

TEST(ShmCollectivesTinySlot, FourRanks) {
  // The smallest slot the segment accepts for 4 ranks (64 bytes per rank): every collective
  // takes many rounds.
  const WorkerRun run = run_worker({"collectives", "ranks=4", "slot=256"});
  expect_clean(run, 4, "ok collectives");
}

class ShmChannel : public ::testing::TestWithParam<int> {};

// Messages of 0 bytes to several pieces, in order, then the shutdown message.
TEST_P(ShmChannel, ManyMessagesInOrder) {
  const int ranks = GetParam();
  const WorkerRun run =
      run_worker({"channel", str_cat("ranks=", ranks), "piece=4096", "messages=300"});
  expect_clean(run, ranks, "");
  for (int r = 1; r < ranks; ++r)
    EXPECT_NE(run.out.find(str_cat("rank ", r, " received 300 messages")), std::string::npos)
        << run.describe();
  EXPECT_NE(run.out.find("rank 0 sent 300 messages"), std::string::npos) << run.describe();
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmChannel, ::testing::Values(2, 4));

TEST(ShmChannelDefaultPiece, TwoRanks) {
  const WorkerRun run = run_worker({"channel", "ranks=2", "messages=40"});
  expect_clean(run, 2, "");
  EXPECT_NE(run.out.find("rank 1 received 40 messages"), std::string::npos) << run.describe();
}

// Followers run the leader's executable with its arguments (an empty one and one with spaces
// included) and inherit DEEPINFER_* settings.
TEST(ShmLaunch, FollowersGetArgumentsAndEnvironment) {
  const WorkerRun run = run_worker({"env", "ranks=3", "mark=m1 x", "", "with space"},
                                   {"DEEPINFER_TEST_MARK=m1 x", "DEEPINFER_NUM_KV_BLOCKS=123"});
  expect_clean(run, 3, "ok env");
}

// A split that needs more group areas than the segment has fails on every rank alike.
TEST(ShmGroups, RunningOutOfGroupAreasIsAnErrorEverywhere) {
  const WorkerRun run = run_worker({"exhaust", "ranks=3", "groups=2"});
  expect_clean(run, 3, "ok exhausted");
}

}  // namespace
}  // namespace deepinfer::ranks::test
