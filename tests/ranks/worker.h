// The rank program of the rank tests: every rank of a run executes it, the leader started by a
// test (or by mpirun), the followers started by the leader. Scenarios check their results
// against values each rank computes on its own, print a line per rank and exit non-zero on any
// mismatch.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "ranks/group.h"
#include "ranks/world.h"

namespace deepinfer::ranks::test {

// key=value arguments after the scenario name.
struct Args {
  std::string scenario;
  std::map<std::string, std::string> kv;

  int get_int(const std::string& key, int fallback) const {
    auto it = kv.find(key);
    return it == kv.end() ? fallback : std::atoi(it->second.c_str());
  }
  std::string get(const std::string& key, const std::string& fallback = "") const {
    auto it = kv.find(key);
    return it == kv.end() ? fallback : it->second;
  }
};

// This process's world rank for messages (-1 before the world exists).
extern int g_rank;

// Prints the failure and ends the process at once with status 1.
[[noreturn]] void fail(const std::string& msg);

#define WORKER_CHECK(cond, ...)                                                                 \
  do {                                                                                          \
    if (!(cond)) ::deepinfer::ranks::test::fail(::deepinfer::str_cat(#cond, ": ", __VA_ARGS__)); \
  } while (0)

uint64_t monotonic_us();

// A value that depends on (seed, rank, j) only, of widely varying magnitude so that fp32 sums
// depend on their order.
float test_value(uint64_t seed, int rank, size_t j);
uint8_t test_byte(uint64_t seed, int rank, size_t j);
// A hash of a buffer, for comparing results across ranks.
uint64_t hash_bytes(const void* p, size_t n);

// Every collective of `g` over the sizes that matter for a slot of `slot_bytes`; `seed` makes
// the data of different groups differ.
void check_collectives(Group& g, size_t slot_bytes, uint64_t seed);
// split/subgroup shapes and collectives inside the new groups.
void check_subgroups(Group& world, size_t slot_bytes);
// The leader sends `n_messages` of varying sizes; followers check each one.
void check_channel(World& w, int n_messages, size_t piece_bytes);

}  // namespace deepinfer::ranks::test
