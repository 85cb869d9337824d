#pragma once
// The optional backends. Each is a separate source chosen by meson, with a
// stub beside it that says it is not available, so no code above mesh/
// needs an #ifdef. Programs normally reach them through launch()
// (dtensor/mesh/launch.h) rather than directly.
#include <chrono>
#include <memory>

#include "dtensor/mesh/communicator.h"

namespace dtensor {

struct MpiOptions {
  /// Longest any call waits for its peers before CommTimeout. A timed-out
  /// communicator is unusable afterwards (MPI cannot cancel a collective).
  std::chrono::milliseconds timeout{60'000};
};

/// True when this build has the MPI communicator.
bool mpi_available();
/// True when this process was started by an MPI launcher (mpirun/mpiexec of
/// Open MPI or MPICH), judged from the environment they set.
bool launched_under_mpi();
/// A communicator over all processes of the MPI job (a private duplicate of
/// MPI_COMM_WORLD), initialising MPI on first use; MPI is finalised at exit.
/// Communicators split from it share its CommStats. UnsupportedError in a
/// build without MPI.
std::unique_ptr<Communicator> mpi_world(MpiOptions options = {});
/// Ends the whole MPI job with `exit_code` (MPI_Abort), or just this process
/// when MPI is not running.
[[noreturn]] void mpi_abort(int exit_code) noexcept;

/// True when this build has the NCCL communicator.
bool nccl_available();

}  // namespace dtensor
