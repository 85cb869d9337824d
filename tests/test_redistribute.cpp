// The property suite: 2,000 seeded random redistributions over meshes of 1 to
// 8 ranks in 1 to 3 dims, all dtypes, uneven and zero sizes, Partial sources
// and targets and any nesting order. For each case every rank checks its new
// shard against the unsharded tensor, the bytes its communicator counted
// against the plan's prediction, and (on the main thread) the busiest rank's
// bytes against an independent lower bound.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <random>

#include "support.h"

using namespace dtensor;
using dtensor::testing::FailureLog;

namespace property_suite {

constexpr int kCasesPerMesh = 125;
const std::vector<Shape> kMeshes = {{1},    {2},    {3},    {4},    {6},       {8},       {2, 2},    {2, 3},
                                    {3, 2}, {1, 4}, {2, 4}, {4, 2}, {2, 2, 2}, {1, 2, 3}, {2, 1, 3}, {2, 3, 1}};

enum class CostKind { Default, NoLatency, SlowOuter };

struct Case {
  std::uint64_t seed;
  Shape shape;
  DType dtype;
  Layout from, to;
  CostKind cost_kind;
  CostModel cost;

  std::string describe(const Shape& mesh) const {
    return fmt::format("seed {} mesh {} shape [{}] {} {} -> {} cost {}", seed, fmt::join(mesh, "x"),
                       fmt::join(shape, ","), dtype, from, to, static_cast<int>(cost_kind));
  }
};

Case random_case(std::mt19937_64& rng, const Shape& mesh, std::uint64_t seed) {
  static const std::int64_t kSizes[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16};
  Case c;
  c.seed = seed;
  int nd = rng() % 20 == 0 ? 0 : 1 + static_cast<int>(rng() % 3);
  for (int d = 0; d < nd; ++d) c.shape.push_back(kSizes[rng() % std::size(kSizes)]);
  c.dtype = std::array{DType::Float32, DType::Float64, DType::Int64}[rng() % 3];
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};
  int mesh_nd = static_cast<int>(mesh.size());
  c.from = testing::random_layout(rng, mesh_nd, nd, ops[rng() % 5], 2);
  c.to = testing::random_layout(rng, mesh_nd, nd, ops[rng() % 5], 1);
  c.cost_kind = static_cast<CostKind>(rng() % 3);
  if (c.cost_kind == CostKind::NoLatency) {
    c.cost.default_link.hop_latency_s = 0;
    c.cost.base_latency_s = 0;
    c.cost.local_copy_Bps = 1e30;
  } else if (c.cost_kind == CostKind::SlowOuter) {
    c.cost.links = {inter_node_link()};
  }
  return c;
}

// The op of a layout's Partial mesh dims (one layout holds one kind).
ReduceOp partial_op(const Layout& l) {
  for (const Placement& p : l.placements())
    if (const auto* q = std::get_if<Partial>(&p)) return q->op;
  return ReduceOp::Sum;
}

// Upper bound for Partial sources, built without the planner: one
// bandwidth-optimal all_reduce over all Partial mesh dims (as the
// communicator counts it), then the exact exchange into the target. Summed
// per step over the busiest rank, as a plan with no latency is priced.
std::int64_t partial_source_bound(const Shape& mesh, const Case& c) {
  std::int64_t group = 1;
  std::vector<Placement> reduced = c.from.placements();
  for (int m = 0; m < c.from.mesh_ndim(); ++m)
    if (is_partial(reduced[m])) {
      group *= mesh[m];
      reduced[m] = Replicate{};
    }
  Layout mid(reduced, [&] {
    std::vector<std::pair<std::int64_t, std::vector<int>>> order;
    for (std::size_t d = 0; d < c.shape.size(); ++d)
      if (c.from.split_order(d).size() > 1) order.emplace_back(d, c.from.split_order(d));
    return order;
  }());
  const std::int64_t is = static_cast<std::int64_t>(itemsize(c.dtype));
  std::int64_t worst_reduce = 0, worst_exchange = 0;
  for (std::int64_t r = 0; r < numel(mesh); ++r) {
    Shape coord = unravel_index(r, mesh);
    std::int64_t count = local_box(mesh, c.shape, c.from, coord).numel();
    // An int64 Avg reduces the pairs (x / n, x % n): twice the elements.
    if (c.dtype == DType::Int64 && group > 1 && c.from.has_partial() && partial_op(c.from) == ReduceOp::Avg) count *= 2;
    // The rank's index inside the flattened Partial group (row-major).
    std::int64_t index = 0;
    for (int m = 0; m < c.from.mesh_ndim(); ++m)
      if (is_partial(c.from[m])) index = index * mesh[m] + coord[m];
    std::int64_t seg = even_split(count, group, index).size;
    std::int64_t reduce = group > 1 ? (group - 1) * seg + (count - seg) : 0;
    worst_reduce = std::max(worst_reduce, reduce * is);
    worst_exchange = std::max(worst_exchange, testing::lower_bound_elements(mesh, c.shape, mid, c.to, coord) * is);
  }
  return worst_reduce + worst_exchange;
}

}  // namespace property_suite
using namespace property_suite;

BOOST_AUTO_TEST_SUITE(property)

// Under MPI only the meshes of the job's size run (one rank per process);
// the same code runs every mesh on thread ranks.
BOOST_DATA_TEST_CASE(random_redistributions, boost::unit_test::data::make(testing::runnable_meshes(kMeshes)),
                     mesh_index) {
  const Shape mesh_shape = kMeshes[mesh_index];
  const std::uint64_t base_seed = testing::seeded(0xD7E50000ull + mesh_index);
  BOOST_TEST_MESSAGE("mesh " << fmt::format("{}", fmt::join(mesh_shape, "x")) << " base seed " << base_seed);
  std::mt19937_64 rng(base_seed);
  std::vector<Case> cases;
  const int n_cases = static_cast<int>(testing::scaled_cases(kCasesPerMesh, 8));
  for (int i = 0; i < n_cases; ++i) cases.push_back(random_case(rng, mesh_shape, base_seed * 1000 + i));

  const int world = static_cast<int>(numel(mesh_shape));
  FailureLog log;
  // measured[case][rank], predicted[case][rank]
  std::vector<std::vector<std::int64_t>> measured(cases.size(), std::vector<std::int64_t>(world, -1));
  std::vector<std::vector<std::int64_t>> predicted(cases.size(), std::vector<std::int64_t>(world, -1));
  try {
    testing::run_ranks(
        world,
        [&](Communicator& comm) {
          DeviceMesh mesh(comm, mesh_shape);
          // This rank's counts per case; gathered at the end so that the
          // main thread (of every process, under MPI) sees all ranks.
          std::vector<std::int64_t> mine(2 * cases.size(), -1);
          for (std::size_t i = 0; i < cases.size(); ++i) {
            const Case& c = cases[i];
            Tensor full = testing::integer_tensor(c.shape, c.dtype, c.seed);
            Tensor local = testing::source_shard(full, mesh_shape, c.from, mesh.coordinate(), c.seed);
            DTensor src = DTensor::from_local(local, mesh, c.from, c.shape).with_cost_model(c.cost);
            const Plan& plan = src.plan_to(c.to);
            if (comm.rank() == 0) {
              // Memory: no intermediate layout holds more than the larger of
              // the source and target shards on any rank.
              auto largest = [&](const Layout& l) {
                std::int64_t most = 0;
                for (std::int64_t r = 0; r < world; ++r)
                  most = std::max(most, local_box(mesh_shape, c.shape, l, unravel_index(r, mesh_shape)).numel());
                return most;
              };
              const std::int64_t limit = std::max(largest(plan.from), largest(plan.to));
              for (const PlanStep& step : plan.steps)
                if (largest(step.to) > limit)
                  log.add(fmt::format("{}: step {} -> {} holds {} elements on one rank, more than {}",
                                      c.describe(mesh_shape), step.from, step.to, largest(step.to), limit));
            }
            CommStats before = comm.stats();
            DTensor dst = src.redistribute(c.to);
            CommStats moved = comm.stats() - before;
            mine[2 * i] = static_cast<std::int64_t>(moved.recv_bytes);
            mine[2 * i + 1] = plan.recv_bytes.at(comm.rank());
            Box box = local_box(mesh_shape, c.shape, plan.to, mesh.coordinate());
            if (dst.to_local().shape() != box.size)
              log.add(fmt::format("{}: rank {} holds a {} shard, expected {}", c.describe(mesh_shape), comm.rank(),
                                  fmt::join(dst.to_local().shape(), "x"), fmt::join(box.size, "x")));
            else if (!c.to.has_partial() && !equal(dst.to_local(), slice_box(full, box)))
              log.add(fmt::format("{}: rank {} shard differs from the chunk of the full tensor", c.describe(mesh_shape),
                                  comm.rank()));
            if (c.to.has_partial() || i % 8 == 0) {
              // Reduce back and compare the whole tensor (a collective: every rank does it).
              Tensor back = dst.full_tensor();
              if (!equal(back, full))
                log.add(fmt::format("{}: rank {} full tensor differs (max |diff| {})", c.describe(mesh_shape),
                                    comm.rank(), max_abs_diff(back, full)));
            }
          }
          std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(world));
          comm.all_gather(mine.data(), all.data(), mine.size() * sizeof(std::int64_t));
          if (testing::reports_results(comm))
            for (std::size_t r = 0; r < static_cast<std::size_t>(world); ++r)
              for (std::size_t i = 0; i < cases.size(); ++i) {
                measured[i][r] = all[r * mine.size() + 2 * i];
                predicted[i][r] = all[r * mine.size() + 2 * i + 1];
              }
        },
        std::chrono::milliseconds(30'000));
  } catch (const std::exception& e) {
    BOOST_ERROR("mesh " << fmt::format("{}", fmt::join(mesh_shape, "x")) << ": a rank failed: " << e.what());
    return;
  }
  testing::check_no_failures(log.failures);

  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    BOOST_TEST_CONTEXT(c.describe(mesh_shape)) {
      BOOST_TEST(measured[i] == predicted[i], "bytes counted by the communicator differ from the plan's prediction");
      const std::int64_t busiest = *std::max_element(measured[i].begin(), measured[i].end());
      if (!c.from.has_partial()) {
        std::int64_t bound = 0;
        for (std::int64_t r = 0; r < world; ++r)
          bound = std::max(bound, testing::lower_bound_elements(mesh_shape, c.shape,
                                                                validate_layout(c.from, mesh_shape, c.shape),
                                                                validate_layout(c.to, mesh_shape, c.shape),
                                                                unravel_index(r, mesh_shape)));
        BOOST_TEST(busiest == bound * static_cast<std::int64_t>(itemsize(c.dtype)),
                   "the busiest rank must receive exactly the lower bound");
      } else if (c.cost_kind == CostKind::NoLatency) {
        BOOST_TEST(busiest <= partial_source_bound(mesh_shape, c),
                   "a Partial source must cost no more than all_reduce + exact exchange");
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
