// Starting the follower ranks on this host, and cleaning up after the leader.
#pragma once

#include <string>
#include <vector>

namespace deepinfer::ranks {

// Environment variables of a spawned follower.
inline constexpr const char* kEnvLocalRank = "DEEPINFER_LOCAL_RANK";
inline constexpr const char* kEnvWorldSize = "DEEPINFER_WORLD_SIZE";
inline constexpr const char* kEnvShmName = "DEEPINFER_SHM_NAME";

// Starts ranks 1..world_size-1 as copies of this executable (/proc/self/exe) with this process's
// arguments and environment, plus the three variables above. Each follower gets SIGKILL when
// the leader dies, and gives up at once if the leader died before that was armed. Returns the
// pids by rank, pids[0] being this process. On failure, kills what it started and throws.
std::vector<int> spawn_followers(int world_size, const std::string& shm_name);

// While armed, SIGINT or SIGTERM removes the segment name before the signal takes its previous
// course. Only one name is armed at a time; disarming restores the previous handlers.
void arm_signal_cleanup(const std::string& shm_name);
void disarm_signal_cleanup();

// Removes /dev/shm/deepinfer-<pid>-* older than ten minutes left by leaders that no longer
// exist (killed before they could remove their own).
void remove_stale_segments();

// The name of a new segment for this process: "/deepinfer-<pid>-<n>".
std::string new_segment_name();

}  // namespace deepinfer::ranks
