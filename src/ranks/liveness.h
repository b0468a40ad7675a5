// Knowing when another rank has died, so that no wait lasts forever. The leader spawned the
// followers and polls them with waitpid, which also gives their exit status; a follower is not
// its siblings' parent and watches every other rank through pidfds (readable once a process has
// exited, reaped or not, and immune to pid reuse).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer::ranks {

// "status 3" or "status SIGKILL (killed by signal 9)", from a waitpid status.
std::string describe_exit_status(int status);

class Liveness {
 public:
  Liveness() = default;
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Rank `self_rank` watches the others: `pids[r]` is rank r (0 where not known yet;
  // pids[self_rank] is ignored); rank 0, the leader, spawned them. `first_dead` is a word shared
  // by all ranks (-1 at first) where the first rank seen dead is recorded, so that every rank
  // names the same cause.
  void watch(const std::vector<int>& pids, int self_rank, std::atomic<int32_t>* first_dead);

  // Throws deepinfer::Error naming the first rank found dead; once one is, every later call
  // throws the same error.
  void check();
  // The same without throwing: the error message, or empty while everyone is alive.
  const std::string& poll();

  // The leader, after the shutdown message: waits up to `timeout_s` for every follower to exit
  // and throws if one exited with a non-zero status or had to be killed.
  void reap_children(double timeout_s);
  // The leader on an error path: SIGKILL and reap every follower still running.
  void kill_children() noexcept;

 private:
  void poll_children();
  void poll_peers();
  // Leader: follower r's wait status once it has exited (reaping it), kUnknown when it was
  // reaped elsewhere, kRunning while it runs.
  static constexpr int kRunning = -2, kUnknown = -1;
  int reap(size_t r);
  void report(int seen, int seen_status);
  std::string exited(int r, int status) const;

  bool leader_ = false;
  int self_rank_ = 0;
  std::vector<int> pids_;     // [world_size], by rank
  std::vector<int> pidfds_;   // [world_size], -1 where none (follower only)
  std::vector<bool> reaped_;  // [world_size] (leader only)
  std::string error_;
  std::atomic<int32_t>* first_dead_ = nullptr;
};

}  // namespace deepinfer::ranks
