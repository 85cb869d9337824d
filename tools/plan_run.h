#pragma once
// dtensor-plan --run: executes a plan on the ranks launch() started (thread
// ranks, or the processes of an MPI job) with random data and checks every
// rank's result.
#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/mesh/communicator.h"
#include "dtensor/redistribute/plan.h"

namespace dtensor::cli {

struct RunResult {
  bool verified = false;
  /// The busiest rank's received bytes over execute_plan only.
  std::int64_t measured_recv_bytes = 0;
  /// Received bytes per rank over execute_plan.
  std::vector<std::int64_t> recv_bytes;
  /// What did not match, a line each (a few at most).
  std::vector<std::string> problems;
  /// Whether results were compared within a tolerance (after sums or means
  /// of floats) rather than exactly.
  bool tolerant = false;
  /// The backend the plan ran on ("threads" or "mpi").
  std::string backend;
};

/// Collective over `world` (one rank per mesh rank): each rank builds its
/// source shard of Tensor::rand(plan.global_shape, plan.dtype, seed) directly
/// (a Partial source splits every value into parts whose reduction is the
/// value) and executes the plan; rank 0 collects the results and checks them
/// against the same tensor under plan.to (for a Partial target: the
/// reduction over the partial ranks). `verified` and the byte counts are
/// known on every rank; `problems` on rank 0 only. ValueError if the mesh's
/// size differs from the world's.
RunResult run_plan(const Plan& plan, std::uint64_t seed, Communicator& world);

}  // namespace dtensor::cli
