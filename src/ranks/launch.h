// Launching a world: how init_world reaches the shared-memory and MPI backends, starting and
// watching the follower ranks on this host, and cleaning up after the leader. Internal to ranks.
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

// Environment variables of a spawned follower.
inline constexpr const char* kEnvLocalRank = "DEEPINFER_LOCAL_RANK";
inline constexpr const char* kEnvWorldSize = "DEEPINFER_WORLD_SIZE";
inline constexpr const char* kEnvShmName = "DEEPINFER_SHM_NAME";

// Removes /dev/shm/deepinfer-<pid>-* older than ten minutes left by leaders that no longer
// exist (killed before they could remove their own).
void remove_stale_segments();

// The name of a new segment for this process: "/deepinfer-<pid>-<n>".
std::string new_segment_name();

// "status 3" or "status SIGKILL (killed by signal 9)", from a waitpid status.
std::string describe_exit_status(int status);

}  // namespace deepinfer::ranks
