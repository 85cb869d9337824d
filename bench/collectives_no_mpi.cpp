// Chosen by bench/meson.build when the build has no MPI: the threads mode of
// bench/collectives still runs; under mpirun this says why it cannot.
#include <fmt/format.h>

#include "collectives_mpi.h"

namespace dtensor::bench {

int run_mpi_collectives(const MpiCollectivesOptions&) {
  fmt::print(stderr,
             "[collectives] started under an MPI launcher, but this build has no MPI: install an MPI (e.g. "
             "libopenmpi-dev) and rebuild with -Dmpi=enabled, or run without mpirun for the threads backend\n");
  return 2;
}

}  // namespace dtensor::bench
