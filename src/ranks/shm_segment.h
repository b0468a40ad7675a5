// The shared-memory segment of the ranks on one host and the waits on it.
//
// Layout (offsets in the header; everything 64-byte aligned):
//   Header       sizes, the join handshake, the group allocator, the pid of every rank
//   GroupArea[max_groups]   per group: a barrier, then slots [world_size][2][slot_bytes]
//   ChannelArea  the step channel: counters, then two pieces of piece_bytes each
// Groups never share slots, so collectives in disjoint groups run concurrently, and areas are
// never reused (splits happen at setup), so a fresh area is all zeros.
//
// Waits spin briefly and then sleep on a futex (shared, not private: the word lives in memory
// mapped by several processes), waking every few milliseconds to check that the other ranks are
// alive. Whoever changes a condition bumps the word's value and wakes sleepers if there are any.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ranks/liveness.h"

namespace deepinfer::ranks::shm {

constexpr int kMaxRanks = 256;
constexpr uint64_t kMagic = 0x3174736964504944ull;  // "DIPdist1"
constexpr uint32_t kVersion = 1;

// A futex word and the number of processes sleeping on it.
struct alignas(64) Word {
  std::atomic<uint32_t> value;
  std::atomic<uint32_t> sleepers;
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct alignas(64) Header {
  uint64_t magic;
  uint32_t version;
  uint32_t world_size;
  uint64_t total_bytes;
  uint64_t slot_bytes;
  uint64_t piece_bytes;
  uint64_t max_groups;
  uint64_t groups_offset;
  uint64_t group_stride;
  uint64_t channel_offset;
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

struct PieceHeader {
  uint64_t msg_bytes;  // the whole message
  uint64_t offset;     // of this piece within it
  uint32_t kind;       // ChannelKind
  uint32_t piece_bytes;
};

enum ChannelKind : uint32_t { kData = 1, kShutdown = 2 };

struct alignas(64) ChannelArea {
  Word published;  // value: pieces published by the leader; followers sleep on it
  Word acked;      // value: bumped by followers after each piece; the leader sleeps on it
  struct alignas(64) Consumed {
    std::atomic<uint32_t> pieces;
  } consumed[kMaxRanks];  // by rank: pieces this follower has read
  PieceHeader piece[2];
  // followed (64-byte aligned) by the piece data [2][piece_bytes]
};

// Bytes of the segment and the offsets of its parts, from the sizes.
struct Layout {
  uint64_t groups_offset, group_stride, channel_offset, channel_data_offset, total_bytes;
};
Layout compute_layout(int world_size, uint64_t slot_bytes, uint64_t piece_bytes,
                      uint64_t max_groups);

// An mmap of a named segment. The creator removes the name when asked or when destroyed.
class Segment {
 public:
  // Creates and maps the segment and fills in the header; throws if /dev/shm has no room.
  static Segment create(const std::string& name, int world_size, uint64_t slot_bytes,
                        uint64_t piece_bytes, uint64_t max_groups);
  // Maps an existing segment and validates its header against `world_size`.
  static Segment attach(const std::string& name, int world_size);

  Segment() = default;
  Segment(Segment&& o) noexcept { *this = std::move(o); }
  Segment& operator=(Segment&& o) noexcept;
  ~Segment();

  Header* header() const { return static_cast<Header*>(base_); }
  GroupArea* group(uint64_t index) const;
  uint8_t* slot(uint64_t group_index, int member, int buffer) const;  // [slot_bytes]
  ChannelArea* channel() const;
  uint8_t* piece_data(int which) const;  // [piece_bytes]
  // Removes the name (the mapping stays valid); later ranks can no longer attach.
  void unlink_name();
  const std::string& name() const { return name_; }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool owner_ = false;
  bool linked_ = false;
};

// Blocks until `ready()` holds; `w.value` changes whenever it may have become true. Every few
// milliseconds of sleep, `alive` is polled: if a rank has died and the condition still does not
// hold, throws its error.
template <typename Ready>
void wait_until(Word& w, Ready&& ready, Liveness& alive);

// After making a condition true: bump the word and wake its sleepers.
void notify(Word& w);

// --- implementation details of wait_until ---
void spin_pause(int iteration);
void futex_sleep(Word& w, uint32_t seen);  // returns after a wake, a change or a few ms
uint64_t now_us();

template <typename Ready>
void wait_until(Word& w, Ready&& ready, Liveness& alive) {
  for (int i = 0; i < 256; ++i) {
    if (ready()) return;
    spin_pause(i);
  }
  uint64_t next_check = 0;
  for (;;) {
    const uint32_t seen = w.value.load(std::memory_order_seq_cst);
    if (ready()) return;
    const uint64_t now = now_us();
    if (now >= next_check) {
      next_check = now + 5000;
      if (!alive.poll().empty()) {
        // A rank that exits right after the condition became true (a follower after the
        // shutdown message) is no failure of this wait.
        if (ready()) return;
        alive.check();
      }
    }
    futex_sleep(w, seen);
  }
}

}  // namespace deepinfer::ranks::shm
