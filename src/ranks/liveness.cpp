#include "ranks/liveness.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace deepinfer::ranks {

namespace {

int open_pidfd(int pid) {
#ifdef SYS_pidfd_open
  const long fd = syscall(SYS_pidfd_open, pid, 0);
  return fd < 0 ? -1 : int(fd);
#else
  return -1;
#endif
}

// Without a pidfd (an old kernel or a sandbox that forbids it): gone, or a zombie nobody reaped.
bool pid_has_exited(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return true;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The state follows the command name, which is in parentheses and may itself hold ") ".
  const char* close = std::strrchr(buf, ')');
  return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

std::string rank_name(int rank, int pid) {
  return str_cat("rank ", rank, " (pid ", pid, rank == 0 ? ", the leader)" : ")");
}

}  // namespace

std::string describe_exit_status(int status) {
  if (WIFEXITED(status)) return str_cat("status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);
    return str_cat("status SIG", abbrev ? abbrev : "?", " (killed by signal ", sig, ")");
  }
  return str_cat("status ", status);
}

Liveness::~Liveness() {
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
}

void Liveness::watch_children(const std::vector<int>& pids) {
  leader_ = true;
  self_rank_ = 0;
  pids_ = pids;
  reaped_.assign(pids.size(), false);
  reaped_[0] = true;
}

void Liveness::watch_peers(const std::vector<int>& pids, int self_rank) {
  leader_ = false;
  self_rank_ = self_rank;
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
  pids_ = pids;
  pidfds_.assign(pids.size(), -1);
  for (size_t r = 0; r < pids.size(); ++r)
    if (int(r) != self_rank && pids[r] > 0) pidfds_[r] = open_pidfd(pids[r]);
}

const std::string& Liveness::poll() {
  if (error_.empty()) leader_ ? poll_children() : poll_peers();
  return error_;
}

void Liveness::check() {
  if (!poll().empty()) throw Error(error_);
}

void Liveness::poll_children() {
  for (size_t r = 1; r < pids_.size(); ++r) {
    if (reaped_[r]) continue;
    int status = 0;
    const int got = waitpid(pids_[r], &status, WNOHANG);
    if (got == pids_[r]) {
      reaped_[r] = true;
      return report(int(r), describe_exit_status(status));
    }
    if (got < 0 && errno == ECHILD) {  // reaped behind our back (SIGCHLD ignored)
      reaped_[r] = true;
      return report(int(r), "");
    }
  }
}

void Liveness::poll_peers() {
  // Reparenting is the quickest sign that the leader is gone.
  if (!pids_.empty() && pids_[0] > 0 && getppid() != pids_[0]) return report(0, "");
  pollfd fds[64];
  for (size_t r0 = 0; r0 < pids_.size(); r0 += 64) {
    int n = 0, rank_of[64];
    for (size_t r = r0; r < pids_.size() && r < r0 + 64; ++r) {
      if (int(r) == self_rank_ || pids_[r] <= 0) continue;
      if (pidfds_[r] < 0) {
        if (pid_has_exited(pids_[r])) return report(int(r), "");
        continue;
      }
      fds[n] = {pidfds_[r], POLLIN, 0};
      rank_of[n++] = int(r);
    }
    if (n == 0 || ::poll(fds, nfds_t(n), 0) <= 0) continue;
    for (int i = 0; i < n; ++i)
      if (fds[i].revents) return report(rank_of[i], "");
  }
}

void Liveness::report(int seen, const std::string& seen_status) {
  auto exited = [&](int r, const std::string& status) {
    return str_cat(rank_name(r, pids_[size_t(r)]), " exited",
                   status.empty() ? "" : str_cat(" with ", status));
  };
  // Ranks that notice a death stop too, so the rank seen here may only have followed another
  // one down; the first death anybody saw is the cause worth naming.
  int cause = seen;
  if (first_dead_) {
    int32_t expected = -1;
    if (!first_dead_->compare_exchange_strong(expected, seen)) cause = expected;
  }
  if (cause == seen || cause < 0 || size_t(cause) >= pids_.size()) {
    error_ = exited(seen, seen_status);
    return;
  }
  std::string cause_status;
  if (leader_ && !reaped_[size_t(cause)]) {
    // Somebody saw it exit, so its status is there or about to be.
    for (int i = 0; i < 200 && cause_status.empty(); ++i) {
      int status = 0;
      const int got = waitpid(pids_[size_t(cause)], &status, WNOHANG);
      if (got == pids_[size_t(cause)]) {
        reaped_[size_t(cause)] = true;
        cause_status = describe_exit_status(status);
      } else if (got < 0) {
        break;
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
    }
  }
  error_ = str_cat(exited(cause, cause_status), "; then ", exited(seen, seen_status));
}

void Liveness::reap_children(double timeout_s) {
  DI_CHECK(leader_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string failure;
  auto sleep = std::chrono::microseconds(100);
  for (;;) {
    bool all = true;
    for (size_t r = 1; r < pids_.size(); ++r) {
      if (reaped_[r]) continue;
      int status = 0;
      const int got = waitpid(pids_[r], &status, WNOHANG);
      if (got < 0 && errno == ECHILD) {
        reaped_[r] = true;
      } else if (got == pids_[r]) {
        reaped_[r] = true;
        if (status != 0 && failure.empty())
          failure = str_cat(rank_name(int(r), pids_[r]), " exited with ",
                            describe_exit_status(status), " after the shutdown message");
      } else {
        all = false;
      }
    }
    if (all) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t r = 1; r < pids_.size(); ++r) {
        if (!reaped_[r] && failure.empty())
          failure = str_cat(rank_name(int(r), pids_[r]), " did not exit within ", timeout_s,
                            " s of the shutdown message and was killed");
      }
      kill_children();
      break;
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::microseconds(20000));
  }
  DI_REQUIRE(failure.empty(), failure);
}

void Liveness::kill_children() noexcept {
  if (!leader_) return;
  for (size_t r = 1; r < pids_.size(); ++r)
    if (!reaped_[r]) kill(pids_[r], SIGKILL);
  for (size_t r = 1; r < pids_.size(); ++r) {
    if (reaped_[r]) continue;
    int status = 0;
    while (waitpid(pids_[r], &status, 0) < 0 && errno == EINTR) {
    }
    reaped_[r] = true;
  }
}

}  // namespace deepinfer::ranks
