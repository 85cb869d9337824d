// Chosen by meson when MPI is not found or -Dmpi=disabled.
#include <cstdlib>

#include "dtensor/core/error.h"
#include "dtensor/mesh/backends.h"

namespace dtensor {

bool mpi_available() { return false; }

std::unique_ptr<Communicator> mpi_world(MpiOptions) {
  throw UnsupportedError(
      "[mpi] this build has no MPI communicator: install an MPI (e.g. libopenmpi-dev) and rebuild with "
      "-Dmpi=enabled, or run on thread ranks (--ranks N)");
}

void mpi_abort(int exit_code) noexcept { std::_Exit(exit_code); }

void mpi_set_program_running(bool) noexcept {}

void mpi_finish(std::chrono::milliseconds) {}

}  // namespace dtensor
