#include "run_worker.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "ranks/launch.h"

extern char** environ;

namespace deepinfer::ranks::test {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Live (not zombie) processes whose environment holds `marker`.
std::vector<pid_t> processes_with(const std::string& marker) {
  std::vector<pid_t> found;
  DIR* d = opendir("/proc");
  if (!d) return found;
  while (dirent* e = readdir(d)) {
    const pid_t pid = pid_t(std::atoi(e->d_name));
    if (pid <= 0 || pid == getpid()) continue;
    const std::string env = read_file(str_cat("/proc/", pid, "/environ"));
    if (env.find(marker) == std::string::npos) continue;
    const std::string stat = read_file(str_cat("/proc/", pid, "/stat"));
    const size_t close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() &&
        (stat[close + 2] == 'Z' || stat[close + 2] == 'X'))
      continue;
    found.push_back(pid);
  }
  closedir(d);
  return found;
}

std::vector<std::string> shm_names_of(pid_t leader) {
  std::vector<std::string> names;
  const std::string prefix = str_cat("deepinfer-", leader, "-");
  DIR* d = opendir("/dev/shm");
  if (!d) return names;
  while (dirent* e = readdir(d))
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) names.push_back(e->d_name);
  closedir(d);
  return names;
}

std::string temp_path(const char* what) {
  static std::atomic<int> n{0};
  return str_cat("/tmp/dist_test_", getpid(), "_", n.fetch_add(1), "_", what);
}

}  // namespace

uint64_t now_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000 + uint64_t(ts.tv_nsec) / 1000;
}

long long number_after(const std::string& text, const std::string& prefix) {
  const size_t at = text.find(prefix);
  if (at == std::string::npos) return -1;
  return std::atoll(text.c_str() + at + prefix.size());
}

std::string WorkerRun::describe() const {
  std::string s =
      str_cat("leader pid ", leader, " ", describe_exit_status(status),
              timed_out ? " (timed out)" : "", "\n--- stdout\n", out, "--- stderr\n", err);
  for (const Orphan& o : orphans)
    s += str_cat("orphan ", o.pid, " ", describe_exit_status(o.status), "\n");
  for (pid_t p : left_alive) s += str_cat("left alive: ", p, "\n");
  for (const std::string& n : shm_left) s += str_cat("left in /dev/shm: ", n, "\n");
  return s;
}

WorkerRun run_worker(const std::vector<std::string>& args, const std::vector<std::string>& env,
                     double timeout_s, const std::function<void(pid_t)>& while_running) {
  static const bool subreaper = prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
  DI_CHECK(subreaper, "cannot become a child subreaper");
  static std::atomic<int> runs{0};
  const std::string marker = str_cat("DEEPINFER_TEST_RUN=", getpid(), "_", runs.fetch_add(1));

  std::vector<std::string> argv_s = {DIST_WORKER};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  env_s.insert(env_s.end(), env.begin(), env.end());
  env_s.push_back(marker);
  // In sanitizer builds, the leak check at exit runs in a helper process of its own, which a
  // rank killed during that check leaves behind as an orphan of this test.
  env_s.push_back("ASAN_OPTIONS=detect_leaks=0");
  auto c_strings = [](std::vector<std::string>& v) {
    std::vector<char*> out;
    for (std::string& s : v) out.push_back(s.data());
    out.push_back(nullptr);
    return out;
  };
  std::vector<char*> argv = c_strings(argv_s), envp = c_strings(env_s);

  const std::string out_path = temp_path("out"), err_path = temp_path("err");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  // A test runner may start us with SIGINT ignored; the leader should see the default.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
  WorkerRun run;
  const int rc = posix_spawn(&run.leader, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  DI_CHECK(rc == 0, "posix_spawn ", argv[0], ": ", std::strerror(rc));
  if (while_running) while_running(run.leader);

  // Reap the leader, and any orphan reparented here meanwhile.
  const uint64_t deadline = now_us() + uint64_t(timeout_s * 1e6);
  bool leader_done = false;
  uint64_t grace_end = 0;
  for (;;) {
    int status = 0;
    const pid_t got = waitpid(-1, &status, WNOHANG);
    if (got > 0) {
      if (got == run.leader) {
        run.status = status;
        run.leader_end_us = now_us();
        leader_done = true;
        grace_end = run.leader_end_us + 5000000;
      } else {
        run.orphans.push_back({got, status, now_us()});
      }
      continue;
    }
    if (got < 0 && errno == ECHILD) break;  // nobody left
    const uint64_t now = now_us();
    if (!leader_done && now > deadline) {
      run.timed_out = true;
      kill(run.leader, SIGKILL);
    }
    if (leader_done && now > grace_end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  run.left_alive = processes_with(marker);
  for (pid_t p : run.left_alive) kill(p, SIGKILL);
  for (pid_t p : run.left_alive) waitpid(p, nullptr, 0);  // ours by now, or someone else's
  run.shm_left = shm_names_of(run.leader);
  run.out = read_file(out_path);
  run.err = read_file(err_path);
  unlink(out_path.c_str());
  unlink(err_path.c_str());
  return run;
}

}  // namespace deepinfer::ranks::test
