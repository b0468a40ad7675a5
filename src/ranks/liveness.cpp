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

// Whether `pid` has exited: its pidfd is readable, or without one (an old kernel or a sandbox
// that forbids them) it is gone or a zombie nobody reaped.
bool has_exited(int pid, int pidfd) {
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }
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

void Liveness::watch(const std::vector<int>& pids, int self_rank,
                     std::atomic<int32_t>* first_dead) {
  leader_ = self_rank == 0;
  self_rank_ = self_rank;
  first_dead_ = first_dead;
  pids_ = pids;
  reaped_.assign(pids.size(), false);  // the leader's own entry counts as reaped
  reaped_[0] = true;
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
  pidfds_.assign(pids.size(), -1);
  for (size_t r = 0; r < pids.size(); ++r)
    if (!leader_ && int(r) != self_rank && pids[r] > 0) pidfds_[r] = open_pidfd(pids[r]);
}

const std::string& Liveness::poll() {
  if (error_.empty()) leader_ ? poll_children() : poll_peers();
  return error_;
}

void Liveness::check() {
  if (!poll().empty()) throw Error(error_);
}

int Liveness::reap(size_t r) {
  int status = 0;
  const int got = waitpid(pids_[r], &status, WNOHANG);
  if (got != pids_[r] && !(got < 0 && errno == ECHILD)) return kRunning;
  reaped_[r] = true;
  return got == pids_[r] ? status : kUnknown;  // ECHILD: reaped behind our back (SIGCHLD ignored)
}

std::string Liveness::exited(int r, int status) const {
  return str_cat(rank_name(r, pids_[size_t(r)]), " exited",
                 status >= 0 ? str_cat(" with ", describe_exit_status(status)) : "");
}

void Liveness::poll_children() {
  for (size_t r = 1; r < pids_.size(); ++r) {
    if (reaped_[r]) continue;
    const int status = reap(r);
    if (status != kRunning) return report(int(r), status);
  }
}

void Liveness::poll_peers() {
  // Reparenting is the quickest sign that the leader is gone.
  if (!pids_.empty() && pids_[0] > 0 && getppid() != pids_[0]) return report(0, kUnknown);
  for (size_t r = 0; r < pids_.size(); ++r) {
    if (int(r) != self_rank_ && pids_[r] > 0 && has_exited(pids_[r], pidfds_[r]))
      return report(int(r), kUnknown);
  }
}

void Liveness::report(int seen, int seen_status) {
  error_ = exited(seen, seen_status);
  // Ranks that notice a death stop too, so the rank seen here may only have followed another
  // one down; the first death anybody saw is the cause worth naming.
  int32_t cause = -1;
  if (!first_dead_ || first_dead_->compare_exchange_strong(cause, seen)) return;
  if (cause == seen || cause < 0 || size_t(cause) >= pids_.size()) return;
  // Somebody saw it exit, so its status is there or about to be.
  int cause_status = kUnknown;
  for (int i = 0; i < 200 && leader_ && !reaped_[size_t(cause)]; ++i) {
    cause_status = reap(size_t(cause));
    if (cause_status == kRunning) std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  error_ = str_cat(exited(cause, cause_status), "; then ", error_);
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
      const int status = reap(r);
      all = all && status != kRunning;
      if (status > 0 && failure.empty())
        failure = str_cat(exited(int(r), status), " after the shutdown message");
    }
    if (all) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t r = 1; r < pids_.size() && failure.empty(); ++r) {
        if (!reaped_[r])
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
