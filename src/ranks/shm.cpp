// The shared-memory backend: the segment (shm.h), its names (launch.h), the launch of the
// followers, the watch on them, waits on the segment, groups, and the world.
#include "ranks/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <new>
#include <set>
#include <thread>
#include <vector>

#include "core/error.h"
#include "ranks/launch.h"

namespace deepinfer::ranks {

namespace shm {

namespace {

constexpr uint64_t kMagic = 0x3174736964504944ull;  // "DIPdist1"
constexpr uint32_t kVersion = 2;

// Sizes come from options a user may set, so the products are checked before they wrap.
uint64_t checked_mul(uint64_t a, uint64_t b, const char* what) {
  DI_REQUIRE(b == 0 || a <= UINT64_MAX / b, "shared-memory segment: ", what, " overflows");
  return a * b;
}

uint64_t group_stride(uint64_t world_size, uint64_t slot_bytes) {
  return sizeof(GroupArea) + checked_mul(2 * world_size, slot_bytes, "slots");
}

uint64_t segment_bytes(uint64_t world_size, uint64_t slot_bytes, uint64_t piece_bytes,
                       uint64_t max_groups) {
  return sizeof(Header) +
         checked_mul(max_groups, group_stride(world_size, slot_bytes), "group areas") +
         sizeof(GroupArea) + checked_mul(2, piece_bytes, "channel");
}

}  // namespace

std::unique_ptr<Segment> Segment::create(const std::string& name, int world_size,
                                         uint64_t slot_bytes, uint64_t piece_bytes,
                                         uint64_t max_groups) {
  DI_REQUIRE(world_size >= 1 && world_size <= kMaxRanks, "shared-memory world size ", world_size,
             " is outside [1, ", kMaxRanks, "]");
  DI_REQUIRE(slot_bytes >= 64 * uint64_t(world_size) && slot_bytes % 64 == 0, "shm slot size ",
             slot_bytes, " must be a multiple of 64 and at least 64 bytes per rank (",
             64 * world_size, ")");
  DI_REQUIRE(piece_bytes >= 64 && piece_bytes % 64 == 0, "channel piece size ", piece_bytes,
             " must be a multiple of 64 and at least 64");
  DI_REQUIRE(max_groups >= 1 && max_groups <= 4096, "shm group count ", max_groups,
             " is outside [1, 4096]");
  const uint64_t bytes = segment_bytes(uint64_t(world_size), slot_bytes, piece_bytes, max_groups);

  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  DI_REQUIRE(fd >= 0, "cannot create shared-memory segment ", name, ": ", std::strerror(errno));
  std::unique_ptr<Segment> s(new Segment(name, true));
  // Reserving the pages now turns a /dev/shm that is too small into an error here instead of a
  // SIGBUS in the middle of a collective.
  int err = ftruncate(fd, off_t(bytes)) == 0 ? 0 : errno;
  if (err == 0) err = posix_fallocate(fd, 0, off_t(bytes));
  if (err != 0) close(fd);
  DI_REQUIRE(err == 0, "cannot reserve ", bytes, " bytes of shared memory for ", name, ": ",
             std::strerror(err),
             " (a container may need a larger /dev/shm, e.g. docker --shm-size)");
  s->map(fd, bytes, str_cat("shared-memory segment ", name));

  Header* h = new (s->base_) Header();
  h->magic = kMagic;
  h->version = kVersion;
  h->world_size = uint32_t(world_size);
  h->total_bytes = bytes;
  h->slot_bytes = slot_bytes;
  h->piece_bytes = piece_bytes;
  h->max_groups = max_groups;
  h->next_group.store(1);  // area 0 is the world
  h->first_dead.store(-1);
  for (uint64_t g = 0; g <= max_groups; ++g) new (s->group(g)) GroupArea();
  return s;
}

std::unique_ptr<Segment> Segment::attach(const std::string& name, int world_size) {
  const std::string what = str_cat("DEEPINFER_SHM_NAME=", name);
  const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  DI_REQUIRE(fd >= 0, what, ": cannot open the shared-memory segment: ", std::strerror(errno),
             " (it exists only while the leader is starting its ranks)");
  struct stat st {};
  const bool big_enough = fstat(fd, &st) == 0 && uint64_t(st.st_size) >= sizeof(Header);
  if (!big_enough) close(fd);
  DI_REQUIRE(big_enough, what, ": the segment is too small to be one");
  std::unique_ptr<Segment> s(new Segment(name, false));
  s->map(fd, size_t(st.st_size), what);
  const Header* h = s->header();
  DI_REQUIRE(h->magic == kMagic && h->version == kVersion, what,
             ": not a segment of this DeepInfer version (magic/version mismatch)");
  DI_REQUIRE(h->total_bytes == s->bytes_, what, ": header says ", h->total_bytes,
             " bytes but the segment has ", s->bytes_);
  DI_REQUIRE(int(h->world_size) == world_size, "DEEPINFER_WORLD_SIZE=", world_size,
             " but the segment ", name, " was made for ", h->world_size, " ranks");
  DI_REQUIRE(
      segment_bytes(h->world_size, h->slot_bytes, h->piece_bytes, h->max_groups) == h->total_bytes,
      what, ": inconsistent layout in the segment header");
  return s;
}

void Segment::map(int fd, size_t bytes, const std::string& what) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  DI_REQUIRE(p != MAP_FAILED, what, ": cannot map: ", std::strerror(err));
  base_ = p;
  bytes_ = bytes;
}

Segment::~Segment() {
  unlink_name();
  if (base_) munmap(base_, bytes_);
}

void Segment::unlink_name() {
  if (linked_) shm_unlink(name_.c_str());
  linked_ = false;
}

GroupArea* Segment::group(uint64_t index) const {
  const Header* h = header();
  DI_CHECK(index <= h->max_groups);
  return reinterpret_cast<GroupArea*>(static_cast<uint8_t*>(base_) + sizeof(Header) +
                                      index * group_stride(h->world_size, h->slot_bytes));
}

}  // namespace shm

// --- segment names and exit statuses (launch.h) ---

void remove_stale_segments() {
  DIR* d = opendir("/dev/shm");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    int pid = 0, n = 0, used = 0;
    if (std::sscanf(e->d_name, "deepinfer-%d-%d%n", &pid, &n, &used) != 2 ||
        e->d_name[used] != '\0' || pid <= 0)
      continue;
    // A leader holds its name only while its followers start (a minute at most); an older
    // name whose pid is gone here is left over, not a leader in another pid namespace that
    // shares this /dev/shm.
    struct stat st {};
    const std::string path = str_cat("/dev/shm/", e->d_name);
    if (stat(path.c_str(), &st) != 0 || time(nullptr) - st.st_mtime < 600) continue;
    if (kill(pid, 0) != 0 && errno == ESRCH) shm_unlink(str_cat("/", e->d_name).c_str());
  }
  closedir(d);
}

std::string new_segment_name() {
  static std::atomic<int> counter{0};
  return str_cat("/deepinfer-", getpid(), "-", counter.fetch_add(1));
}

std::string describe_exit_status(int status) {
  if (!WIFSIGNALED(status))
    return str_cat("status ", WIFEXITED(status) ? WEXITSTATUS(status) : status);
  const int sig = WTERMSIG(status);
  const char* abbrev = sigabbrev_np(sig);
  return str_cat("status SIG", abbrev ? abbrev : "?", " (killed by signal ", sig, ")");
}

// --- launch of the followers ---

namespace {

using namespace std::chrono_literals;

// Whether `entry` ("NAME=value") sets one of the three rank variables.
bool is_rank_variable(std::string_view entry) {
  for (const char* name : {kEnvLocalRank, kEnvWorldSize, kEnvShmName})
    if (entry.starts_with(str_cat(name, "="))) return true;
  return false;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Starts ranks 1..world_size-1 as copies of this executable (/proc/self/exe) with this process's
// arguments and environment, plus the three rank variables (launch.h). Each follower gets SIGKILL
// when the leader dies, and gives up at once if the leader died before that was armed. Returns the
// pids by rank, pids[0] being this process. On failure, kills what it started and throws.
std::vector<int> spawn_followers(int world_size, const std::string& shm_name) {
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  DI_REQUIRE(cmdline, "cannot read /proc/self/cmdline to start the follower ranks");
  std::vector<std::string> args;
  for (std::string arg; std::getline(cmdline, arg, '\0');) args.push_back(arg);
  DI_REQUIRE(!args.empty(), "/proc/self/cmdline is empty");
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (!is_rank_variable(*e)) env.emplace_back(*e);
  env.push_back(str_cat(kEnvWorldSize, "=", world_size));
  env.push_back(str_cat(kEnvShmName, "=", shm_name));
  env.emplace_back();  // kEnvLocalRank, set for each follower
  // Everything the child touches is built before fork: between fork and exec it may only make
  // async-signal-safe calls (the leader may already run other threads).
  std::vector<char*> argv = c_strings(args);
  const pid_t leader = getpid();

  std::vector<int> pids(static_cast<size_t>(world_size), 0);
  pids[0] = leader;
  for (int r = 1; r < world_size; ++r) {
    env.back() = str_cat(kEnvLocalRank, "=", r);
    std::vector<char*> envp = c_strings(env);
    const pid_t pid = fork();
    if (pid == 0) {
      // The death signal follows the leader thread that forked; if the leader died before it
      // was armed, the parent is already someone else.
      if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != leader) _exit(126);
      execve("/proc/self/exe", argv.data(), envp.data());
      _exit(127);
    }
    if (pid < 0) {
      const int err = errno;
      for (int k = 1; k < r; ++k) kill(pids[size_t(k)], SIGKILL);
      for (int k = 1; k < r; ++k) waitpid(pids[size_t(k)], nullptr, 0);
      throw Error(
          str_cat("cannot start rank ", r, " of ", world_size, ": fork: ", std::strerror(err)));
    }
    pids[size_t(r)] = pid;
  }
  return pids;
}

// --- signal cleanup ---
// While armed, SIGINT or SIGTERM removes the segment name before the signal takes its previous
// course. Only one name is armed at a time; disarming restores the previous handlers.
// A signal handler can only reach static state; it holds one fixed-size name.

char g_armed_name[256];
std::atomic<bool> g_armed{false};
constexpr int kCleanupSignals[2] = {SIGINT, SIGTERM};
struct sigaction g_prev[2];  // by kCleanupSignals

void on_fatal_signal(int sig) {
  if (g_armed.exchange(false)) shm_unlink(g_armed_name);
  for (int i = 0; i < 2; ++i) sigaction(kCleanupSignals[i], &g_prev[i], nullptr);
  // Blocked until this handler returns, then delivered to the previous disposition.
  raise(sig);
}

void disarm_signal_cleanup() {
  // Restore only if our handler is still the one installed.
  if (!g_armed.exchange(false)) return;
  for (int i = 0; i < 2; ++i) {
    struct sigaction cur {};
    sigaction(kCleanupSignals[i], nullptr, &cur);
    if (cur.sa_handler == on_fatal_signal) sigaction(kCleanupSignals[i], &g_prev[i], nullptr);
  }
}

void arm_signal_cleanup(const std::string& shm_name) {
  DI_CHECK(shm_name.size() < sizeof g_armed_name && !g_armed.load());
  std::memcpy(g_armed_name, shm_name.c_str(), shm_name.size() + 1);
  g_armed.store(true);
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : kCleanupSignals) sigaddset(&sa.sa_mask, sig);
  // A signal the process was told to ignore (nohup, a background job) stays ignored.
  for (int i = 0; i < 2; ++i) {
    sigaction(kCleanupSignals[i], nullptr, &g_prev[i]);
    if (g_prev[i].sa_handler != SIG_IGN) sigaction(kCleanupSignals[i], &sa, nullptr);
  }
}

// --- liveness ---
// Knowing when another rank has died, so that no wait lasts forever. The leader spawned the
// followers and polls them with waitpid, which also gives their exit status; a follower is not
// its siblings' parent and watches every other rank through pidfds (readable once a process has
// exited, reaped or not, and immune to pid reuse).

// Microseconds on the monotonic clock.
uint64_t now_us() {
  const auto t = std::chrono::steady_clock::now().time_since_epoch();
  return uint64_t(std::chrono::duration_cast<std::chrono::microseconds>(t).count());
}

// Whether `pid` has exited: its pidfd is readable, or without one (an old kernel or a sandbox
// that forbids them) it is gone or a zombie nobody reaped.
bool has_died(int pid, int pidfd) {
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  }
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  // Polled while waiting, so it reads into a stack buffer and allocates nothing.
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char buf[512];
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  // The state follows the command name, which is in parentheses and may itself hold ") ".
  const char* end_of_name = std::strrchr(buf, ')');
  return end_of_name && end_of_name[1] == ' ' && (end_of_name[2] == 'Z' || end_of_name[2] == 'X');
}

std::string rank_name(int rank, int pid) {
  return str_cat("rank ", rank, " (pid ", pid, rank == 0 ? ", the leader)" : ")");
}

class Liveness {
 public:
  Liveness() = default;
  ~Liveness() { close_pidfds(); }
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // Rank `self_rank` watches the others: `pids[r]` is rank r (0 where not known yet;
  // pids[self_rank] is ignored); rank 0, the leader, spawned them. `first_dead` is a word shared
  // by all ranks (-1 at first) where the first rank seen dead is recorded, so that every rank
  // names the same cause.
  void watch(const std::vector<int>& pids, int self_rank, std::atomic<int32_t>* first_dead) {
    self_rank_ = self_rank;
    first_dead_ = first_dead;
    pids_ = pids;
    reaped_.assign(pids.size(), false);  // one's own entry counts as reaped
    reaped_[size_t(self_rank)] = true;
    close_pidfds();
    pidfds_.assign(pids.size(), -1);
    // -1 where the kernel or a sandbox gives no pidfd.
    for (size_t r = 0; r < pids.size(); ++r)
      if (!leader() && !reaped_[r] && pids[r] > 0)
        pidfds_[r] = int(syscall(SYS_pidfd_open, pids[r], 0));
  }

  // The error message naming the first rank found dead, or empty while everyone is alive; once
  // one is found, the same message for good.
  const std::string& poll() {
    // Reparenting is the quickest sign that the leader is gone.
    if (error_.empty() && !leader() && pids_[0] > 0 && getppid() != pids_[0]) report(0, kUnknown);
    for (size_t r = 0; r < pids_.size() && error_.empty(); ++r) {
      if (reaped_[r] || pids_[r] <= 0) continue;
      // The leader reaps its children and so learns their status; the others only see them go.
      const int status = leader() ? reap(r) : has_died(pids_[r], pidfds_[r]) ? kUnknown : kRunning;
      if (status != kRunning) report(int(r), status);
    }
    return error_;
  }

  // The leader, after the shutdown message: waits up to `timeout_s` for every follower to exit
  // and throws if one exited with a non-zero status or had to be killed.
  void reap_children(double timeout_s) {
    DI_CHECK(leader());
    const uint64_t deadline = now_us() + uint64_t(timeout_s * 1e6);
    std::string failure;
    for (auto sleep = 100us;; sleep = std::min(sleep * 2, 20000us)) {
      for (size_t r = 1; r < pids_.size(); ++r) {
        const int status = reaped_[r] ? kRunning : reap(r);
        if (status > 0 && failure.empty())
          failure = str_cat(exited(int(r), status), " after the shutdown message");
      }
      const auto running = std::find(reaped_.begin(), reaped_.end(), false);
      if (running == reaped_.end()) break;
      if (now_us() > deadline) {
        const int r = int(running - reaped_.begin());
        if (failure.empty())
          failure = str_cat(rank_name(r, pids_[size_t(r)]), " did not exit within ", timeout_s,
                            " s of the shutdown message and was killed");
        kill_children();
        break;
      }
      std::this_thread::sleep_for(sleep);
    }
    DI_REQUIRE(failure.empty(), failure);
  }

  // The leader on an error path: SIGKILL and reap every follower still running.
  void kill_children() noexcept {
    if (!leader()) return;
    for (size_t r = 1; r < pids_.size(); ++r)
      if (!reaped_[r]) kill(pids_[r], SIGKILL);
    // Waits for each, again where a signal interrupted the wait.
    for (size_t r = 1; r < pids_.size(); ++r)
      while (!reaped_[r] && waitpid(pids_[r], nullptr, 0) < 0 && errno == EINTR) continue;
    reaped_.assign(pids_.size(), true);
  }

 private:
  bool leader() const { return self_rank_ == 0; }

  // Leader: follower r's wait status once it has exited (reaping it), kUnknown when it was
  // reaped elsewhere, kRunning while it runs.
  static constexpr int kRunning = -2, kUnknown = -1;
  int reap(size_t r) {
    int status = 0;
    const int got = waitpid(pids_[r], &status, WNOHANG);
    if (got != pids_[r] && !(got < 0 && errno == ECHILD)) return kRunning;
    reaped_[r] = true;
    // ECHILD: reaped behind our back (SIGCHLD ignored).
    return got == pids_[r] ? status : kUnknown;
  }

  std::string exited(int r, int status) const {
    return str_cat(rank_name(r, pids_[size_t(r)]), " exited",
                   status >= 0 ? str_cat(" with ", describe_exit_status(status)) : "");
  }

  void report(int seen, int seen_status) {
    error_ = exited(seen, seen_status);
    // Ranks that notice a death stop too, so the rank seen here may only have followed another
    // one down; the first death anybody saw is the cause worth naming.
    int32_t cause = -1;
    if (!first_dead_ || first_dead_->compare_exchange_strong(cause, seen)) return;
    if (cause == seen || cause < 0 || size_t(cause) >= pids_.size()) return;
    // Somebody saw it exit, so its status is there or about to be.
    int cause_status = kUnknown;
    for (int i = 0; i < 200 && leader() && !reaped_[size_t(cause)]; ++i) {
      cause_status = reap(size_t(cause));
      if (cause_status == kRunning) std::this_thread::sleep_for(500us);
    }
    error_ = str_cat(exited(cause, cause_status), "; then ", error_);
  }

  void close_pidfds() {
    for (int fd : pidfds_)
      if (fd >= 0) close(fd);
  }

  int self_rank_ = 0;
  std::vector<int> pids_;     // [world_size], by rank
  std::vector<int> pidfds_;   // [world_size], -1 where none (follower only)
  std::vector<bool> reaped_;  // [world_size]: the leader's children reaped, and one's own entry
  std::string error_;
  std::atomic<int32_t>* first_dead_ = nullptr;
};

// --- waits ---
// A wait spins briefly and then sleeps on a futex (shared, not private: the word lives in
// memory mapped by several processes), waking every few milliseconds to check that the other
// ranks are alive.

// Returns after a wake, a change of the value from `seen`, or 5 ms.
void futex_sleep(shm::Word& w, uint32_t seen) {
  w.sleepers.fetch_add(1, std::memory_order_seq_cst);
  timespec timeout{0, 5 * 1000 * 1000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w.value), FUTEX_WAIT, seen, &timeout, nullptr, 0);
  w.sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

// After making a condition true: bump the word and wake its sleepers.
void notify(shm::Word& w) {
  w.value.fetch_add(1, std::memory_order_seq_cst);
  if (w.sleepers.load(std::memory_order_seq_cst) != 0)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w.value), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

// Blocks until `ready()` holds; `w.value` changes whenever it may have become true. If a rank
// has died and the condition still does not hold, throws its error. False if the condition still
// does not hold at `deadline_us` (now_us()).
template <typename Ready>
bool wait_until(shm::Word& w, Ready&& ready, Liveness& alive, uint64_t deadline_us = UINT64_MAX) {
  // A short spin catches ranks that arrive within microseconds of each other; yielding after
  // that lets a late rank run when there are more ranks than cores.
  for (int i = 0; i < 256; ++i) {
    if (ready()) return true;
    if (i >= 128)
      std::this_thread::yield();
    else
      __builtin_ia32_pause();
  }
  uint64_t next_check = 0;
  for (;;) {
    const uint32_t seen = w.value.load(std::memory_order_seq_cst);
    if (ready()) return true;
    const uint64_t now = now_us();
    if (now > deadline_us) return false;
    if (now >= next_check) {
      next_check = now + 5000;
      if (const std::string& dead = alive.poll(); !dead.empty()) {
        // A rank that exits right after the condition became true (a follower after the
        // shutdown message) is no failure of this wait.
        if (ready()) return true;
        throw Error(dead);
      }
    }
    futex_sleep(w, seen);
  }
}

// What every group of this process shares: the mapping and the watch on the other ranks.
struct ShmState {
  std::unique_ptr<shm::Segment> segment;
  Liveness alive;

  int world_size() const { return int(segment->header()->world_size); }
};

// A collective runs in rounds. In a round every member writes up to one slot of data into its
// own slot, everyone meets at the group's barrier, and then everyone reads what it needs from
// the others' slots. Each member has two slots and rounds alternate between them: a rank may
// write round k+1 as soon as it leaves barrier k, because every rank arrived there only after it
// had finished reading round k-1 from the same slots. So one barrier per round suffices, and
// nothing has to be waited for at the end of a collective.
//
// Sums read all members' slots and add them in rank order on every rank, so the bits agree.
class ShmGroup final : public Group {
 public:
  // Member `rank` of `size` (at least 2) in area `area` (max_groups: the step channel's).
  ShmGroup(std::shared_ptr<ShmState> state, uint64_t area, int rank, int size)
      : state_(std::move(state)),
        area_(state_->segment->group(area)),
        slot_bytes_(area == state_->segment->header()->max_groups
                        ? state_->segment->header()->piece_bytes
                        : state_->segment->header()->slot_bytes),
        rank_(rank),
        size_(size),
        parts_(size_t(size)) {
    DI_CHECK(size >= 2 && size <= state_->world_size() && rank >= 0 && rank < size);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void barrier() override {
    const uint32_t gen = area_->gen.value.load(std::memory_order_acquire);
    if (area_->arrived.value.fetch_add(1, std::memory_order_acq_rel) == uint32_t(size_ - 1)) {
      // Last to arrive: reset the count for the next generation before releasing everyone.
      area_->arrived.value.store(0, std::memory_order_relaxed);
      notify(area_->gen);
      return;
    }
    wait_until(
        area_->gen, [&] { return area_->gen.value.load(std::memory_order_acquire) != gen; },
        state_->alive);
  }

  void broadcast(void* data, size_t n_bytes, int root) override {
    check_root(root);
    auto* bytes = static_cast<uint8_t*>(data);
    rounds(n_bytes, slot_bytes_, [&](size_t off, size_t len) {
      if (rank_ == root) std::memcpy(slot(root), bytes + off, len);
      barrier();
      if (rank_ != root) std::memcpy(bytes + off, slot(root), len);
    });
  }

  void all_reduce(float* data, size_t n) override {
    rounds(n, slot_bytes_ / sizeof(float), [&](size_t off, size_t len) {
      std::memcpy(slot(rank_), data + off, len * sizeof(float));
      sum_slots(0, len, data + off);
    });
  }

  void all_gather(const void* in, size_t n_bytes_each, void* out) override {
    const auto* src = static_cast<const uint8_t*>(in);
    auto* dst = static_cast<uint8_t*>(out);
    rounds(n_bytes_each, slot_bytes_, [&](size_t off, size_t len) {
      std::memcpy(slot(rank_), src + off, len);
      barrier();
      for (int m = 0; m < size_; ++m)
        std::memcpy(dst + size_t(m) * n_bytes_each + off, slot(m), len);
    });
  }

  void reduce_scatter(const float* in, size_t n_per_rank, float* out) override {
    // Each round carries a slice of every destination's part: [size_, chunk] floats per slot.
    const size_t chunk = slot_bytes_ / sizeof(float) / size_t(size_);
    rounds(n_per_rank, chunk, [&](size_t off, size_t len) {
      auto* mine = reinterpret_cast<float*>(slot(rank_));
      for (int d = 0; d < size_; ++d)
        std::memcpy(mine + size_t(d) * chunk, in + size_t(d) * n_per_rank + off,
                    len * sizeof(float));
      sum_slots(size_t(rank_) * chunk, len, out + off);
    });
  }

  std::unique_ptr<Group> split(int color, int key) override;

 private:
  // The member's slot of the current round.
  uint8_t* slot(int member) const {
    return reinterpret_cast<uint8_t*>(area_ + 1) +
           (size_t(member) * 2 + (round_ & 1)) * slot_bytes_;
  }

  // Calls round(off, len) for [0, n) in pieces of `chunk`; each round uses the other slots.
  template <typename Round>
  void rounds(size_t n, size_t chunk, Round&& round) {
    for (size_t off = 0; off < n; off += chunk) {
      round(off, std::min(chunk, n - off));
      ++round_;
    }
  }

  // Meets the others once every member has written its slot, then out[0, len) = the sum in
  // rank order of the members' slots from float `at` on.
  void sum_slots(size_t at, size_t len, float* out) {
    barrier();
    for (int m = 0; m < size_; ++m)
      parts_[size_t(m)] = reinterpret_cast<const float*>(slot(m)) + at;
    sum_in_rank_order(parts_.data(), size_, len, out);
  }

  std::shared_ptr<ShmState> state_;
  shm::GroupArea* area_;
  size_t slot_bytes_;
  int rank_, size_;
  uint64_t round_ = 0;
  std::vector<const float*> parts_;  // [size_], scratch for sums
};

std::unique_ptr<Group> ShmGroup::split(int color, int key) {
  struct Entry {
    int32_t color, key;
  };
  std::vector<Entry> entries(static_cast<size_t>(size_));
  const Entry me{color, key};
  all_gather(&me, sizeof me, entries.data());

  std::set<int32_t> colors;
  for (const Entry& e : entries)
    if (e.color >= 0) colors.insert(e.color);

  // Rank 0 takes one fresh area per color for everybody; areas are numbered in color order.
  shm::Header* h = state_->segment->header();
  uint64_t base = 0;
  if (rank_ == 0 && !colors.empty()) {
    base = h->next_group.fetch_add(uint32_t(colors.size()));
    if (base + colors.size() > h->max_groups) base = UINT64_MAX;
  }
  broadcast(&base, sizeof base, 0);
  DI_REQUIRE(base != UINT64_MAX, "split: the shared-memory segment has room for ", h->max_groups,
             " groups (the world included) and they are taken; raise "
             "WorldOptions::shm_max_groups");
  if (color < 0) return nullptr;

  std::vector<int> members;  // ranks here with my color, in new-rank order
  for (int r = 0; r < size_; ++r)
    if (entries[size_t(r)].color == color) members.push_back(r);
  if (members.size() == 1) return make_single_group();
  std::ranges::stable_sort(members, {}, [&](int r) { return entries[size_t(r)].key; });
  const int new_rank = int(std::ranges::find(members, rank_) - members.begin());
  const uint64_t area = base + uint64_t(std::distance(colors.begin(), colors.find(color)));
  return std::make_unique<ShmGroup>(state_, area, new_rank, int(members.size()));
}

class ShmWorld final : public World {
 public:
  // World rank `rank` of the ranks in `s`.
  ShmWorld(const std::shared_ptr<ShmState>& s, int rank, const WorldOptions& options)
      : World(Backend::kShm, std::make_unique<ShmGroup>(s, 0, rank, s->world_size()),
              // Broadcasts from rank 0 only, so the channel's area has rank 0's slots only.
              std::make_unique<StepChannel>(std::make_unique<ShmGroup>(
                  s, s->segment->header()->max_groups, rank, s->world_size()))),
        state_(s),
        exit_timeout_s_(options.exit_timeout_s) {}

  // The leader's error path (on followers this does nothing).
  ~ShmWorld() override {
    if (!finished_) state_->alive.kill_children();
  }

  std::string dead_rank() override { return state_->alive.poll(); }

  void finish() override {
    if (finished_) return;
    channel_->finish();
    finished_ = true;
    if (is_leader()) state_->alive.reap_children(exit_timeout_s_);
  }

 private:
  std::shared_ptr<ShmState> state_;
  double exit_timeout_s_;
  bool finished_ = false;
};

}  // namespace

std::unique_ptr<World> make_shm_leader(const WorldOptions& o) {
  auto state = std::make_shared<ShmState>();
  remove_stale_segments();
  std::string name = new_segment_name();
  // A name left by an earlier process with this pid is skipped; the next number is free.
  while (access(str_cat("/dev/shm", name).c_str(), F_OK) == 0) name = new_segment_name();
  // SIGINT/SIGTERM remove the name, armed before it exists so that no signal finds it unguarded.
  arm_signal_cleanup(name);
  shm::Header* h = nullptr;
  try {
    state->segment =
        shm::Segment::create(name, o.world_size, o.shm_slot_bytes, o.channel_piece_bytes,
                             uint64_t(std::max(o.shm_max_groups, 0)));
    h = state->segment->header();
    h->pids[0] = int32_t(getpid());
    const std::vector<int> pids = spawn_followers(o.world_size, name);
    state->alive.watch(pids, 0, &h->first_dead);
    const uint32_t followers = uint32_t(o.world_size - 1);
    const bool joined = wait_until(
        h->joined, [&] { return h->joined.value.load(std::memory_order_acquire) >= followers; },
        state->alive, now_us() + uint64_t(o.join_timeout_s * 1e6));
    DI_REQUIRE(joined, "only ", h->joined.value.load(), " of ", followers,
               " follower ranks joined within ", o.join_timeout_s, " s");
    for (int r = 1; r < o.world_size; ++r)
      DI_REQUIRE(h->pids[r] == pids[size_t(r)], "rank ", r, " of segment ", name,
                 " was joined by pid ", h->pids[r], ", not by pid ", pids[size_t(r)],
                 " that was started for it");
  } catch (...) {
    state->alive.kill_children();
    disarm_signal_cleanup();
    throw;
  }
  // Everyone has it mapped: without a name, nothing is left behind however the run ends.
  state->segment->unlink_name();
  disarm_signal_cleanup();
  h->started.value.store(1, std::memory_order_release);
  notify(h->started);
  return std::make_unique<ShmWorld>(state, 0, o);
}

std::unique_ptr<World> make_shm_follower(const WorldOptions& options, int rank, int world_size,
                                         const std::string& shm_name) {
  auto state = std::make_shared<ShmState>();
  state->segment = shm::Segment::attach(shm_name, world_size);
  shm::Header* h = state->segment->header();
  const int leader = h->pids[0];
  DI_REQUIRE(getppid() == leader, kEnvLocalRank, "=", rank, " is set but this process (pid ",
             getpid(), ") was not started by the leader (pid ", leader, ") of ", shm_name);
  DI_REQUIRE(h->pids[rank] == 0, kEnvLocalRank, "=", rank, ": rank ", rank, " of ", shm_name,
             " was already joined by pid ", h->pids[rank]);
  h->pids[rank] = int32_t(getpid());
  std::vector<int> pids(static_cast<size_t>(world_size), 0);
  pids[0] = leader;
  state->alive.watch(pids, rank, &h->first_dead);
  notify(h->joined);  // its value counts the followers that joined
  wait_until(
      h->started, [&] { return h->started.value.load(std::memory_order_acquire) != 0; },
      state->alive);
  state->alive.watch(std::vector<int>(h->pids, h->pids + world_size), rank, &h->first_dead);
  return std::make_unique<ShmWorld>(state, rank, options);
}

}  // namespace deepinfer::ranks
