// The MPI world: one rank per process under mpirun, on any number of hosts. Compiled only when
// CMake finds MPI; mpi.h stays inside this folder.
#pragma once

#include <memory>

#include "ranks/world.h"

namespace deepinfer::ranks {

std::unique_ptr<World> make_mpi_world(const WorldOptions& options);

}  // namespace deepinfer::ranks
