// Creating NCCL communicators: one GPU per MPI process (nccl_world), or one
// process driving several GPUs (nccl_local_group). Both create the
// communicators in NCCL's nonblocking mode and poll them against the
// deadline, so that a rank that never joins surfaces as CommTimeout.
// nccl_world reaches MPI only through mpi_world(), so this file builds
// whether or not MPI is there.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/cuda.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/backends.h"
#include "nccl_detail.h"

namespace dtensor {
namespace nccl_detail {

std::string error_text(ncclResult_t rc, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  if (last == nullptr || *last == '\0') return ncclGetErrorString(rc);
  return fmt::format("{} ({})", ncclGetErrorString(rc), last);
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

ncclResult_t wait_ready(ncclComm_t comm, Clock::time_point deadline) {
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return rc;
    if (state != ncclInProgress) return state;
    if (spins >= 64) std::this_thread::yield();
    if ((spins & 63) == 0 && Clock::now() >= deadline) return ncclInProgress;
  }
}

}  // namespace nccl_detail
namespace {

using nccl_detail::Clock;

// Aborts the communicators it holds unless they were handed on.
struct PendingComms {
  std::vector<ncclComm_t> comms;
  ~PendingComms() {
    for (ncclComm_t c : comms)
      if (c != nullptr) ncclCommAbort(c);
  }
};

// Waits for every communicator of `pending` (ranks first_rank, ... of a
// group of `size`) to finish its creation.
void wait_created(PendingComms& pending, std::string_view what, int first_rank, int size,
                  std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (std::size_t i = 0; i < pending.comms.size(); ++i) {
    const int rank = first_rank + static_cast<int>(i);
    const ncclResult_t state = nccl_detail::wait_ready(pending.comms[i], deadline);
    if (state == ncclInProgress)
      throw CommTimeout(fmt::format("[nccl] {}: creating rank {} of {} timed out after {} ms: a peer did not join",
                                    what, rank, size, timeout.count()));
    if (state != ncclSuccess)
      throw CommError(fmt::format("[nccl] {}: creating rank {} of {} failed: {}", what, rank, size,
                                  nccl_detail::error_text(state, pending.comms[i])));
  }
}

void check(ncclResult_t rc, std::string_view what, const char* call) {
  if (rc != ncclSuccess && rc != ncclInProgress)
    throw CommError(fmt::format("[nccl] {}: {} failed: {}", what, call, nccl_detail::error_text(rc, nullptr)));
}

// The process's rank on its node, as the launchers say it.
int local_rank(int world_rank) {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK", "SLURM_LOCALID"}) {
    const char* text = std::getenv(var);
    if (text == nullptr || *text == '\0') continue;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (*end == '\0' && value >= 0) return static_cast<int>(value);
  }
  return world_rank;
}

}  // namespace

bool nccl_available() { return true; }

int nccl_version() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return 0;
  return version;
}

std::unique_ptr<Communicator> nccl_world(const NcclOptions& options) {
  constexpr std::string_view what = "nccl_world";
  std::unique_ptr<Communicator> mpi;
  try {
    mpi = mpi_world(MpiOptions{options.timeout});
  } catch (const UnsupportedError& e) {
    throw UnsupportedError(fmt::format("[nccl] nccl_world sends NCCL's unique id over MPI: {}", e.what()));
  }
  cuda::require(what);
  const int rank = mpi->rank();
  const int device = local_rank(rank) % cuda::device_count();
  cuda::set_device(device);
  ncclUniqueId id{};
  if (rank == 0) check(ncclGetUniqueId(&id), what, "ncclGetUniqueId");
  mpi->broadcast(&id, sizeof id, 0);
  ncclConfig_t config = nccl_detail::nonblocking_config();
  PendingComms pending{std::vector<ncclComm_t>(1, nullptr)};
  check(ncclCommInitRankConfig(&pending.comms[0], mpi->size(), id, rank, &config), what, "ncclCommInitRankConfig");
  wait_created(pending, what, rank, mpi->size(), options.timeout);
  auto comm = nccl_detail::make_communicator(pending.comms[0], device, std::make_shared<CommStats>(), options.timeout);
  pending.comms[0] = nullptr;
  return comm;
}

std::vector<std::unique_ptr<Communicator>> nccl_local_group(std::span<const int> devices, const NcclOptions& options) {
  constexpr std::string_view what = "nccl_local_group";
  cuda::require(what);
  const int count = cuda::device_count();
  if (devices.empty()) throw ValueError("[nccl] nccl_local_group: no devices given; expected at least one");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= count)
      throw ValueError(
          fmt::format("[nccl] nccl_local_group: device {} is not one of the {} visible devices", devices[i], count));
    for (std::size_t j = 0; j < i; ++j)
      if (devices[j] == devices[i])
        throw ValueError(
            fmt::format("[nccl] nccl_local_group: device {} is listed twice; NCCL takes one rank per device",
                        devices[i]));
  }
  const int n = static_cast<int>(devices.size());
  // The group sets each device in turn with the runtime call (nothing in a
  // group may throw); the caller's device is restored the same way.
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess)
    throw DeviceError("[nccl] nccl_local_group: cudaGetDevice failed: no usable device");
  ncclUniqueId id{};
  check(ncclGetUniqueId(&id), what, "ncclGetUniqueId");
  // ncclCommInitAll has no configuration (it would block without a
  // deadline): the same clique from ncclCommInitRankConfig in one group.
  // NCCL may read the configurations until the group ends.
  PendingComms pending{std::vector<ncclComm_t>(devices.size(), nullptr)};
  std::vector<ncclConfig_t> configs(devices.size(), nccl_detail::nonblocking_config());
  ncclResult_t first = ncclGroupStart();
  const char* failed = "ncclGroupStart";
  if (first == ncclSuccess) {
    for (int i = 0; i < n && first == ncclSuccess; ++i) {
      ncclConfig_t& config = configs[static_cast<std::size_t>(i)];
      if (cudaSetDevice(devices[static_cast<std::size_t>(i)]) != cudaSuccess) {
        first = ncclUnhandledCudaError;
        failed = "cudaSetDevice";
        break;
      }
      const ncclResult_t rc = ncclCommInitRankConfig(&pending.comms[static_cast<std::size_t>(i)], n, id, i, &config);
      if (rc != ncclSuccess && rc != ncclInProgress) {
        first = rc;
        failed = "ncclCommInitRankConfig";
      }
    }
    const ncclResult_t rc = ncclGroupEnd();
    if (first == ncclSuccess && rc != ncclSuccess && rc != ncclInProgress) {
      first = rc;
      failed = "ncclGroupEnd";
    }
  }
  if (cudaSetDevice(previous) != cudaSuccess && first == ncclSuccess) {
    first = ncclUnhandledCudaError;
    failed = "cudaSetDevice";
  }
  check(first, what, failed);
  wait_created(pending, what, 0, n, options.timeout);
  std::vector<std::unique_ptr<Communicator>> out;
  out.reserve(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    out.push_back(
        nccl_detail::make_communicator(pending.comms[i], devices[i], std::make_shared<CommStats>(), options.timeout));
    pending.comms[i] = nullptr;
  }
  return out;
}

}  // namespace dtensor
