// How init_world reaches the shared-memory and MPI backends. Internal to src/ranks.
#pragma once

#include <memory>
#include <string>

#include "ranks/world.h"

namespace deepinfer::ranks {

std::unique_ptr<World> make_shm_leader(const WorldOptions& options);
// `rank`, `world_size` and `shm_name` come from the DEEPINFER_* variables.
std::unique_ptr<World> make_shm_follower(const WorldOptions& options, int rank, int world_size,
                                         const std::string& shm_name);
// Only in builds with MPI.
std::unique_ptr<World> make_mpi_world(const WorldOptions& options);

}  // namespace deepinfer::ranks
