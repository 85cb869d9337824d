#pragma once
// The optional backends. Each is a separate source chosen by meson, with a
// stub beside it that says it is not available, so no code above mesh/
// needs an #ifdef. Programs normally reach them through launch()
// (dtensor/mesh/launch.h) rather than directly.
#include <chrono>
#include <memory>
#include <span>
#include <vector>

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
/// Ends the whole MPI job with `exit_code` (MPI_Abort; under Open MPI's own
/// mpirun an exit without MPI_Finalize, which mpirun turns into the end of
/// the job with that code), or just this process when MPI is not running.
[[noreturn]] void mpi_abort(int exit_code) noexcept;
/// launch() sets this while the program's body runs. A process that exits
/// meanwhile (exit() from inside it) does not finalise MPI, which would leave
/// its peers waiting in a collective until the deadline and Open MPI's
/// launcher in an undefined state: it prints a line naming its rank and
/// aborts the job with exit code 1.
void mpi_set_program_running(bool running) noexcept;
/// launch() calls this when the program's body has returned on this process:
/// tells every other process of the job, and waits until each has said the
/// same (CommTimeout naming the ranks still running at `timeout`). A process
/// still waiting for this one in a collective or a receive sees the notice
/// and fails at once with PeerFailed naming it, so an early return ends the
/// job promptly rather than at the deadline. Nothing without MPI.
void mpi_finish(std::chrono::milliseconds timeout);

struct NcclOptions {
  /// Longest any call (creation and split included) waits before
  /// CommTimeout. A call that times out aborts the NCCL communicator: every
  /// later call on it throws CommError.
  std::chrono::milliseconds timeout{60'000};
};

/// True when this build has the NCCL communicator.
bool nccl_available();
/// The version of the NCCL library linked (NCCL_VERSION_CODE, 22809 for
/// 2.28.9); 0 in a build without NCCL.
int nccl_version();
/// A communicator over one GPU per process of the MPI job: the device is the
/// process's local rank (from Open MPI's, MPICH's, PMI's or Slurm's
/// environment, else its MPI rank) modulo the devices visible, made the
/// calling thread's device. Rank 0 makes NCCL's unique id and broadcasts it
/// over mpi_world(). Buffers passed to it are device memory on that device,
/// and every call runs on the calling thread's stream and returns when its
/// result is ready. Point to point is a rendezvous on NCCL: send returns
/// once the peer received. UnsupportedError in a build without NCCL or
/// without MPI; DeviceError without a device.
std::unique_ptr<Communicator> nccl_world(const NcclOptions& options = {});
/// One process driving several devices: communicator i is rank i, on
/// devices[i] (distinct devices). Each must be used from its own thread,
/// one that has called dtensor::cuda::set_device(devices[i]); a call also
/// makes that device current on the calling thread if it is not. Each
/// communicator has its own CommStats (each is a rank). UnsupportedError in
/// a build without NCCL.
std::vector<std::unique_ptr<Communicator>> nccl_local_group(std::span<const int> devices,
                                                            const NcclOptions& options = {});

}  // namespace dtensor
