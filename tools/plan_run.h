#pragma once
// dtensor-plan --run: executes a plan on the threads backend with random
// data and checks every rank's result.
#include <cstdint>
#include <string>
#include <vector>

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
};

/// Runs `plan` with one thread per mesh rank. Each rank builds its source
/// shard of Tensor::rand(plan.global_shape, plan.dtype, seed) directly (a
/// Partial source splits every value into parts whose reduction is the
/// value), executes the plan, and the results are checked against the same
/// tensor under plan.to (for a Partial target: the reduction over the
/// partial ranks). Throws what run_threads throws when a rank fails.
RunResult run_plan(const Plan& plan, std::uint64_t seed);

}  // namespace dtensor::cli
