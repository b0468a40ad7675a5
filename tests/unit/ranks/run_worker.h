// Runs the ranks_worker program (tests/ranks) as the leader of a shared-memory run and collects
// what happened to it and to every process it started. The test process makes itself a child
// subreaper, so followers orphaned by a dead leader are reparented here: they are reaped and
// reported instead of lingering, and any that are still alive at the end are found and killed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace deepinfer::ranks::test {

struct WorkerRun {
  int status = -1;  // waitpid status of the leader
  bool timed_out = false;
  std::string out, err;
  pid_t leader = 0;
  uint64_t leader_end_us = 0;  // CLOCK_MONOTONIC when the leader was reaped
  // Followers that outlived the leader, reaped here: (pid, status, CLOCK_MONOTONIC us).
  struct Orphan {
    pid_t pid;
    int status;
    uint64_t reaped_us;
  };
  std::vector<Orphan> orphans;
  // Processes of this run still alive (not zombies) after the grace period; they were killed.
  std::vector<pid_t> left_alive;
  // Shared-memory names of this run's leader still present in /dev/shm.
  std::vector<std::string> shm_left;

  std::string describe() const;  // for failure messages
};

// `args` follow the program name; `env` entries ("NAME=value") are added to this process's
// environment. `while_running` is called once the leader has been started.
WorkerRun run_worker(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                     double timeout_s = 30, const std::function<void(pid_t)>& while_running = {});

uint64_t now_us();
// The number in "<prefix><number>" at the first occurrence of prefix in text; -1 if absent.
long long number_after(const std::string& text, const std::string& prefix);

}  // namespace deepinfer::ranks::test
