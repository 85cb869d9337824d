#pragma once
// What the NCCL communicator (nccl_communicator.cpp) and its bootstraps
// (nccl_bootstrap.cpp) share. Compiled only in a build with NCCL.
#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>

#include "dtensor/mesh/communicator.h"

namespace dtensor::nccl_detail {

using Clock = std::chrono::steady_clock;

/// "unhandled system error (last error: ...)" for a failed NCCL call.
std::string error_text(ncclResult_t rc, ncclComm_t comm);

/// A configuration in NCCL's nonblocking mode: no NCCL call blocks the
/// host, so that creating, splitting and using a communicator all keep our
/// deadlines (a call may return ncclInProgress; ncclCommGetAsyncError then
/// says when it is done).
ncclConfig_t nonblocking_config();

/// Polls ncclCommGetAsyncError until `comm` leaves ncclInProgress or the
/// deadline passes; returns its state (ncclInProgress when the deadline
/// passed first).
ncclResult_t wait_ready(ncclComm_t comm, Clock::time_point deadline);

/// A communicator over the ready `comm`, whose device is `device`; it owns
/// `comm` from now on.
std::unique_ptr<Communicator> make_communicator(ncclComm_t comm, int device, std::shared_ptr<CommStats> stats,
                                                std::chrono::milliseconds timeout);

}  // namespace dtensor::nccl_detail
