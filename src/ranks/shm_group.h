// Groups of processes on one host over the shared-memory segment (see shm_segment.h).
//
// A collective runs in rounds. In a round every member writes up to one slot of data into its
// own slot, everyone meets at the group's barrier, and then everyone reads what it needs from
// the others' slots. Each member has two slots and rounds alternate between them: a rank may
// write round k+1 as soon as it leaves barrier k, because every rank arrived there only after it
// had finished reading round k-1 from the same slots. So one barrier per round suffices, and
// nothing has to be waited for at the end of a collective.
//
// Sums read all members' slots and add them in rank order on every rank, so the bits agree.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ranks/group.h"
#include "ranks/liveness.h"
#include "ranks/shm_segment.h"

namespace deepinfer::ranks {

// What every group of this process shares: the mapping and the watch on the other ranks.
struct ShmState {
  shm::Segment segment;
  Liveness alive;
  int world_rank = 0;
  int world_size = 0;
  std::vector<int> pids;  // [world_size], by world rank
};

class ShmGroup final : public Group {
 public:
  // Member `rank` of `size` in group area `area`.
  ShmGroup(std::shared_ptr<ShmState> state, uint64_t area, int rank, int size);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void broadcast(void* data, size_t n_bytes, int root) override;
  using Group::all_reduce;
  void all_reduce(float* data, size_t n) override;
  void all_gather(const void* in, size_t n_bytes_each, void* out) override;
  void reduce_scatter(const float* in, size_t n_per_rank, float* out) override;
  void barrier() override;
  std::vector<std::vector<uint8_t>> all_gather_v(std::span<const uint8_t> mine) override;
  std::unique_ptr<Group> split(int color, int key) override;

 private:
  uint8_t* slot(int member) const { return state_->segment.slot(area_, member, int(round_ & 1)); }
  // Ends the writing half of a round: after it, every member's slot of this round is readable.
  void meet() { barrier(); }
  // Ends the reading half; the next round writes the other slots.
  void next_round() { ++round_; }

  std::shared_ptr<ShmState> state_;
  shm::GroupArea* area_ptr_;
  uint64_t area_;
  int rank_, size_;
  size_t slot_bytes_;
  uint64_t round_ = 0;
  std::vector<const float*> parts_;  // [size_], scratch for sums
};

}  // namespace deepinfer::ranks
