#pragma once
// Shared helpers of the redistribution and DTensor suites: building a rank's
// source shard of a known global tensor under any layout (Partial included),
// and the independent lower bound on what a rank must receive.
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <dtensor/dtensor.h>

namespace dtensor::testing {

/// Integer-valued global tensor (so that sums of addends are exact in every
/// dtype): Philox values scaled to [-512, 512).
Tensor integer_tensor(const Shape& shape, DType dtype, std::uint64_t seed);

/// The values of `full` restricted to box, as a new tensor.
inline Tensor expected_shard(const Tensor& full, const Box& box) { return slice_box(full, box); }

/// The local tensor that rank `coord` holds when the global value `full` has
/// layout `layout` on `mesh_shape`. Partial mesh dims get integer addends
/// (sum), offsets around the value (avg: they cancel), or values not above
/// (max) / not below (min) the value with one rank holding it exactly.
Tensor source_shard(const Tensor& full, const Shape& mesh_shape, const Layout& layout, const Shape& coord,
                    std::uint64_t seed);

/// Elements that rank `coord` must receive to go from `from` to `to` when it
/// keeps what it holds: |needed(to) \ held(from)|. Computed from boxes only,
/// without the planner. `from` must have no Partial.
std::int64_t lower_bound_elements(const Shape& mesh_shape, const Shape& global, const Layout& from, const Layout& to,
                                  const Shape& coord);

/// A random layout of `mesh_nd` placements for a tensor of `nd` dims: Partial
/// (with `op`) with odds partial_odds/8, Shard with odds 4/8, else
/// Replicate; half the time the shards of each dim nest in a random order.
Layout random_layout(std::mt19937_64& rng, int mesh_nd, int nd, ReduceOp op, int partial_odds);

/// Collects failures from rank threads (Boost.Test is not thread-safe); the
/// main thread reports them after run_threads returns.
struct FailureLog {
  std::mutex mutex;
  std::vector<std::string> failures;
  void add(std::string message) {
    std::lock_guard lock(mutex);
    failures.push_back(std::move(message));
  }
};

}  // namespace dtensor::testing
