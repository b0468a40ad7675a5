// The ranks of one run: the world group, the step channel from the leader (rank 0) to the
// followers, and the processes behind them.
//
// Every process calls init_world() once, early in main and from the main thread, with the same
// options. What it builds depends on the environment:
//   - under mpirun (OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE set): MPI, one rank per process;
//   - DEEPINFER_LOCAL_RANK set: a follower spawned on this host, which joins the shared-memory
//     segment named by DEEPINFER_SHM_NAME as one of DEEPINFER_WORLD_SIZE ranks;
//   - otherwise, with options.world_size > 1: the leader, which creates the segment and spawns
//     world_size - 1 followers running this executable with the same arguments and environment
//     (DEEPINFER_* settings included) plus the three variables above;
//   - otherwise: a single rank.
//
// The step loop: the leader sends one message per step on channel(); followers block in
// receive() and replay it; the leader ends the run with finish(), which sends the shutdown
// message and waits for the followers to exit. If any rank dies, every blocking call on the
// other ranks throws deepinfer::Error naming it (under MPI, mpirun ends the job instead); a
// follower dies with the leader. Destroying the leader's World without finish() (an error path)
// kills and reaps the followers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ranks/group.h"

namespace deepinfer::ranks {

enum class Backend { kSingle, kShm, kMpi };
const char* backend_name(Backend b);

struct WorldOptions {
  // Ranks wanted. On a leader not under mpirun: how many local ranks to run (0 or 1: a single
  // rank). Under mpirun or on a follower, 0 accepts what the launcher set up, anything else
  // must match it.
  int world_size = 0;
  // Shared-memory backend: bytes each rank exchanges per round of a collective (larger data
  // goes in pieces), and how many groups (the world plus every split) the segment has room for.
  size_t shm_slot_bytes = size_t(256) << 10;
  int shm_max_groups = 8;
  // Bytes per piece of a step message on the shm channel (larger messages go in pieces).
  size_t channel_piece_bytes = size_t(256) << 10;
  // How long the leader waits for spawned followers to join before giving up.
  double join_timeout_s = 60;
  // How long finish() waits for followers to exit after the shutdown message.
  double exit_timeout_s = 30;
};

// Leader to followers, one message per step, as broadcasts from rank 0 on a group of its own,
// so that its messages never interleave with the collectives of a step: a header {kind, bytes},
// then the bytes. The leader's messages arrive at every follower complete and in order.
class StepChannel {
 public:
  explicit StepChannel(std::unique_ptr<Group> group) : group_(std::move(group)) {}
  virtual ~StepChannel() = default;
  // Leader only. May block until every follower is in receive().
  void send(std::span<const uint8_t> msg);
  // Followers only. Blocks for the next message; false when it is the shutdown message.
  bool receive(std::vector<uint8_t>& msg);
  bool shut_down() const { return shut_down_; }
  // This side's end of the run: the leader sends the shutdown message (the last message;
  // receive() returns false for it) if not sent yet; a follower receives it if it has not
  // arrived yet, and throws if a step message arrives instead.
  void finish();

 protected:
  // Broadcasts head[2] from rank 0. A backend may wait for it in its own way.
  virtual void header(uint64_t* head) { group_->broadcast(head, 2 * sizeof(uint64_t), 0); }

  std::unique_ptr<Group> group_;

 private:
  bool shut_down_ = false;
};

// The base class is the single rank, and what every backend shares.
class World {
 public:
  explicit World(Backend backend, std::unique_ptr<Group> group = nullptr,
                 std::unique_ptr<StepChannel> channel = nullptr)
      : backend_(backend), group_(std::move(group)), channel_(std::move(channel)) {}
  virtual ~World() = default;
  Backend backend() const { return backend_; }
  Group& group() { return *group_; }
  StepChannel& channel() { return *channel_; }
  // Leader: sends the shutdown message if not sent yet, waits for every follower to exit and
  // throws if one failed or did not exit in time. Followers: wait for the shutdown message if
  // it has not arrived yet (any other message then is an error). Followers should exit soon
  // after: the leader's finish() waits for that.
  virtual void finish() { channel_->finish(); }
  // The first rank found dead, described ("rank 1 (pid ...) exited with ..."), or empty while
  // all are alive or when the backend cannot tell between collectives. From the thread that
  // runs the collectives.
  virtual std::string dead_rank() { return {}; }

  int rank() { return group().rank(); }
  int size() { return group().size(); }
  bool is_leader() { return rank() == 0; }

 protected:
  Backend backend_;
  std::unique_ptr<Group> group_;
  std::unique_ptr<StepChannel> channel_;
};

std::unique_ptr<World> init_world(const WorldOptions& options = {});

}  // namespace deepinfer::ranks
