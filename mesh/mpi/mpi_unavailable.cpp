// Stub chosen by meson while the MPI backend is not built (issue 4).
#include "dtensor/core/error.h"
#include "dtensor/mesh/backends.h"

namespace dtensor {

bool mpi_available() { return false; }

std::unique_ptr<Communicator> mpi_world() {
  throw UnsupportedError("[mpi] this build has no MPI communicator: use run_threads, or rebuild with -Dmpi=enabled once the MPI backend exists");
}

}  // namespace dtensor
