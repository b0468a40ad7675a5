#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "ranks/serial.h"
#include "util/subgroup.h"
#include "worker.h"

namespace deepinfer::ranks::test {

int g_rank = -1;

void fail(const std::string& msg) {
  std::fprintf(stderr, "FAIL rank %d: %s\n", g_rank, msg.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

uint64_t monotonic_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000 + uint64_t(ts.tv_nsec) / 1000;
}

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t test_hash(uint64_t seed, int rank, size_t j) {
  return mix(mix(seed) ^ mix(uint64_t(rank) * 0x100000001b3ull + 0x51) ^ mix(j));
}

bool same_bits(const void* a, const void* b, size_t n) {
  return n == 0 || !std::memcmp(a, b, n);
}

// A float with all its digits, so that values one ulp apart print differently.
std::string show(float x) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g (%a)", double(x), double(x));
  return buf;
}

// The first index where two float buffers differ in bits, for messages.
size_t first_difference(const float* a, const float* b, size_t n) {
  for (size_t j = 0; j < n; ++j)
    if (std::memcmp(a + j, b + j, sizeof(float))) return j;
  return n;
}

// Every rank's hash of its result must equal rank 0's.
void check_same_everywhere(Group& g, const void* p, size_t n, const char* what) {
  const uint64_t h = hash_bytes(p, n);
  std::vector<uint64_t> all(static_cast<size_t>(g.size()));
  g.all_gather(&h, sizeof h, all.data());
  for (int r = 0; r < g.size(); ++r)
    WORKER_CHECK(all[size_t(r)] == all[0], what, ": rank ", r, " holds different bits than rank 0");
}

std::vector<float> values(uint64_t seed, int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t j = 0; j < n; ++j) v[j] = test_value(seed, rank, j);
  return v;
}

void check_all_reduce(Group& g, size_t n, uint64_t seed) {
  const int size = g.size();
  std::vector<float> data = values(seed, g.rank(), n);
  // The expectation, written out here: rank 0 + rank 1 + ... in fp32, in that order.
  std::vector<float> want = values(seed, 0, n), reversed = values(seed, size - 1, n);
  for (int r = 1; r < size; ++r)
    for (size_t j = 0; j < n; ++j) want[j] += test_value(seed, r, j);
  for (int r = size - 2; r >= 0; --r)
    for (size_t j = 0; j < n; ++j) reversed[j] += test_value(seed, r, j);
  g.all_reduce(data.data(), n);
  const size_t bad = first_difference(data.data(), want.data(), n);
  WORKER_CHECK(bad == n, "all_reduce n=", n, " size=", size, ": element ", bad, " is ",
               show(data[bad]), ", fixed-order sum is ", show(want[bad]));
  // The data must be able to tell the orders apart, or this check proves little.
  if (size >= 3 && n >= 100)
    WORKER_CHECK(!same_bits(want.data(), reversed.data(), n * sizeof(float)),
                 "test data does not depend on the summation order");
  check_same_everywhere(g, data.data(), n * sizeof(float), "all_reduce");
}

void check_reduce_scatter(Group& g, size_t n_per_rank, uint64_t seed) {
  const int size = g.size(), me = g.rank();
  const size_t total = size_t(size) * n_per_rank;
  const std::vector<float> in = values(seed, me, total);
  std::vector<float> out(n_per_rank, -1.0f), want(n_per_rank);
  for (size_t j = 0; j < n_per_rank; ++j) {
    const size_t at = size_t(me) * n_per_rank + j;
    float acc = test_value(seed, 0, at);
    for (int r = 1; r < size; ++r) acc += test_value(seed, r, at);
    want[j] = acc;
  }
  g.reduce_scatter(in.data(), n_per_rank, out.data());
  const size_t bad = first_difference(out.data(), want.data(), n_per_rank);
  WORKER_CHECK(bad == n_per_rank, "reduce_scatter n_per_rank=", n_per_rank, " size=", size,
               ": element ", bad, " is ", show(out[bad]), ", fixed-order sum is ", show(want[bad]));
}

void check_all_gather(Group& g, size_t n_bytes, uint64_t seed) {
  const int size = g.size();
  std::vector<uint8_t> in(n_bytes), out(size_t(size) * n_bytes, 0xEE), want(out.size());
  for (size_t j = 0; j < n_bytes; ++j) in[j] = test_byte(seed, g.rank(), j);
  for (int r = 0; r < size; ++r)
    for (size_t j = 0; j < n_bytes; ++j) want[size_t(r) * n_bytes + j] = test_byte(seed, r, j);
  g.all_gather(in.data(), n_bytes, out.data());
  WORKER_CHECK(out == want, "all_gather n_bytes=", n_bytes, " size=", size);
}

void check_broadcast(Group& g, size_t n_bytes, uint64_t seed) {
  for (int root = 0; root < g.size(); ++root) {
    std::vector<uint8_t> data(n_bytes, uint8_t(0x5A + g.rank())), want(n_bytes);
    for (size_t j = 0; j < n_bytes; ++j) want[j] = test_byte(seed, root, j);
    if (g.rank() == root) data = want;
    g.broadcast(data.data(), n_bytes, root);
    WORKER_CHECK(data == want, "broadcast n_bytes=", n_bytes, " root=", root);
  }
}

void check_all_gather_v(Group& g, size_t base, uint64_t seed) {
  // Lengths differ by rank, one of them zero when there are several ranks.
  auto len_of = [&](int r) { return r == 1 ? 0 : base * size_t(r + 1) / 2 + size_t(r); };
  std::vector<uint8_t> mine(len_of(g.rank()));
  for (size_t j = 0; j < mine.size(); ++j) mine[j] = test_byte(seed, g.rank(), j);
  const auto all = g.all_gather_v(mine);
  WORKER_CHECK(int(all.size()) == g.size(), "all_gather_v returned ", all.size(), " messages");
  for (int r = 0; r < g.size(); ++r) {
    WORKER_CHECK(all[size_t(r)].size() == len_of(r), "all_gather_v base=", base, ": rank ", r,
                 " length ", all[size_t(r)].size());
    for (size_t j = 0; j < len_of(r); ++j)
      WORKER_CHECK(all[size_t(r)][j] == test_byte(seed, r, j), "all_gather_v base=", base, " rank ",
                   r, " byte ", j);
  }
}

// Nobody leaves a barrier before the last rank has arrived.
void check_barrier(Group& g) {
  for (int round = 0; round < 3; ++round) {
    const int late = round % g.size();
    if (g.rank() == late) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    const uint64_t arrived = monotonic_us();
    g.barrier();
    const uint64_t left = monotonic_us();
    uint64_t mine[2] = {arrived, left};
    std::vector<uint64_t> all(size_t(g.size()) * 2);
    g.all_gather(mine, sizeof mine, all.data());
    uint64_t last_arrival = 0, first_leave = UINT64_MAX;
    for (int r = 0; r < g.size(); ++r) {
      last_arrival = std::max(last_arrival, all[size_t(r) * 2]);
      first_leave = std::min(first_leave, all[size_t(r) * 2 + 1]);
    }
    WORKER_CHECK(first_leave >= last_arrival, "a rank left the barrier at ", first_leave,
                 " us before the last arrived at ", last_arrival, " us");
  }
}

}  // namespace

float test_value(uint64_t seed, int rank, size_t j) {
  const uint64_t h = test_hash(seed, rank, j);
  const float mant = 1.0f + float((h >> 8) & 0xFFFFFF) / 16777216.0f;
  const int exp = int((h >> 1) % 24) - 8;  // 2^-8 .. 2^15
  return (h & 1 ? -1.0f : 1.0f) * std::ldexp(mant, exp);
}

uint8_t test_byte(uint64_t seed, int rank, size_t j) {
  return uint8_t(test_hash(seed ^ 0xB17E, rank, j) >> 56);
}

uint64_t hash_bytes(const void* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

void check_collectives(Group& g, size_t slot_bytes, uint64_t seed) {
  const size_t slot_floats = slot_bytes / sizeof(float);
  const size_t float_sizes[] = {
      0, 1, 7, 1000, slot_floats - 1, slot_floats, slot_floats + 1, 3 * slot_floats + 5};
  // reduce_scatter carries size slices per slot, so its pieces turn over at slot / size.
  const size_t per_slot = slot_floats / size_t(g.size());
  const size_t scatter_sizes[] = {0, 1, 7, per_slot - 1, per_slot, per_slot + 1, 3 * per_slot + 5};
  const size_t byte_sizes[] = {
      0, 1, 7, 1001, slot_bytes - 1, slot_bytes, slot_bytes + 1, 3 * slot_bytes + 5};
  for (size_t n : float_sizes) check_all_reduce(g, n, seed + n);
  for (size_t n : scatter_sizes) check_reduce_scatter(g, n, seed + 7 * n);
  for (size_t n : byte_sizes) check_all_gather(g, n, seed + 11 * n);
  for (size_t n : byte_sizes) check_broadcast(g, n, seed + 13 * n);
  for (size_t n : {size_t(0), size_t(5), slot_bytes + 3}) check_all_gather_v(g, n, seed + 17 * n);
  check_barrier(g);
}

void check_subgroups(Group& world, size_t slot_bytes) {
  const int me = world.rank(), n = world.size();
  // Even and odd ranks, each ordered by descending world rank.
  std::unique_ptr<Group> parity = world.split(me % 2, -me);
  WORKER_CHECK(parity != nullptr, "split with a color returned no group");
  int expect_size = 0, expect_rank = 0;
  for (int r = 0; r < n; ++r) {
    if (r % 2 != me % 2) continue;
    ++expect_size;
    if (r > me) ++expect_rank;
  }
  WORKER_CHECK(parity->size() == expect_size && parity->rank() == expect_rank,
               "parity split: rank ", parity->rank(), " of ", parity->size(), ", expected ",
               expect_rank, " of ", expect_size);
  // Both halves run at the same time, each on its own data.
  check_collectives(*parity, slot_bytes, 1000 + uint64_t(me % 2));

  // Rank 0 opts out; the rest keep their order.
  std::unique_ptr<Group> rest = world.split(me == 0 ? -1 : 7, 0);
  if (me == 0) {
    WORKER_CHECK(rest == nullptr, "a negative color still gave a group");
  } else {
    WORKER_CHECK(rest && rest->size() == n - 1 && rest->rank() == me - 1, "split without rank 0");
    check_collectives(*rest, slot_bytes, 2000);
    // A split of a split.
    std::unique_ptr<Group> inner = rest->split(rest->rank() / 2, rest->rank());
    WORKER_CHECK(inner && inner->rank() == rest->rank() % 2, "nested split");
    check_all_reduce(*inner, 3000, 3000 + uint64_t(rest->rank() / 2));
  }

  // An explicit list, in a chosen order: the last rank first, then rank 0.
  if (n >= 2) {
    const int list[] = {n - 1, 0};
    std::unique_ptr<Group> pair = subgroup(world, list);
    if (me == n - 1 || me == 0) {
      WORKER_CHECK(pair && pair->size() == 2 && pair->rank() == (me == 0 ? 1 : 0), "subgroup");
      check_all_reduce(*pair, 2 * (slot_bytes / 4) + 3, 4000);
      check_reduce_scatter(*pair, slot_bytes / 4 + 1, 4001);
    } else {
      WORKER_CHECK(pair == nullptr, "a rank outside the list got a group");
    }
  }
}

// --- step channel ---

namespace {

size_t message_size(int i, size_t piece) {
  const size_t sizes[] = {0, 1, 63, piece - 1, piece, piece + 1, 3 * piece + 17, 200, 5000};
  return sizes[size_t(i) % (sizeof sizes / sizeof sizes[0])] + size_t(i / 9);
}

std::vector<uint8_t> make_message(int i, size_t piece) {
  Writer w;
  w.put<int32_t>(i);
  w.put_string(str_cat("step ", i));
  std::vector<float> floats(size_t(i % 5));
  for (size_t j = 0; j < floats.size(); ++j) floats[j] = test_value(uint64_t(i), 0, j);
  w.put_vector(floats);
  const size_t target = message_size(i, piece);
  const size_t head = w.bytes().size() + sizeof(uint64_t);  // the filler's length prefix
  std::vector<uint8_t> filler(target > head ? target - head : 0);
  for (size_t j = 0; j < filler.size(); ++j) filler[j] = test_byte(uint64_t(i), 1, j);
  w.put_vector(filler);
  return w.take();
}

}  // namespace

void check_channel(World& w, int n_messages, size_t piece_bytes) {
  Group& g = w.group();
  if (w.is_leader()) {
    for (int i = 0; i < n_messages; ++i) {
      w.channel().send(make_message(i, piece_bytes));
      // Now and then the step does collective work between messages, as a forward pass would.
      if (i % 10 == 0) {
        float x = float(i);
        g.all_reduce(&x, 1);
        WORKER_CHECK(x == float(i) * float(g.size()), "all_reduce between messages");
      }
    }
    w.channel().finish();
    std::printf("rank 0 sent %d messages\n", n_messages);
    return;
  }
  std::vector<uint8_t> msg;
  int received = 0;
  while (w.channel().receive(msg)) {
    const int i = received++;
    WORKER_CHECK(msg == make_message(i, piece_bytes), "message ", i, " (", msg.size(),
                 " bytes) differs from what the leader sent");
    Reader r(msg, "step message");
    WORKER_CHECK(r.get<int32_t>() == i, "message order");
    WORKER_CHECK(r.get_string() == str_cat("step ", i), "string field");
    WORKER_CHECK(r.get_vector<float>().size() == size_t(i % 5), "vector field");
    r.get_vector<uint8_t>();
    r.expect_end();
    if (i % 10 == 0) {
      float x = float(i);
      g.all_reduce(&x, 1);
      WORKER_CHECK(x == float(i) * float(g.size()), "all_reduce between messages");
    }
  }
  WORKER_CHECK(received == n_messages, "received ", received, " of ", n_messages, " messages");
  std::printf("rank %d received %d messages\n", g.rank(), received);
}

}  // namespace deepinfer::ranks::test
