#include "ranks/world.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "ranks/launch.h"
#include "ranks/shm_world.h"

#ifndef DEEPINFER_RANKS_HAVE_MPI  // defined by CMake when MPI was found
#define DEEPINFER_RANKS_HAVE_MPI 0
#endif
#if DEEPINFER_RANKS_HAVE_MPI
#include "ranks/mpi/mpi_world.h"
#endif

namespace deepinfer::ranks {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kSingle:
      return "single";
    case Backend::kShm:
      return "shm";
    case Backend::kMpi:
      return "mpi";
  }
  return "?";
}

bool mpi_available() {
  return DEEPINFER_RANKS_HAVE_MPI != 0;
}

namespace {

// The value of an environment variable that must hold an integer in [lo, hi].
int env_int(const char* name, int lo, int hi) {
  const char* v = std::getenv(name);
  DI_REQUIRE(v && *v, name, " is not set; a spawned rank needs ", kEnvLocalRank, ", ",
             kEnvWorldSize, " and ", kEnvShmName);
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  DI_REQUIRE(errno == 0 && *end == '\0' && x >= lo && x <= hi, name, "=\"", v,
             "\" is not an integer in [", lo, ", ", hi, "]");
  return int(x);
}

class SingleChannel final : public StepChannel {
 public:
  void send(std::span<const uint8_t>) override {}  // no followers to tell
  void send_shutdown() override {}
  bool receive(std::vector<uint8_t>&) override {
    throw Error("the only rank is the leader; it cannot receive on the step channel");
  }
};

class SingleWorld final : public World {
 public:
  Backend backend() const override { return Backend::kSingle; }
  Group& group() override { return *group_; }
  StepChannel& channel() override { return channel_; }
  void finish() override {}
  std::vector<int> local_pids() const override { return {int(getpid())}; }

 private:
  std::unique_ptr<Group> group_ = make_single_group();
  SingleChannel channel_;
};

}  // namespace

void await_shutdown(StepChannel& channel) {
  std::vector<uint8_t> msg;
  DI_REQUIRE(!channel.receive(msg), "the run ended on a follower while the leader still sent a ",
             msg.size(), "-byte step message; the shutdown message was expected");
}

std::unique_ptr<World> init_world(const WorldOptions& options) {
  DI_REQUIRE(options.world_size >= 0, "world size ", options.world_size, " must be >= 0");
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("OMPI_COMM_WORLD_RANK")) {
#if DEEPINFER_RANKS_HAVE_MPI
    return make_mpi_world(options);
#else
    throw Error(
        "running under mpirun (OMPI_COMM_WORLD_SIZE is set) but this build has no MPI backend "
        "(configure with libopenmpi-dev installed)");
#endif
  }
  if (std::getenv(kEnvLocalRank)) {
    const int world_size = env_int(kEnvWorldSize, 2, INT_MAX);
    const int rank = env_int(kEnvLocalRank, 1, world_size - 1);
    const char* name = std::getenv(kEnvShmName);
    DI_REQUIRE(name && name[0] == '/', kEnvShmName,
               " must name a shared-memory segment (\"/...\"), got \"", name ? name : "", "\"");
    DI_REQUIRE(options.world_size == 0 || options.world_size == world_size, kEnvWorldSize, "=",
               world_size, " but this run asks for ", options.world_size, " ranks");
    return make_shm_follower(options, rank, world_size, name);
  }
  if (options.world_size > 1) return make_shm_leader(options);
  return std::make_unique<SingleWorld>();
}

}  // namespace deepinfer::ranks
