// What the shared-memory and MPI backends share, and how init_world reaches them. Internal to
// src/ranks.
#pragma once

#include <memory>
#include <string>

#include "ranks/world.h"

namespace deepinfer::ranks {

// The step channel as broadcasts from rank 0 on a group of its own, so that its messages never
// interleave with the collectives of a step: a header {kind, bytes}, then the bytes.
class GroupChannel : public StepChannel {
 public:
  explicit GroupChannel(std::unique_ptr<Group> group) : group_(std::move(group)) {}
  void send(std::span<const uint8_t> msg) override;
  void send_shutdown() override;
  bool receive(std::vector<uint8_t>& msg) override;
  bool shut_down() const { return shut_down_; }

 protected:
  // Broadcasts head[2] from rank 0. A backend may wait for it in its own way.
  virtual void header(uint64_t* head) { group_->broadcast(head, 2 * sizeof(uint64_t), 0); }

  std::unique_ptr<Group> group_;

 private:
  void require_leader() const;
  bool shut_down_ = false;
};

std::unique_ptr<World> make_shm_leader(const WorldOptions& options);
// `rank`, `world_size` and `shm_name` come from the DEEPINFER_* variables.
std::unique_ptr<World> make_shm_follower(const WorldOptions& options, int rank, int world_size,
                                         const std::string& shm_name);
// Only in builds with MPI.
std::unique_ptr<World> make_mpi_world(const WorldOptions& options);

}  // namespace deepinfer::ranks
