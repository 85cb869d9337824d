#pragma once
// The MPI mode of bench/collectives: the same program under mpirun compares
// the dtensor MPI communicator with the bare MPI calls on the same buffers.
// collectives_mpi.cpp implements it where the build has MPI,
// collectives_no_mpi.cpp says it is not available otherwise.
#include <cstddef>

namespace dtensor::bench {

struct MpiCollectivesOptions {
  std::size_t max_mib = 64;
  int reps = 0;       // 0: by size
  bool best = false;  // the fastest repetition instead of the median
  /// Also time the bare nonblocking call completed by MPI_Wait, and by a
  /// copy of the backend's polling loop, to tell an algorithm gap from a
  /// polling gap.
  bool variants = false;
};

/// Runs the table on this process's MPI job and returns main()'s exit code.
int run_mpi_collectives(const MpiCollectivesOptions& options);

}  // namespace dtensor::bench
