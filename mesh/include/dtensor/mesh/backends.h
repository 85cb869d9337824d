#pragma once
// The optional backends. Each is a separate source chosen by meson, with a
// stub beside it that says it is not available, so no code above mesh/
// needs an #ifdef. This build ships the stubs; the MPI communicator arrives
// with issue 4 and the NCCL one with issue 5.
#include <memory>

#include "dtensor/mesh/communicator.h"

namespace dtensor {

/// True when this build has the MPI communicator.
bool mpi_available();
/// The MPI world of this process; UnsupportedError in a build without MPI.
std::unique_ptr<Communicator> mpi_world();

/// True when this build has the NCCL communicator.
bool nccl_available();

}  // namespace dtensor
