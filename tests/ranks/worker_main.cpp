// ranks_worker <scenario> [key=value ...]: see worker.h. The leader is started by a test (or by
// mpirun); with ranks=N it spawns the other ranks itself, which run this same command line.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "ranks/launch.h"
#include "worker.h"

namespace deepinfer::ranks::test {
namespace {

void sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// A follower (or the leader) dies at a chosen point; the others must notice.
void scenario_kill(World& w, const Args& a) {
  const int victim = a.get_int("victim", 1), at = a.get_int("at", 3);
  const std::string where = a.get("where", "collective");
  const size_t n = size_t(a.get_int("floats", 3000));
  auto die = [&] {
    say(str_cat("rank ", w.rank(), " dying at ", monotonic_us(), " us"));
    if (where == "exit") std::_Exit(5);
    raise(SIGKILL);
  };
  if (where == "collective" || where == "exit") {
    std::vector<float> buf(n, 1.0f);
    for (int it = 0; it < at + 100000; ++it) {
      if (w.rank() == victim && it == at) die();
      w.group().all_reduce(buf.data(), n);
      std::fill(buf.begin(), buf.end(), 1.0f);
    }
    return;
  }
  // where == "channel": the victim is blocked in receive when it is killed. With big=1 every
  // message spans several pieces and the victim kills itself after one, so the leader is the
  // one left waiting, for acknowledgements that never come.
  const bool big = a.get_int("big", 0) != 0;
  const size_t piece = size_t(a.get_int("piece", 256 << 10));
  std::vector<uint8_t> msg(big ? 5 * piece : 100, 0x42);
  std::vector<int> pids(size_t(w.size()));
  const int me = int(getpid());
  w.group().all_gather(&me, sizeof me, pids.data());
  if (w.is_leader()) {
    for (int i = 0; i < at + 1000; ++i) {
      w.channel().send(msg);
      if (!big) sleep_ms(20);
      if (i == at && victim != 0 && !big) {
        say(str_cat("rank ", victim, " dying at ", monotonic_us(), " us"));
        kill(pids[size_t(victim)], SIGKILL);
      }
      if (i == at && victim == 0) die();
    }
    return;
  }
  std::vector<uint8_t> got;
  for (int i = 0; w.channel().receive(got); ++i)
    if (big && i == at && w.rank() == victim) die();
}

// A split beyond the segment's room for groups fails alike on every rank, and the world stays
// usable.
void scenario_exhaust(World& w) {
  bool threw = false;
  try {
    w.group().split(w.rank() % 2, 0);
  } catch (const Error& e) {
    threw = std::strstr(e.what(), "shm_max_groups") != nullptr;
    WORKER_CHECK(threw, "unexpected message: ", e.what());
  }
  WORKER_CHECK(threw, "a split beyond the segment's groups did not throw");
  float x = 1.0f;
  w.group().all_reduce(&x, 1);
  WORKER_CHECK(x == float(w.size()), "the world is unusable after the failed split");
  say(str_cat("rank ", w.rank(), " ok exhausted"));
}

void scenario_env(World& w, const Args& a, int argc, char** argv) {
  const char* mark = std::getenv("DEEPINFER_TEST_MARK");
  WORKER_CHECK(mark && a.get("mark") == mark, "DEEPINFER_TEST_MARK did not reach rank ", w.rank());
  const char* blocks = std::getenv("DEEPINFER_NUM_KV_BLOCKS");
  WORKER_CHECK(blocks && std::string(blocks) == "123", "DEEPINFER_NUM_KV_BLOCKS");
  const char* local = std::getenv(kEnvLocalRank);
  if (w.is_leader()) {
    WORKER_CHECK(local == nullptr, "the leader has ", kEnvLocalRank);
  } else {
    WORKER_CHECK(local && std::atoi(local) == w.rank(), kEnvLocalRank, " of rank ", w.rank());
  }
  std::string joined;
  for (int i = 1; i < argc; ++i) joined += std::string(argv[i]) + '\n';
  const auto all =
      w.group().all_gather_v({reinterpret_cast<const uint8_t*>(joined.data()), joined.size()});
  for (const auto& other : all)
    WORKER_CHECK(std::string(other.begin(), other.end()) == joined, "arguments differ by rank");
  say(str_cat("rank ", w.rank(), " ok env"));
}

void scenario_bench(World& w) {
  Group& g = w.group();
  auto time_it = [&](const char* what, int iters, auto&& fn) {
    g.barrier();
    const uint64_t t0 = monotonic_us();
    for (int i = 0; i < iters; ++i) fn();
    g.barrier();
    const double us = double(monotonic_us() - t0) / iters;
    if (w.is_leader()) say(str_cat("bench ", w.size(), " ranks: ", what, ": ", us, " us"));
    return us;
  };
  time_it("barrier", 2000, [&] { g.barrier(); });
  std::vector<float> hidden(7168, 1.0f);
  time_it("all_reduce 7168 floats", 2000, [&] { g.all_reduce(hidden.data(), hidden.size()); });
  std::vector<float> big(size_t(4) << 20, 1.0f);
  const double us =
      time_it("all_reduce 4M floats", 10, [&] { g.all_reduce(big.data(), big.size()); });
  if (w.is_leader())
    say(str_cat("bench all_reduce 4M floats: ", 16.0 * 1048576 / us / 1e3,
                " GB/s of input per rank"));
  std::vector<float> rs(size_t(1) << 20);
  time_it("reduce_scatter 1M floats/rank", 10, [&] {
    std::vector<float> in(rs.size() * size_t(g.size()), 1.0f);
    g.reduce_scatter(in.data(), rs.size(), rs.data());
  });
  // Step messages of 4 KiB, as a small decode batch would send.
  std::vector<uint8_t> msg(4096, 1);
  g.barrier();
  const uint64_t t0 = monotonic_us();
  const int n_msgs = 5000;
  if (w.is_leader()) {
    for (int i = 0; i < n_msgs; ++i) w.channel().send(msg);
  } else {
    for (int i = 0; i < n_msgs; ++i) w.channel().receive(msg);
  }
  g.barrier();
  if (w.is_leader())
    say(str_cat("bench channel 4 KiB messages: ", double(monotonic_us() - t0) / n_msgs, " us"));
}

int run(int argc, char** argv) {
  Args a;
  if (argc >= 2) a.scenario = argv[1];
  for (int i = 2; i < argc; ++i) {
    const char* eq = std::strchr(argv[i], '=');
    if (eq) a.kv[std::string(argv[i], size_t(eq - argv[i]))] = eq + 1;
  }
  WorldOptions o;
  o.world_size = a.get_int("ranks", 0);
  o.shm_slot_bytes = size_t(a.get_int("slot", 256 << 10));
  o.channel_piece_bytes = size_t(a.get_int("piece", 256 << 10));
  o.shm_max_groups = a.get_int("groups", 16);
  o.join_timeout_s = a.get_int("join_timeout_ms", 20000) / 1000.0;
  if (std::getenv(kEnvLocalRank)) sleep_ms(a.get_int("join_delay_ms", 0));

  std::unique_ptr<World> w;
  try {
    w = init_world(o);
    g_rank = w->rank();
    say(str_cat("rank ", w->rank(), " of ", w->size(), " pid ", getpid(), " backend ",
                backend_name(w->backend())));
    const std::string expect = a.get("expect");
    WORKER_CHECK(expect.empty() || expect == backend_name(w->backend()), "backend");
    const std::string& s = a.scenario;
    if (s == "collectives" || s == "all") {
      check_collectives(w->group(), o.shm_slot_bytes, 1);
      check_subgroups(w->group(), o.shm_slot_bytes);
      say(str_cat("rank ", w->rank(), " ok collectives"));
    }
    if (s == "channel" || s == "all")
      check_channel(*w, a.get_int("messages", 200), o.channel_piece_bytes);
    if (s == "kill") scenario_kill(*w, a);
    if (s == "exhaust") scenario_exhaust(*w);
    if (s == "env") scenario_env(*w, a, argc, argv);
    if (s == "bench") scenario_bench(*w);
    if (s == "leader-throws" && w->is_leader()) {
      float x = 1;
      w->group().all_reduce(&x, 1);
      throw Error("deliberate failure on the leader");
    }
    if (s == "leader-throws" && !w->is_leader()) {
      float x = 1;
      w->group().all_reduce(&x, 1);
      std::vector<uint8_t> msg;
      while (w->channel().receive(msg)) {
      }
    }
    w->finish();
    say(str_cat("rank ", w->rank(), " done"));
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d error at %llu us: %s\n", g_rank,
                 static_cast<unsigned long long>(monotonic_us()), e.what());
    std::fflush(stderr);
    return 3;
  }
}

}  // namespace
}  // namespace deepinfer::ranks::test

int main(int argc, char** argv) {
  return deepinfer::ranks::test::run(argc, argv);
}
