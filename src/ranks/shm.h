// The shared-memory segment of the ranks on one host.
//
// Layout (everything 64-byte aligned):
//   Header                  sizes, the join handshake, the group allocator, the pid of every rank
//   GroupArea[max_groups]   per group: a barrier, then slots [world_size][2][slot_bytes]
//   GroupArea               the step channel's group: a barrier, then rank 0's slots
//   [2][piece_bytes]
// Groups never share slots, so collectives in disjoint groups run concurrently, and areas are
// never reused (splits happen at setup), so a fresh area is all zeros.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace deepinfer::ranks::shm {

constexpr int kMaxRanks = 256;

// A futex word and the number of processes sleeping on it. Whoever changes a condition bumps the
// value and wakes sleepers if there are any.
struct alignas(64) Word {
  std::atomic<uint32_t> value;
  std::atomic<uint32_t> sleepers;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct alignas(64) Header {
  uint64_t magic;
  uint32_t version, world_size;
  uint64_t total_bytes, slot_bytes, piece_bytes, max_groups;
  Word joined;   // value: followers that have joined; the leader sleeps on it
  Word started;  // value: 1 once the leader has seen every follower join
  alignas(64) std::atomic<uint32_t> next_group;
  std::atomic<int32_t> first_dead;  // the first rank any rank saw die; -1 while none
  int32_t pids[kMaxRanks];          // by world rank
};

struct alignas(64) GroupArea {
  Word arrived;  // value: ranks at the barrier in this generation
  Word gen;      // value: barrier generation; waiters sleep on it
  // followed by the slots
};

// An mmap of a named segment. The creator removes the name when asked or when destroyed.
class Segment {
 public:
  // Creates and maps the segment and fills in the header; throws if /dev/shm has no room.
  static std::unique_ptr<Segment> create(const std::string& name, int world_size,
                                         uint64_t slot_bytes, uint64_t piece_bytes,
                                         uint64_t max_groups);
  // Maps an existing segment and validates its header against `world_size`.
  static std::unique_ptr<Segment> attach(const std::string& name, int world_size);

  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  Header* header() const { return static_cast<Header*>(base_); }
  // The area of group `index`; index max_groups is the step channel's.
  GroupArea* group(uint64_t index) const;
  // Removes the name (the mapping stays valid); later ranks can no longer attach.
  void unlink_name();

 private:
  Segment(std::string name, bool linked) : name_(std::move(name)), linked_(linked) {}
  // Maps `bytes` of `fd` and closes it; `what` starts the error message.
  void map(int fd, size_t bytes, const std::string& what);

  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool linked_;  // created here, and the name is still there
};

}  // namespace deepinfer::ranks::shm
