// Ranks that die: the others must stop with an error naming the dead rank within seconds, no
// process may be left running, and no segment may be left in /dev/shm.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <thread>

#include "core/error.h"
#include "run_worker.h"

namespace deepinfer::ranks::test {
namespace {

constexpr long long kMaxReactionUs = 5000000;

void expect_nothing_left(const WorkerRun& run) {
  EXPECT_FALSE(run.timed_out) << run.describe();
  EXPECT_TRUE(run.left_alive.empty()) << run.describe();
  EXPECT_TRUE(run.shm_left.empty()) << run.describe();
}

// The leader stopped with exit status 3 and an error naming `victim` with `status`, soon after
// the victim died.
void expect_leader_blames(const WorkerRun& run, int victim, const std::string& status) {
  ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 3) << run.describe();
  const std::string blame = str_cat("rank ", victim, " (pid ");
  const size_t at = run.err.find("rank 0 error at ");
  ASSERT_NE(at, std::string::npos) << run.describe();
  const std::string line = run.err.substr(at, run.err.find('\n', at) - at);
  EXPECT_NE(line.find(blame), std::string::npos) << line;
  EXPECT_NE(line.find(str_cat(") exited with ", status)), std::string::npos) << line;
  const long long died = number_after(run.out, str_cat("rank ", victim, " dying at "));
  const long long caught = number_after(run.err, "rank 0 error at ");
  ASSERT_GT(died, 0) << run.describe();
  EXPECT_GE(caught, died);
  EXPECT_LT(caught - died, kMaxReactionUs) << run.describe();
  // The leader reaps its followers itself.
  EXPECT_TRUE(run.orphans.empty()) << run.describe();
  expect_nothing_left(run);
}

TEST(ShmDeath, FollowerKilledMidCollective) {
  const WorkerRun run = run_worker({"kill", "ranks=4", "where=collective", "victim=2", "at=5"});
  expect_leader_blames(run, 2, "status SIGKILL (killed by signal 9)");
  // The surviving followers noticed on their own too.
  for (int r : {1, 3}) {
    const long long caught = number_after(run.err, str_cat("rank ", r, " error at "));
    if (caught > 0) {
      EXPECT_NE(run.err.find("rank 2 (pid"), std::string::npos);
    }
  }
}

TEST(ShmDeath, FollowerExitsMidCollective) {
  const WorkerRun run = run_worker({"kill", "ranks=3", "where=exit", "victim=1", "at=2"});
  expect_leader_blames(run, 1, "status 5");
}

TEST(ShmDeath, FollowerKilledWhileWaitingForAStep) {
  const WorkerRun run = run_worker({"kill", "ranks=3", "where=channel", "victim=2", "at=3"});
  expect_leader_blames(run, 2, "status SIGKILL");
}

TEST(ShmDeath, FollowerDiesWhileTheLeaderWaitsOnTheChannel) {
  // Messages of five pieces: the leader blocks for acknowledgements the dead rank never sends.
  const WorkerRun run =
      run_worker({"kill", "ranks=2", "where=channel", "victim=1", "big=1", "piece=4096", "at=2"});
  expect_leader_blames(run, 1, "status SIGKILL");
}

// The followers die with the leader (by the death signal) wherever they are waiting.
void expect_followers_follow_leader(const WorkerRun& run, int followers) {
  ASSERT_TRUE(WIFSIGNALED(run.status) && WTERMSIG(run.status) == SIGKILL) << run.describe();
  const long long died = number_after(run.out, "rank 0 dying at ");
  ASSERT_GT(died, 0) << run.describe();
  ASSERT_EQ(int(run.orphans.size()), followers) << run.describe();
  for (const WorkerRun::Orphan& o : run.orphans) {
    EXPECT_TRUE(WIFSIGNALED(o.status) && WTERMSIG(o.status) == SIGKILL) << run.describe();
    EXPECT_LT((long long)o.reaped_us - died, kMaxReactionUs) << run.describe();
  }
  expect_nothing_left(run);
}

TEST(ShmDeath, LeaderKilledMidCollective) {
  const WorkerRun run = run_worker({"kill", "ranks=3", "where=collective", "victim=0", "at=4"});
  expect_followers_follow_leader(run, 2);
}

TEST(ShmDeath, LeaderKilledWhileFollowersWaitForAStep) {
  const WorkerRun run = run_worker({"kill", "ranks=4", "where=channel", "victim=0", "at=2"});
  expect_followers_follow_leader(run, 3);
}

// An exception on the leader ends the run: its World kills and reaps the followers.
TEST(ShmDeath, LeaderErrorTakesTheFollowersDown) {
  const WorkerRun run = run_worker({"leader-throws", "ranks=3"});
  ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 3) << run.describe();
  EXPECT_NE(run.err.find("deliberate failure on the leader"), std::string::npos);
  EXPECT_TRUE(run.orphans.empty()) << run.describe();
  expect_nothing_left(run);
}

TEST(ShmLaunch, FollowersThatDoNotJoinInTimeAreAnError) {
  const uint64_t t0 = now_us();
  const WorkerRun run =
      run_worker({"collectives", "ranks=3", "join_delay_ms=4000", "join_timeout_ms=300"});
  ASSERT_TRUE(WIFEXITED(run.status) && WEXITSTATUS(run.status) == 3) << run.describe();
  EXPECT_NE(run.err.find("only 0 of 2 follower ranks joined within 0.3 s"), std::string::npos)
      << run.describe();
  EXPECT_LT(now_us() - t0, 3000000u);
  EXPECT_TRUE(run.orphans.empty()) << run.describe();
  expect_nothing_left(run);
}

// Processes whose parent is `pid`, from /proc/*/stat.
int count_children(pid_t pid) {
  int n = 0;
  DIR* d = opendir("/proc");
  while (dirent* e = d ? readdir(d) : nullptr) {
    if (std::atoi(e->d_name) <= 0) continue;
    std::ifstream f(str_cat("/proc/", e->d_name, "/stat"));
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == pid) ++n;
  }
  if (d) closedir(d);
  return n;
}

// A signal while the followers are still starting: the segment name goes, the leader dies of
// the signal, the followers with it.
void signal_during_start(int sig) {
  const WorkerRun run =
      run_worker({"collectives", "ranks=3", "join_delay_ms=4000"}, {}, 30, [&](pid_t leader) {
        // Wait for the segment and both followers, so the signal lands while the leader waits
        // for them to join.
        const std::string segment = str_cat("/dev/shm/deepinfer-", leader, "-0");
        for (int i = 0; i < 5000; ++i) {
          if (access(segment.c_str(), F_OK) == 0 && count_children(leader) == 2) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        ASSERT_EQ(access(segment.c_str(), F_OK), 0) << "the leader never created " << segment;
        kill(leader, sig);
      });
  ASSERT_TRUE(WIFSIGNALED(run.status) && WTERMSIG(run.status) == sig) << run.describe();
  EXPECT_EQ(run.orphans.size(), 2u) << run.describe();
  expect_nothing_left(run);
}

TEST(ShmLaunch, SigtermDuringStartRemovesTheSegment) {
  signal_during_start(SIGTERM);
}
TEST(ShmLaunch, SigintDuringStartRemovesTheSegment) {
  signal_during_start(SIGINT);
}

}  // namespace
}  // namespace deepinfer::ranks::test
