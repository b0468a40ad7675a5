#include "ranks/launch.h"

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>

#include "core/error.h"

extern char** environ;

namespace deepinfer::ranks {

namespace {

std::vector<std::string> own_arguments() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  DI_REQUIRE(f, "cannot read /proc/self/cmdline to start the follower ranks");
  std::vector<std::string> args;
  for (std::string arg; std::getline(f, arg, '\0');) args.push_back(arg);
  DI_REQUIRE(!args.empty(), "/proc/self/cmdline is empty");
  return args;
}

bool is_rank_variable(const char* entry) {
  for (const char* name : {kEnvLocalRank, kEnvWorldSize, kEnvShmName}) {
    const size_t n = std::strlen(name);
    if (std::strncmp(entry, name, n) == 0 && entry[n] == '=') return true;
  }
  return false;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::vector<int> spawn_followers(int world_size, const std::string& shm_name) {
  std::vector<std::string> args = own_arguments();
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
// A signal handler can only reach static state; it holds one fixed-size name.

namespace {

char g_armed_name[256];
std::atomic<bool> g_armed{false};
struct sigaction g_prev_int, g_prev_term;

void on_fatal_signal(int sig) {
  if (g_armed.exchange(false)) shm_unlink(g_armed_name);
  sigaction(SIGINT, &g_prev_int, nullptr);
  sigaction(SIGTERM, &g_prev_term, nullptr);
  // Blocked until this handler returns, then delivered to the previous disposition.
  raise(sig);
}

}  // namespace

void arm_signal_cleanup(const std::string& shm_name) {
  DI_CHECK(shm_name.size() < sizeof g_armed_name);
  disarm_signal_cleanup();
  std::memcpy(g_armed_name, shm_name.c_str(), shm_name.size() + 1);
  g_armed.store(true);
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);
  sigaddset(&sa.sa_mask, SIGTERM);
  // A signal the process was told to ignore (nohup, a background job) stays ignored.
  sigaction(SIGINT, nullptr, &g_prev_int);
  sigaction(SIGTERM, nullptr, &g_prev_term);
  if (g_prev_int.sa_handler != SIG_IGN) sigaction(SIGINT, &sa, nullptr);
  if (g_prev_term.sa_handler != SIG_IGN) sigaction(SIGTERM, &sa, nullptr);
}

void disarm_signal_cleanup() {
  // Restore only if our handler is still the one installed.
  if (!g_armed.exchange(false)) return;
  struct sigaction cur {};
  sigaction(SIGINT, nullptr, &cur);
  if (cur.sa_handler == on_fatal_signal) sigaction(SIGINT, &g_prev_int, nullptr);
  sigaction(SIGTERM, nullptr, &cur);
  if (cur.sa_handler == on_fatal_signal) sigaction(SIGTERM, &g_prev_term, nullptr);
}

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

}  // namespace deepinfer::ranks
