// An int64 Avg reduction moves the pairs (x / n, x % n), twice the bytes of
// the same call in f64: the byte counters say so, the planner prices it so
// (a plan's bytes are the counted bytes), values stay exact, and integer
// P(avg) layouts always plan, without dividing in stages. On thread ranks,
// or as an MPI job (the test_bad_inputs jobs).
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "checks.h"
#include "dtensor/core/reduction_bytes.h"
#include "dtensor/dtensor.h"
#include "dtensor/mesh/threads.h"
#include "support.h"

using namespace dtensor;
using dtensor::testing::FailureLog;

namespace average_bytes {

std::string repeat(const std::string& p, std::size_t k) {
  std::string out;
  for (std::size_t i = 0; i < k; ++i) out += (i ? "," : "") + p;
  return out;
}

struct Move {
  std::string from, to;
};

// Moves that reduce every Partial dim, on a 1-D or 2-D mesh.
std::vector<Move> moves(std::size_t k) {
  std::vector<Move> out = {{repeat("P(avg)", k), repeat("R", k)}, {repeat("P(avg)", k), repeat("S(0)", k)}};
  if (k == 2) {
    out.push_back({"P(avg),P(avg)", "S(0),S(1)"});
    out.push_back({"P(avg),R", "R,R"});
    out.push_back({"P(avg),R", "S(0),R"});
    out.push_back({"R,P(avg)", "R,S(1)"});
  }
  return out;
}

std::string with_op(std::string layout, const std::string& op) {
  for (std::size_t at = layout.find("avg"); at != std::string::npos; at = layout.find("avg", at + op.size()))
    layout.replace(at, 3, op);
  return layout;
}

// Step kinds and mesh dims: two plans that take the same steps.
std::vector<std::pair<StepKind, std::vector<int>>> shape_of(const Plan& p) {
  std::vector<std::pair<StepKind, std::vector<int>>> out;
  for (const PlanStep& s : p.steps) out.emplace_back(s.kind, s.mesh_dims);
  return out;
}

}  // namespace average_bytes
using namespace average_bytes;

BOOST_AUTO_TEST_SUITE(integer_average_bytes)

// The rule itself: twice the elements for an int64 Avg over two or more
// ranks, the plain count otherwise.
BOOST_AUTO_TEST_CASE(the_wire_rule_per_case) {
  BOOST_TEST(reduces_as_average_pairs(DType::Int64, ReduceOp::Avg, 2));
  BOOST_TEST(!reduces_as_average_pairs(DType::Int64, ReduceOp::Avg, 1));
  BOOST_TEST(!reduces_as_average_pairs(DType::Int64, ReduceOp::Sum, 4));
  BOOST_TEST(!reduces_as_average_pairs(DType::Float64, ReduceOp::Avg, 4));
  for (std::int64_t n : {2, 3, 4, 6})
    for (std::int64_t count : {0, 1, 5, 12, 60}) {
      for (std::int64_t i = 0; i < n; ++i)
        BOOST_TEST(all_reduce_recv_bytes(count, n, i, DType::Int64, ReduceOp::Avg) ==
                       all_reduce_recv_count(2 * count, n, i) * 8,
                   "count " << count << " n " << n << " index " << i);
      BOOST_TEST(reduce_scatter_recv_bytes(count, n, DType::Int64, ReduceOp::Avg) ==
                 2 * reduce_scatter_recv_bytes(count, n, DType::Float64, ReduceOp::Avg));
    }
  BOOST_TEST(all_reduce_recv_bytes(7, 1, 0, DType::Int64, ReduceOp::Avg) == 0);
  BOOST_TEST(reduce_scatter_recv_bytes(7, 1, DType::Int64, ReduceOp::Avg) == 0);
}

// P(avg) -> R and P(avg) -> S on 1-D and 2-D meshes: every rank counts
// exactly the bytes the plan predicts for it; where the shape divides
// evenly and the f64 plan takes the same steps, exactly twice the f64 and
// the int64 Sum bytes; and the values come back exact at 2^62 scale.
BOOST_AUTO_TEST_CASE(counted_bytes_are_the_pairs_and_the_plan_predicts_them) {
  const std::uint64_t seed = testing::seeded(0xA7B2);
  for (const Shape& mesh_shape : testing::backend_meshes({{4}, {3}, {2, 2}, {2, 3}})) {
    FailureLog log;
    std::vector<int> doubled_checks(1, 0);
    testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
      DeviceMesh mesh(comm, mesh_shape);
      const auto me = static_cast<std::size_t>(ravel_index(mesh.coordinate(), mesh_shape));
      int doubled = 0;
      for (const Shape& shape : {Shape{12, 5}, Shape{7, 3}, Shape{1, 1}}) {
        const bool even = shape[0] == 12;
        std::mt19937_64 rng(seed + static_cast<std::uint64_t>(shape[0]));
        std::vector<std::int64_t> values(static_cast<std::size_t>(numel(shape)));
        for (auto& v : values) v = static_cast<std::int64_t>(rng() >> 1);  // up to 2^63 - 1: any sum overflows
        const Tensor full = Tensor::from_vector(values, shape);
        for (const Move& mv : moves(mesh_shape.size())) {
          const std::string what = fmt::format("seed {} mesh {} shape [{}] {} -> {}", seed, fmt::join(mesh_shape, "x"),
                                               fmt::join(shape, ","), mv.from, mv.to);
          const Layout to = Layout::parse(mv.to);
          // R -> P(avg) keeps every rank's value, so the mean is the value.
          const DTensor avg =
              distribute_tensor(full, mesh, Layout::replicated(mesh.ndim())).redistribute(Layout::parse(mv.from));
          const CommCounter counter(mesh);
          const DTensor moved = avg.redistribute(to);
          const std::uint64_t counted = counter.counts().recv_bytes;
          const Plan& plan = avg.plan_to(to);
          if (counted != static_cast<std::uint64_t>(plan.recv_bytes[me]))
            log.add(fmt::format("rank {} {}: counted {} B, the plan predicts {} B", comm.rank(), what, counted,
                                plan.recv_bytes[me]));
          const Tensor back = moved.full_tensor();
          if (!equal(back, full)) log.add(fmt::format("rank {} {}: values differ after the move", comm.rank(), what));

          // The same move in f64 Avg and int64 Sum.
          const DTensor f64 = distribute_tensor(full.to(DType::Float64), mesh, Layout::replicated(mesh.ndim()))
                                  .redistribute(Layout::parse(mv.from));
          const CommCounter f64_counter(mesh);
          (void)f64.redistribute(to);
          const std::uint64_t f64_bytes = f64_counter.counts().recv_bytes;
          const DTensor sum = distribute_tensor(full, mesh, Layout::parse(with_op(mv.from, "sum")));
          const CommCounter sum_counter(mesh);
          (void)sum.redistribute(to);
          const std::uint64_t sum_bytes = sum_counter.counts().recv_bytes;
          if (!even || shape_of(f64.plan_to(to)) != shape_of(plan) || shape_of(sum.plan_to(to)) != shape_of(plan))
            continue;
          ++doubled;
          if (counted != 2 * f64_bytes || counted != 2 * sum_bytes)
            log.add(fmt::format("rank {} {}: int64 avg counted {} B, f64 avg {} B, int64 sum {} B: expected twice",
                                comm.rank(), what, counted, f64_bytes, sum_bytes));
        }
      }
      if (testing::reports_results(comm)) doubled_checks[0] = doubled;
    });
    testing::check_no_failures(log.failures);
    // The twice-the-bytes rule was checked on every move of the even shape.
    BOOST_TEST(doubled_checks[0] == static_cast<int>(moves(mesh_shape.size()).size()),
               fmt::format("seed {} mesh {}", seed, fmt::join(mesh_shape, "x")));
  }
}

// Reducing only some P(avg) mesh dims of an int64 tensor would divide in
// stages: trunc(trunc(a / 2) + trunc(b / 2)) / 2 is not trunc(sum / 4)
// ((1, 2), (1, 0) gives 0, not 1). Every route to another layout keeps the
// one exact mean.
// Two-dim meshes of this backend: a 1-D MPI job (2 or 3 processes) has no
// two Partial dims, and the case is skipped there, counted as skipped.
std::vector<Shape> two_dim_meshes() {
  std::vector<Shape> out;
  for (const Shape& mesh_shape : testing::backend_meshes({{2, 2}, {2, 3}}))
    if (mesh_shape.size() == 2) out.push_back(mesh_shape);
  return out;
}

BOOST_AUTO_TEST_CASE(partial_avg_dims_are_never_divided_in_stages,
                     *boost::unit_test::precondition([](boost::unit_test::test_unit_id) {
                       boost::test_tools::assertion_result has(!two_dim_meshes().empty());
                       has.message() << "this job's size gives no two-dim mesh";
                       return has;
                     })) {
  const std::uint64_t seed = testing::seeded(0xA7B3);
  for (const Shape& mesh_shape : two_dim_meshes()) {
    FailureLog log;
    testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
      DeviceMesh mesh(comm, mesh_shape);
      const std::int64_t n = numel(mesh_shape);
      constexpr std::int64_t kCols = 64;
      // The values every rank holds, drawn from one seed: small integers of
      // both signs, so that the truncations of a staged mean differ.
      std::mt19937_64 rng(seed);
      std::vector<std::vector<std::int64_t>> held(static_cast<std::size_t>(n));
      for (auto& row : held)
        for (std::int64_t c = 0; c < kCols; ++c) row.push_back(static_cast<std::int64_t>(rng() % 11) - 5);
      held[0][0] = 1, held[1][0] = 2, held[2][0] = 1, held[3][0] = 0;  // the example above (row-major ranks)
      std::vector<std::int64_t> want(kCols);
      for (std::int64_t c = 0; c < kCols; ++c) {
        std::int64_t s = 0;
        for (const auto& row : held) s += row[static_cast<std::size_t>(c)];
        want[static_cast<std::size_t>(c)] = s / n;
      }
      const auto me = static_cast<std::size_t>(ravel_index(mesh.coordinate(), mesh_shape));
      const Tensor mine = Tensor::from_vector(held[me], {kCols});
      const Tensor expected = Tensor::from_vector(want, {kCols});
      const DTensor t = DTensor::from_local(mine, mesh, Layout::parse("P(avg),P(avg)"));
      for (const char* via : {"P(avg),R", "R,P(avg)", "P(avg),S(0)", "S(0),P(avg)", "P(avg),P(avg)"}) {
        const Tensor got = t.redistribute(Layout::parse(via)).full_tensor();
        if (!equal(got, expected))
          log.add(fmt::format("rank {}: seed {} mesh {} P(avg),P(avg) -> {} -> R,R gives {}, expected {}", comm.rank(),
                              seed, fmt::join(mesh_shape, "x"), via, got, expected));
      }
    });
    testing::check_no_failures(log.failures);
  }
}

// Integer P(avg) kept on one mesh dim while the shards move on the others
// (2x2x2; before, every plan inside the planner's memory bound needed a
// reduction it did not allow): the planner finds a plan, and on thread
// ranks it runs exactly.
BOOST_AUTO_TEST_CASE(kept_partial_avg_with_moving_shards_plans) {
  const Shape mesh_shape{2, 2, 2}, shape{4, 6};
  const std::vector<Move> cases = {{"P(avg),S(0),S(1)", "P(avg),S(1),S(1)"},
                                   {"P(avg),S(1),S(0)", "P(avg),S(0),S(0)"},
                                   {"P(avg),S(1),S(0)", "P(avg),S(0),S(1)"},
                                   {"P(avg),S(1),S(1)", "P(avg),S(0),S(0)"},
                                   {"P(avg),S(1),S(1)", "P(avg),S(0),S(1)"}};
  for (const Move& mv : cases) {
    const PlanRequest req{mesh_shape, shape, DType::Int64, Layout::parse(mv.from), Layout::parse(mv.to), CostModel{}};
    BOOST_TEST_CONTEXT(mv.from << " -> " << mv.to) {
      BOOST_CHECK_NO_THROW((void)plan_redistribute(req));
      BOOST_CHECK_NO_THROW((void)plan_redistribute(req, false));
    }
  }
  if (testing::test_backend() != "threads") return;
  FailureLog log;
  const std::uint64_t seed = testing::seeded(0xA7B4);
  testing::run_ranks(8, [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape);
    std::mt19937_64 rng(seed);
    std::vector<std::int64_t> values(static_cast<std::size_t>(numel(shape)));
    for (auto& v : values) v = static_cast<std::int64_t>(rng() >> 1);
    const Tensor full = Tensor::from_vector(values, shape);
    for (const Move& mv : cases) {
      const DTensor t = distribute_tensor(full, mesh, Layout::replicated(3)).redistribute(Layout::parse(mv.from));
      const CommCounter counter(mesh);
      const DTensor moved = t.redistribute(Layout::parse(mv.to));
      const auto me = static_cast<std::size_t>(ravel_index(mesh.coordinate(), mesh_shape));
      if (counter.counts().recv_bytes != static_cast<std::uint64_t>(t.plan_to(Layout::parse(mv.to)).recv_bytes[me]))
        log.add(fmt::format("rank {} seed {} {} -> {}: counted bytes differ from the plan", comm.rank(), seed, mv.from,
                            mv.to));
      if (!equal(moved.full_tensor(), full))
        log.add(fmt::format("rank {} seed {} {} -> {}: values differ", comm.rank(), seed, mv.from, mv.to));
    }
  });
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_SUITE_END()
