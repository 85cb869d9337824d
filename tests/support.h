#pragma once
#include <boost/test/unit_test.hpp>

#include "checks.h"
// Shared helpers of the redistribution and DTensor suites: building a rank's
// source shard of a known global tensor under any layout (Partial included),
// and the independent lower bound on what a rank must receive.
#include <cstdint>
#include <functional>
#include <string_view>
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

/// How many of `full` random cases a property loop runs here: all of them,
/// unless DTENSOR_TEST_SCALE (a number in (0, 1]) asks for that fraction
/// (at least `at_least`). ./dev sanitize sets it: under ASan and TSan the
/// same code paths run 3-10x slower, and a fraction of the seeded cases
/// still reaches every path the sanitizers check; the plain build runs them
/// all. A bad value is a ValueError naming it.
std::size_t scaled_cases(std::size_t full, std::size_t at_least = 1);
/// A property loop's seed: `fixed`, the same on every run (the default), or
/// fixed + DTENSOR_TEST_SEED where that variable is set (an unsigned
/// integer), to explore cases no run has tried. The suites print the seed
/// they ran with in their failures (and DTENSOR_TEST_SEED in their log), so
/// any failure can be rerun.
std::uint64_t seeded(std::uint64_t fixed);
/// Whether DTENSOR_TEST_SCALE is below 1 (property loops may then also skip
/// their few cases that take seconds on their own).
bool reduced_scale();

/// The backend the suites run on: "mpi" when the test binary was started
/// by mpirun (one rank per process), else "threads".
std::string_view test_backend();
/// Whether a mesh of `ranks` ranks can run here: any under threads; under
/// MPI only the job's own size (each process is one rank).
bool can_run(std::int64_t ranks);
/// A Boost precondition: can_run(ranks), naming the reason when not.
struct ranks_available {
  std::int64_t ranks;
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result ok(can_run(ranks));
    if (!ok) ok.message() << "needs a world of " << ranks << " ranks (an MPI job of another size)";
    return ok;
  }
};
/// The indices of `meshes` that can run here (a dataset for
/// BOOST_DATA_TEST_CASE).
std::vector<std::size_t> runnable_meshes(const std::vector<Shape>& meshes);
/// The meshes a suite sweeps here: `thread_meshes` under threads; under an
/// MPI job of N processes, those of them with N ranks, or else [N] and (N
/// even, N >= 4) [2, N/2], so that every job size exercises the suite.
std::vector<Shape> backend_meshes(const std::vector<Shape>& thread_meshes);
/// Runs fn(world) on `ranks` ranks of the test backend: thread ranks of this
/// process, or this process as one rank of the MPI job (then ranks must equal
/// the job's size). On threads a failing rank surfaces as RankFailed; under
/// MPI a rank that throws prints the test case and its error and aborts the
/// job, since its peers could not otherwise be released.
void run_ranks(int ranks, const std::function<void(Communicator& world)>& fn,
               std::chrono::milliseconds timeout = std::chrono::milliseconds(60'000));
/// Whether this rank should write results meant for the main thread into
/// shared variables: under threads only rank 0 (the others would race),
/// under MPI every process (each has its own copy).
bool reports_results(const Communicator& world);

/// Reports each failure collected on the ranks as a Boost.Test error, and
/// asserts that there were none (so a passing case counts its check).
void check_no_failures(const std::vector<std::string>& failures);

/// A Boost.Test precondition for cases that need a CUDA device: false (the
/// case is skipped, and counted as skipped) in a build without CUDA or on a
/// machine without a GPU, with the reason as its message.
boost::test_tools::assertion_result needs_gpu(boost::unit_test::test_unit_id);

/// Collects failures from rank threads (Boost.Test is not thread-safe); the
/// main thread reports them after run_threads returns.
struct FailureLog {
  std::mutex mutex;
  std::vector<std::string> failures;
  void add(std::string message) {
    std::lock_guard lock(mutex);
    failures.push_back(std::move(message));
  }
  /// On the main thread: each failure as a Boost.Test error after `context`,
  /// then one assertion that there were none, so that a case whose ranks all
  /// passed still counts its check (a case with no assertion fails the count).
  void report(std::string_view context = "") const {
    for (const auto& f : failures) BOOST_ERROR(context << ": " << f);
    BOOST_TEST(failures.empty(), context << ": " << failures.size() << " check(s) failed on the ranks");
  }
};

}  // namespace dtensor::testing
