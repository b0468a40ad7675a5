// The shared-memory world: the leader creates the segment and spawns the followers; followers
// join it from their environment.
#pragma once

#include <memory>

#include "ranks/world.h"

namespace deepinfer::ranks {

std::unique_ptr<World> make_shm_leader(const WorldOptions& options);
// `rank`, `world_size` and `shm_name` come from the DEEPINFER_* variables.
std::unique_ptr<World> make_shm_follower(const WorldOptions& options, int rank, int world_size,
                                         const std::string& shm_name);

}  // namespace deepinfer::ranks
