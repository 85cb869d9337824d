#pragma once
// Internal to the MPI backend: the process-wide MPI state (initialisation and
// what happens at exit, the end-of-program notices), kept apart from the
// communicator (mpi_communicator.cpp). See mpi_runtime.cpp.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <string>

namespace dtensor::mpi_detail {

std::string mpi_error_text(int code);

/// Initialises MPI (once per process) and makes the notices communicator;
/// collective over MPI_COMM_WORLD the first time. CommError on failure.
void ensure_initialized();

/// End-of-program notices (dtensor::mpi_finish): a duplicate of
/// MPI_COMM_WORLD on which a process whose program body returned tells every
/// other so. A rank still waiting for it in a collective sees the notice
/// (MPI_Iprobe with kFinishTag; it is received only at the end) and fails at
/// once instead of at the deadline. MPI_COMM_NULL before ensure_initialized().
MPI_Comm notices();
inline constexpr int kFinishTag = 2;
/// How long a missing peer's notice must stand before the peer counts as
/// gone: its signature, on another communicator, may still be in flight.
inline constexpr auto kNoticeGrace = std::chrono::milliseconds(100);

}  // namespace dtensor::mpi_detail
