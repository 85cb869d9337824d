// The process-wide side of the MPI backend:
//  - MPI is initialised on first use and finalised at exit, except when the
//    process exits while launch() runs the program's body (exit() called
//    from inside it): finalising then would leave the peers waiting in a
//    collective until the deadline and Open MPI's mpirun in an undefined
//    state (it crashed or deadlocked in some runs), so the job is ended;
//  - the end-of-program notices (mpi_runtime.h, mpi_finish);
//  - mpi_abort.
#include "mpi_runtime.h"

#include <sched.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/core/error.h"
#include "dtensor/mesh/backends.h"

namespace dtensor {
namespace mpi_detail {
namespace {

using Clock = std::chrono::steady_clock;

// Set by launch() while the program's body runs (mpi_set_program_running).
std::atomic<bool>& program_running() {
  static std::atomic<bool> running{false};
  return running;
}

MPI_Comm& notices_comm() {
  static MPI_Comm comm = MPI_COMM_NULL;
  return comm;
}

// Process-wide MPI state: who initialised MPI (and so finalises it).
struct MpiRuntime {
  std::mutex mu;
  bool we_initialized = false;

  static MpiRuntime& get() {
    static MpiRuntime runtime;
    return runtime;
  }

  void ensure_initialized() {
    std::lock_guard lock(mu);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) throw CommError("[mpi] MPI has already been finalized in this process");
    if (!initialized) init();
    if (notices_comm() == MPI_COMM_NULL) {  // the first call, on every process alike
      MPI_Comm_dup(MPI_COMM_WORLD, &notices_comm());
      MPI_Comm_set_errhandler(notices_comm(), MPI_ERRORS_RETURN);
    }
  }

  void init() {
    // One thread per process calls MPI (the rank's), but launch()'s
    // failure path may abort from wherever the exception surfaced.
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    if (rc != MPI_SUCCESS) throw CommError(fmt::format("[mpi] MPI_Init_thread failed: {}", mpi_error_text(rc)));
    we_initialized = true;
    std::atexit([] {
      int fin = 0;
      MPI_Finalized(&fin);
      if (fin) return;
      if (program_running().exchange(false)) {
        int rank = -1, size = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        std::fflush(stdout);
        std::fprintf(stderr,
                     "dtensor: rank %d of %d exited in the middle of the program (exit() before its body "
                     "returned); aborting the MPI job\n",
                     rank, size);
        std::fflush(stderr);
        mpi_abort(1);
      }
      MPI_Finalize();
    });
  }
};

}  // namespace

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, static_cast<std::size_t>(len));
}

void ensure_initialized() { MpiRuntime::get().ensure_initialized(); }

MPI_Comm notices() { return notices_comm(); }

}  // namespace mpi_detail

using namespace mpi_detail;

void mpi_set_program_running(bool running) noexcept { program_running().store(running); }

void mpi_finish(std::chrono::milliseconds timeout) {
  if (notices_comm() == MPI_COMM_NULL) return;
  int rank = 0, size = 1;
  MPI_Comm_rank(notices_comm(), &rank);
  MPI_Comm_size(notices_comm(), &size);
  if (size == 1) return;
  const auto n = static_cast<std::size_t>(size);
  int token = 0;
  std::vector<int> got(n);
  std::vector<MPI_Request> sends(n, MPI_REQUEST_NULL), recvs(n, MPI_REQUEST_NULL);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    const auto i = static_cast<std::size_t>(p);
    MPI_Isend(&token, 1, MPI_INT, p, kFinishTag, notices_comm(), &sends[i]);
    MPI_Irecv(&got[i], 1, MPI_INT, p, kFinishTag, notices_comm(), &recvs[i]);
  }
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int done = 0;
    MPI_Testall(size, recvs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) break;
    if (Clock::now() >= deadline) {
      std::vector<int> missing;
      for (int p = 0; p < size; ++p) {
        int flag = 1;
        MPI_Test(&recvs[static_cast<std::size_t>(p)], &flag, MPI_STATUS_IGNORE);
        if (!flag) {
          missing.push_back(p);
          MPI_Cancel(&recvs[static_cast<std::size_t>(p)]);  // `got` goes away with this frame
          MPI_Request_free(&recvs[static_cast<std::size_t>(p)]);
        }
      }
      throw CommTimeout(
          fmt::format("[mpi] the end of the program on rank {} of {} timed out after {} ms waiting "
                      "for rank(s) {} to finish theirs",
                      rank, size, timeout.count(), fmt::join(missing, ", ")));
    }
    sched_yield();  // other jobs' processes may need the core
  }
  MPI_Waitall(size, sends.data(), MPI_STATUSES_IGNORE);
}

void mpi_abort(int exit_code) noexcept {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  program_running().store(false);  // in case MPI_Abort runs the atexit hooks
  if (initialized && !finalized) {
    // Under Open MPI's own mpirun (ORTE), a process that exits non-zero
    // without MPI_Finalize ends the job, as MPI_Abort does, and mpirun
    // reports it with its code. MPI_Abort there sends a help message to
    // mpirun over PMIx, and Open MPI 4.1's mpirun crashed receiving it
    // (SIGSEGV in pmix_server_log, the exit code lost) in about 1 of 20 jobs
    // whose ranks abort together after a fault (tests/test_faults_mpi.py).
    if (std::getenv("OMPI_MCA_orte_hnp_uri") != nullptr) {
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(exit_code);
    }
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
  std::_Exit(exit_code);
}

}  // namespace dtensor
