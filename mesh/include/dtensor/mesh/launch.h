#pragma once
// One entry point for programs: the same main() runs on thread ranks in one
// process or as the processes of an MPI job.
//
//   int main(int argc, char** argv) {
//     return dtensor::launch(argc, argv, [](dtensor::Communicator& world) {
//       dtensor::DeviceMesh mesh(world, {2, world.size() / 2});
//       ...
//     });
//   }
//
//   build/examples/demo --ranks 8     # 8 thread ranks in this process
//   mpirun -np 8 build/examples/demo  # 8 processes over MPI
//   build/examples/demo --ranks 4 --device cuda
//                                     # 4 simulated GPU ranks on one GPU
//   mpirun -np 8 build/examples/demo --device cuda
//                                     # 8 processes, one GPU each, over NCCL
#include <chrono>
#include <functional>
#include <string_view>

#include "dtensor/mesh/communicator.h"

namespace dtensor {

struct LaunchOptions {
  /// Thread ranks when neither --ranks nor DTENSOR_RANKS says.
  int default_ranks = 1;
  /// Longest any collective waits for its peers (DTENSOR_TIMEOUT_MS overrides).
  std::chrono::milliseconds timeout{60'000};
};

/// Which backend launch() picks for this process: "mpi" when started by an
/// MPI launcher or DTENSOR_BACKEND=mpi, otherwise "threads".
std::string_view launch_backend();

/// Runs fn(world) on every rank and returns main()'s exit code.
///  - Under mpirun (or DTENSOR_BACKEND=mpi): this process is one rank of the
///    MPI world. `--ranks N`, if given, must equal the job's size.
///  - Otherwise: N thread ranks, N from `--ranks N` / `--ranks=N`, else
///    $DTENSOR_RANKS, else options.default_ranks.
/// `--device cpu|cuda` (or $DTENSOR_DEVICE) says where the ranks keep their
/// shards: with cuda, thread ranks share one GPU (simulated multi-rank mode)
/// and MPI processes talk over NCCL, one GPU each.
/// `--link 10us,5GB/s` models a slower link on every rank's communicators
/// (Communicator::model_link): each call takes at least that latency plus
/// its bytes over that bandwidth.
/// `--ranks`, `--device` and `--link` are removed from argv (argc adjusted) so that the
/// program's own parser never sees them. Bad values print a message and return 2.
/// When a rank throws, "dtensor: rank R of N failed: <what>" goes to stderr;
/// on threads the other ranks stop with PeerFailed and launch returns 1; under
/// MPI the job is aborted with exit code 1, since MPI offers no other way to
/// release peers blocked in a collective.
/// On threads, a rank still running user code a deadline after a failure
/// (see run_threads) is named with what it was last doing, and launch ends
/// the process with exit code 1 instead of returning: that rank's thread
/// could not be joined and may still use what fn refers to, so stdout and
/// stderr are flushed and the process leaves with _Exit, running no static
/// destructors or atexit handlers.
/// Timeouts (options.timeout, $DTENSOR_TIMEOUT_MS) must lie in
/// [kMinTimeout, kMaxTimeout], rank counts in [1, kMaxThreadRanks] on
/// threads; else a message naming the value and the range, and 2.
/// Under MPI a process also ends the job (exit code 1, naming its rank) when
/// it calls exit() inside fn, and when fn returns while a peer still waits
/// for it in a collective or a receive (that peer fails at once naming it).
/// With $DTENSOR_TRACE=FILE, every rank's ops and collectives during fn are
/// recorded and rank 0 writes them to FILE as one Chrome trace (see
/// dtensor/api/trace.h; open it in https://ui.perfetto.dev).
/// After fn returns, each process waits for the others to return theirs, up
/// to the timeout: ranks that finish further apart than that fail.
int launch(int& argc, char** argv, const std::function<void(Communicator& world)>& fn, LaunchOptions options = {});

}  // namespace dtensor
