// In-process checks: the fixed-order sum, the single backend, and the errors for bad launch
// environments and segments.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "core/error.h"
#include "ranks/group.h"
#include "ranks/launch.h"
#include "ranks/shm.h"
#include "ranks/world.h"
#include "util/subgroup.h"

namespace deepinfer::ranks {
namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST(SumInRankOrder, MatchesALeftToRightLoopBitForBit) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-20, 20);
  for (int n_parts : {1, 2, 3, 5, 8}) {
    for (size_t n : {size_t(0), size_t(1), size_t(255), size_t(256), size_t(257), size_t(1000)}) {
      std::vector<std::vector<float>> parts(static_cast<size_t>(n_parts), std::vector<float>(n));
      for (auto& p : parts)
        for (float& x : p) x = std::ldexp(mant(rng), expo(rng)) * (rng() & 1 ? -1.0f : 1.0f);
      std::vector<const float*> ptrs;
      for (auto& p : parts) ptrs.push_back(p.data());
      std::vector<float> want(n);
      for (size_t j = 0; j < n; ++j) {
        float acc = parts[0][j];
        for (int r = 1; r < n_parts; ++r) acc += parts[size_t(r)][j];
        want[j] = acc;
      }
      std::vector<float> out(n, -1.0f);
      sum_in_rank_order(ptrs.data(), n_parts, n, out.data());
      EXPECT_TRUE(same_bits(out, want));
      // In place over the last part.
      sum_in_rank_order(ptrs.data(), n_parts, n, parts.back().data());
      EXPECT_TRUE(same_bits(parts.back(), want));
    }
  }
}

TEST(SumInRankOrder, OrderIsObservable) {
  // 1e8 + 1 - 1e8 in this order is 0 in fp32, and 1 in another: the order is part of the result.
  const float a[] = {1e8f}, b[] = {1.0f}, c[] = {-1e8f};
  const float* abc[] = {a, b, c};
  const float* acb[] = {a, c, b};
  float x = -1, y = -1;
  sum_in_rank_order(abc, 3, 1, &x);
  sum_in_rank_order(acb, 3, 1, &y);
  EXPECT_EQ(x, 0.0f);
  EXPECT_EQ(y, 1.0f);
}

TEST(SingleGroup, CollectivesAreCopiesOrNothing) {
  auto g = make_single_group();
  EXPECT_EQ(g->rank(), 0);
  EXPECT_EQ(g->size(), 1);
  std::vector<float> v = {1.5f, -2.0f};
  g->all_reduce(v.data(), v.size());
  EXPECT_EQ(v, (std::vector<float>{1.5f, -2.0f}));
  std::vector<float> out(2);
  g->reduce_scatter(v.data(), 2, out.data());
  EXPECT_EQ(out, v);
  int in = 9, gathered = 0;
  g->all_gather(&in, sizeof in, &gathered);
  EXPECT_EQ(gathered, 9);
  g->broadcast(&in, sizeof in, 0);
  EXPECT_THROW(g->broadcast(&in, sizeof in, 1), Error);
  const uint8_t bytes[] = {1, 2, 3};
  const auto all = g->all_gather_v(bytes);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0], (std::vector<uint8_t>{1, 2, 3}));
  g->barrier();
  EXPECT_EQ(g->split(-1, 0), nullptr);
  auto sub = g->split(3, 0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
}

TEST(SingleGroup, SubgroupValidatesItsList) {
  auto g = make_single_group();
  const int ok[] = {0}, outside[] = {1}, twice[] = {0, 0};
  EXPECT_NE(subgroup(*g, ok), nullptr);
  EXPECT_THROW(subgroup(*g, outside), Error);
  EXPECT_THROW(subgroup(*g, twice), Error);
  EXPECT_THROW(subgroup(*g, std::span<const int>()), Error);
}

TEST(World, WithoutLauncherOrSizeItIsASingleRank) {
  auto w = init_world();
  EXPECT_EQ(w->backend(), Backend::kSingle);
  EXPECT_EQ(w->size(), 1);
  EXPECT_TRUE(w->is_leader());
  const uint8_t msg[] = {1};
  w->channel().send(msg);  // nobody to tell
  std::vector<uint8_t> got;
  EXPECT_THROW(w->channel().receive(got), Error);
  w->finish();
  EXPECT_THROW(init_world({.world_size = -2}), Error);
}

// Sets environment variables for one scope.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars)
      : vars_(vars) {
    for (auto& [k, v] : vars_) setenv(k, v, 1);
  }
  ~ScopedEnv() {
    for (auto& [k, v] : vars_) unsetenv(k);
  }

 private:
  std::vector<std::pair<const char*, const char*>> vars_;
};

std::string init_error() {
  try {
    init_world();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(World, BadFollowerEnvironmentNamesTheVariable) {
  {
    ScopedEnv env({{kEnvLocalRank, "1"}});
    EXPECT_NE(init_error().find("DEEPINFER_WORLD_SIZE is not set"), std::string::npos);
  }
  {
    ScopedEnv env({{kEnvLocalRank, "1"}, {kEnvWorldSize, "four"}});
    EXPECT_NE(init_error().find("DEEPINFER_WORLD_SIZE=\"four\" is not an integer"),
              std::string::npos);
  }
  {
    ScopedEnv env({{kEnvLocalRank, "4"}, {kEnvWorldSize, "4"}, {kEnvShmName, "/x"}});
    EXPECT_NE(init_error().find("DEEPINFER_LOCAL_RANK=\"4\" is not an integer in [1, 3]"),
              std::string::npos);
  }
  {
    ScopedEnv env({{kEnvLocalRank, "1"}, {kEnvWorldSize, "2"}, {kEnvShmName, "noslash"}});
    EXPECT_NE(init_error().find("DEEPINFER_SHM_NAME must name"), std::string::npos);
  }
  {
    ScopedEnv env({{kEnvLocalRank, "1"}, {kEnvWorldSize, "2"}, {kEnvShmName, "/deepinfer-none"}});
    EXPECT_NE(init_error().find("cannot open the shared-memory segment"), std::string::npos);
  }
}

TEST(Segment, AttachValidatesTheSegment) {
  const std::string name = new_segment_name();
  auto seg = shm::Segment::create(name, 3, 4096, 4096, 4);
  EXPECT_EQ(seg->header()->world_size, 3u);
  try {
    shm::Segment::attach(name, 4);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was made for 3 ranks"), std::string::npos) << e.what();
  }
  {
    // A follower environment pointing at a segment whose leader is not our parent.
    ScopedEnv env({{kEnvLocalRank, "1"}, {kEnvWorldSize, "3"}, {kEnvShmName, name.c_str()}});
    EXPECT_NE(init_error().find("was not started by the leader"), std::string::npos);
  }
  seg->unlink_name();
  EXPECT_NE(access(("/dev/shm" + name).c_str(), F_OK), 0);
}

TEST(Segment, BadSizesAreErrors) {
  EXPECT_THROW(shm::Segment::create(new_segment_name(), 4, 100, 4096, 4), Error);   // slot
  EXPECT_THROW(shm::Segment::create(new_segment_name(), 4, 4096, 10, 4), Error);    // piece
  EXPECT_THROW(shm::Segment::create(new_segment_name(), 4, 4096, 4096, 0), Error);  // groups
  EXPECT_THROW(shm::Segment::create(new_segment_name(), 0, 4096, 4096, 4), Error);  // ranks
  EXPECT_THROW(shm::Segment::create(new_segment_name(), 2, uint64_t(1) << 62, 4096, 1 << 12),
               Error);  // overflow
}

TEST(Segment, StaleNamesOfDeadLeadersAreRemoved) {
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  auto make = [](const std::string& path, time_t age_s) {
    const int fd = open(path.c_str(), O_CREAT | O_WRONLY, 0600);
    close(fd);
    const timespec t[2] = {{time(nullptr) - age_s, 0}, {time(nullptr) - age_s, 0}};
    utimensat(AT_FDCWD, path.c_str(), t, 0);
  };
  const std::string old_dead = str_cat("/dev/shm/deepinfer-", dead, "-7");
  const std::string new_dead = str_cat("/dev/shm/deepinfer-", dead, "-8");
  const std::string old_alive = str_cat("/dev/shm/deepinfer-", getpid(), "-99");
  make(old_dead, 3600);
  make(new_dead, 0);
  make(old_alive, 3600);
  remove_stale_segments();
  EXPECT_NE(access(old_dead.c_str(), F_OK), 0);
  EXPECT_EQ(access(new_dead.c_str(), F_OK), 0);  // may be a leader that is still starting
  EXPECT_EQ(access(old_alive.c_str(), F_OK), 0);
  unlink(new_dead.c_str());
  unlink(old_alive.c_str());
}

TEST(Liveness, DescribesExitStatuses) {
  EXPECT_EQ(describe_exit_status(3 << 8), "status 3");
  const pid_t pid = fork();
  if (pid == 0) {
    raise(SIGKILL);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_EQ(describe_exit_status(status), "status SIGKILL (killed by signal 9)");
}

}  // namespace
}  // namespace deepinfer::ranks
