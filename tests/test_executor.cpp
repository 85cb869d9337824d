// The executor on thread ranks: values against slices of the full tensor,
// bytes against the plan, and its refusals.
#include <boost/test/unit_test.hpp>

#include <map>
#include <mutex>
#include <random>

#include <fmt/ranges.h>

#include "dtensor/core/error.h"
#include "dtensor/core/placement.h"
#include "dtensor/core/tensor.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/threads.h"
#include "dtensor/redistribute/executor.h"
#include "dtensor/redistribute/planner.h"
#include "planner_checks.h"
#include "support.h"

using namespace dtensor;
using planner_test::make_plan;

// ---------------------------------------------------------------------------
// Executor on thread ranks.

namespace {

// Values of a full integer-valued tensor (exact in every dtype) at `box`.
Tensor int_values(const Shape& shape, DType dtype, std::uint64_t seed, const Box& box) {
  Tensor full = Tensor::rand(shape, DType::Int64, seed);
  Tensor out = Tensor::empty(box.size, dtype);
  Tensor part = slice_box(full, box);
  std::vector<std::int64_t> idx(box.size.size());
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    idx = unravel_index(i, box.size);
    out.set(idx, part.get(idx));
  }
  return out;
}

// The mixed-radix index of this rank among the ranks differing only on the
// Partial mesh dims of `layout`, and their number.
std::pair<std::int64_t, std::int64_t> partial_index(const Layout& layout, const Shape& mesh, const Shape& coord) {
  std::int64_t k = 0, g = 1;
  for (int m = 0; m < layout.mesh_ndim(); ++m)
    if (is_partial(layout[m])) {
      k = k * mesh[m] + coord[m];
      g *= mesh[m];
    }
  return {k, g};
}

// The source shard of rank `coord`: Partial(sum) as random addends, max/min
// as values not above/below with one rank exact, avg as copies.
Tensor source_shard(const Shape& mesh, const Shape& shape, DType dtype, const Layout& from, const Shape& coord,
                    std::uint64_t seed) {
  Box box = local_box(mesh, shape, from, coord);
  Tensor t = int_values(shape, dtype, seed, box);
  auto [k, g] = partial_index(from, mesh, coord);
  if (g == 1) return t;
  ReduceOp op = ReduceOp::Sum;
  for (const Placement& p : from.placements())
    if (is_partial(p)) op = std::get<Partial>(p).op;
  std::vector<std::int64_t> idx;
  auto noise = [&](std::int64_t j) { return int_values(shape, dtype, seed * 7919 + 17 * j + 1, box); };
  if (op == ReduceOp::Sum) {
    if (k < g - 1) return noise(k);
    for (std::int64_t j = 0; j < g - 1; ++j) {
      Tensor n = noise(j);
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        idx = unravel_index(i, box.size);
        t.set(idx, t.get(idx) - n.get(idx));
      }
    }
  } else if (op == ReduceOp::Max || op == ReduceOp::Min) {
    if (k != static_cast<std::int64_t>(seed % g)) {
      Tensor n = noise(k);
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        idx = unravel_index(i, box.size);
        double d = std::abs(n.get(idx)) + 1;
        t.set(idx, t.get(idx) + (op == ReduceOp::Max ? -d : d));
      }
    }
  }
  return t;
}

struct ExecCase {
  Shape mesh;
  Shape shape;
  DType dtype;
  Layout from, to;
  std::uint64_t seed;
  CostModel cost;
  std::string describe() const {
    return fmt::format("seed {} mesh {} shape [{}] {} {} -> {}", seed, fmt::join(mesh, "x"), fmt::join(shape, ","),
                       dtype, from, to);
  }
};

// Runs one case on thread ranks; returns failure messages (empty if fine).
std::vector<std::string> run_case(const ExecCase& c) {
  const int world = static_cast<int>(numel(c.mesh));
  Plan plan = plan_redistribute(PlanRequest{c.mesh, c.shape, c.dtype, c.from, c.to, c.cost});
  std::vector<Tensor> outs(world);
  std::vector<std::int64_t> got_bytes(world, -1);
  run_threads(world, [&](Communicator& comm) {
    DeviceMesh mesh(comm, c.mesh);
    Tensor local = source_shard(c.mesh, c.shape, c.dtype, plan.from, mesh.coordinate(), c.seed);
    const std::uint64_t before = comm.stats().recv_bytes;
    Tensor out = execute_plan(plan, mesh, local);
    got_bytes[mesh.rank()] = static_cast<std::int64_t>(comm.stats().recv_bytes - before);
    outs[mesh.rank()] = out;
  });
  std::vector<std::string> failures;
  const std::string what = c.describe();
  for (int r = 0; r < world; ++r) {
    Shape coord = unravel_index(r, c.mesh);
    Box box = local_box(c.mesh, c.shape, plan.to, coord);
    if (got_bytes[r] != plan.recv_bytes[r])
      failures.push_back(fmt::format("{}: rank {} received {} bytes, plan says {}\n{}", what, r, got_bytes[r],
                                     plan.recv_bytes[r], plan));
    if (outs[r].shape() != box.size) {
      failures.push_back(fmt::format("{}: rank {} shape [{}], expected [{}]", what, r, fmt::join(outs[r].shape(), ","),
                                     fmt::join(box.size, ",")));
      continue;
    }
    // Reduce over the target's Partial group (the ranks differing on its
    // Partial dims) and compare with the full tensor's values.
    ReduceOp op = ReduceOp::Sum;
    std::vector<int> group{r};
    for (int m = 0; m < plan.to.mesh_ndim(); ++m)
      if (is_partial(plan.to[m])) {
        op = std::get<Partial>(plan.to[m]).op;
        std::vector<int> next;
        for (int q : group)
          for (std::int64_t v = 0; v < c.mesh[m]; ++v) {
            Shape qc = unravel_index(q, c.mesh);
            qc[m] = v;
            next.push_back(static_cast<int>(ravel_index(qc, c.mesh)));
          }
        group = next;
      }
    Tensor expect = int_values(c.shape, c.dtype, c.seed, box);
    std::vector<std::int64_t> idx;
    for (std::int64_t i = 0; i < expect.numel(); ++i) {
      idx = unravel_index(i, box.size);
      double acc = outs[group[0]].get(idx);
      for (std::size_t j = 1; j < group.size(); ++j) {
        double v = outs[group[j]].get(idx);
        if (op == ReduceOp::Sum || op == ReduceOp::Avg) acc += v;
        if (op == ReduceOp::Max) acc = std::max(acc, v);
        if (op == ReduceOp::Min) acc = std::min(acc, v);
      }
      if (op == ReduceOp::Avg) acc /= static_cast<double>(group.size());
      double want = expect.get(idx);
      if (!testing::close(acc, want, 1e-3 * (1 + std::abs(want)))) {
        failures.push_back(fmt::format("{}: rank {} element {} is {}, expected {}\n{}", what, r, i, acc, want, plan));
        break;
      }
    }
  }
  return failures;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(executor)

BOOST_AUTO_TEST_CASE(known_cases_on_two_by_four) {
  struct K {
    const char* from;
    const char* to;
  };
  for (K k : {K{"S(0),S(1)", "R,R"}, K{"P(sum),S(1)", "S(1),S(0)"}, K{"P(sum),P(sum)", "R,R"}, K{"R,R", "P(sum),S(1)"},
              K{"S(0),S(0)", "S(1),S(1)"}, K{"S(0)[1],S(0)[0]", "S(0),S(0)"}, K{"P(max),P(max)", "S(0),R"},
              K{"P(avg),S(0)", "R,P(avg)"}}) {
    ExecCase c{{2, 4}, {9, 6}, DType::Float32, Layout::parse(k.from), Layout::parse(k.to), 11, {}};
    testing::check_no_failures(run_case(c));
  }
}

BOOST_AUTO_TEST_CASE(random_cases) {
  const std::vector<Shape> meshes = {{1},    {2},    {3},    {4},    {6},       {8},      {2, 2},
                                     {2, 3}, {1, 4}, {2, 4}, {4, 2}, {2, 2, 2}, {2, 1, 3}};
  const std::int64_t sizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 13};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};
  std::mt19937_64 rng(99);
  int failures = 0, cases = 0;
  const int n_cases = static_cast<int>(testing::scaled_cases(300, 26));
  for (int i = 0; i < n_cases && failures < 10; ++i) {
    ExecCase c;
    c.mesh = meshes[static_cast<std::size_t>(i) % meshes.size()];
    int nd = rng() % 16 == 0 ? 0 : 1 + static_cast<int>(rng() % 3);
    for (int d = 0; d < nd; ++d) c.shape.push_back(sizes[rng() % std::size(sizes)]);
    c.dtype = std::array{DType::Float32, DType::Float64, DType::Int64}[rng() % 3];
    int mnd = static_cast<int>(c.mesh.size());
    c.from = testing::random_layout(rng, mnd, nd, ops[rng() % 5], 2);
    c.to = testing::random_layout(rng, mnd, nd, ops[rng() % 5], 1);
    c.seed = 1000 + static_cast<std::uint64_t>(i);
    if (rng() % 2) c.cost.links = {inter_node_link()};
    for (const std::string& f : run_case(c)) {
      BOOST_ERROR(f);
      ++failures;
    }
    ++cases;
  }
  BOOST_TEST_MESSAGE(fmt::format("executor: {} random cases", cases));
  BOOST_TEST(failures == 0);
}

BOOST_AUTO_TEST_CASE(wrong_local_shape_is_a_layout_error) {
  Plan plan = make_plan({2}, {5, 3}, "S(0)", "R");
  std::mutex mu;
  std::vector<std::string> messages;
  run_threads(2, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2});
    try {
      execute_plan(plan, mesh, Tensor::zeros({5, 3}));
    } catch (const LayoutError& e) {
      std::lock_guard lock(mu);
      messages.push_back(e.what());
    }
  });
  BOOST_TEST_REQUIRE(messages.size() == 2u);
  for (const std::string& m : messages) {
    BOOST_TEST(m.find("[redistribute] local shard of shape [5,3]") == 0u, m);
    BOOST_TEST(m.find("gives it shape [") != std::string::npos, m);
  }
}

BOOST_AUTO_TEST_CASE(a_noop_issues_no_collective) {
  Plan plan = make_plan({2, 2}, {4, 4}, "S(0),R", "S(0),R");
  BOOST_TEST(plan.steps.empty());
  run_threads(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2, 2});
    CommStats before = comm.stats();
    Tensor local = Tensor::ones({2, 4});
    Tensor out = execute_plan(plan, mesh, local);
    if ((comm.stats() - before).data_collectives() != 0) throw std::runtime_error("a no-op communicated");
    if (out.shape() != local.shape()) throw std::runtime_error("shape changed");
  });
}

BOOST_AUTO_TEST_SUITE_END()
