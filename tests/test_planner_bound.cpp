// The search's lower bound (A*): plans exactly as good as the plain search's
// on seeded random requests up to 4-D meshes with Partial layouts, a bound
// never above the true cost from any state the search reached, and fewer
// states expanded where Partial mesh dims make the search large.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <random>

#include <fmt/ranges.h>

#include "dtensor/redistribute/detail/compact_layout.h"
#include "dtensor/core/error.h"
#include "dtensor/redistribute/planner.h"
#include "dtensor/redistribute/detail/planner_search.h"
#include "support.h"

using namespace dtensor;

namespace {

struct Request {
  std::uint64_t seed;
  PlanRequest req;
  std::string text() const {
    return fmt::format("seed {} mesh {} shape [{}] {} {} -> {}", seed, fmt::join(req.mesh_shape, "x"),
                       fmt::join(req.global_shape, ","), req.dtype, req.from, req.to);
  }
};

// Meshes up to 4-D, tensors small (time decides for a Partial source) or
// large (bytes decide), Partial in most sources and some targets, every
// third request on a cost model with a slow outer mesh dim.
Request random_request(std::mt19937_64& rng, std::uint64_t seed) {
  static const std::vector<Shape> meshes = {{2, 2},    {2, 3},       {4, 2},       {2, 2, 2},    {2, 1, 3},
                                            {2, 2, 3}, {2, 2, 2, 2}, {3, 2, 1, 2}, {2, 3, 2, 2}, {4, 4, 4, 4}};
  static const std::int64_t sizes[] = {0, 1, 3, 5, 8, 13, 16, 64, 100, 1000};
  const Shape mesh = meshes[rng() % meshes.size()];
  const int nd = 1 + static_cast<int>(rng() % 3);
  Shape shape;
  for (int d = 0; d < nd; ++d) shape.push_back(sizes[rng() % std::size(sizes)]);
  const DType dtype = std::array{DType::Float32, DType::Float64, DType::Int64}[rng() % 3];
  const ReduceOp op = std::array{ReduceOp::Sum, ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}[rng() % 4];
  const int M = static_cast<int>(mesh.size());
  const Layout from = testing::random_layout(rng, M, nd, op, rng() % 4 == 0 ? 0 : 4);
  const Layout to = testing::random_layout(rng, M, nd, op, rng() % 3 == 0 ? 2 : 0);
  CostModel cost;
  if (rng() % 3 == 0) cost.links = {inter_node_link()};
  return Request{seed, PlanRequest{mesh, shape, dtype, from, to, cost}};
}

struct Searched {
  planner::Cost cost;
  std::size_t expanded = 0;
  bool bytes_first = true;
};

// One search of the request, the bound on or off, through the planner's own
// problem (the objective it would choose).
Searched search(const PlanRequest& req, bool lower_bound) {
  const Layout from = validate_layout(req.from, req.mesh_shape, req.global_shape);
  const Layout to = validate_layout(req.to, req.mesh_shape, req.global_shape);
  CompactLayout src, dst;
  planner::Problem P = planner::make_problem(req, from, to, src, dst);
  P.lower_bound = lower_bound;
  planner::Search s(P, src, dst);
  s.run();
  return Searched{s.found(), s.expanded(), P.bytes_first};
}

bool same_time(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)); }

bool trivial(const PlanRequest& r) {
  const Shape mesh = r.mesh_shape;
  const Layout from = validate_layout(r.from, mesh, r.global_shape);
  const Layout to = validate_layout(r.to, mesh, r.global_shape);
  std::vector<int> dims;
  for (int m = 0; m < static_cast<int>(mesh.size()); ++m)
    if (mesh[m] > 1) dims.push_back(m);
  return compact(from, dims) == compact(to, dims);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(planner_lower_bound)

BOOST_AUTO_TEST_CASE(plans_cost_the_same_as_the_plain_search) {
  const std::uint64_t base_seed = testing::seeded(0xA57A0000ull);
  std::mt19937_64 rng(base_seed);
  std::size_t expanded_plain = 0, expanded_bounded = 0;
  std::size_t compared = 0, unplannable = 0;
  const std::size_t requests = testing::scaled_cases(300, 40);
  for (std::size_t i = 0; i < requests; ++i) {
    const Request r = random_request(rng, base_seed + i);
    if (trivial(r.req)) continue;
    // The plain search alone takes seconds on a few 256-rank requests.
    if (testing::reduced_scale() && numel(r.req.mesh_shape) > 64) continue;
    // A request the plain search finds no plan for (integer Avg reduced in
    // one step can leave none) must fail the same way with the bound.
    Searched plain, bounded;
    try {
      plain = search(r.req, false);
    } catch (const LayoutError&) {
      BOOST_CHECK_THROW(search(r.req, true), LayoutError);
      ++unplannable;
      continue;
    }
    bounded = search(r.req, true);
    BOOST_TEST_CONTEXT(r.text()) {
      if (plain.bytes_first) BOOST_TEST(bounded.cost.bytes == plain.cost.bytes);
      BOOST_TEST(same_time(bounded.cost.time, plain.cost.time),
                 fmt::format("time {} bounded, {} plain", bounded.cost.time, plain.cost.time));
      // The planner's plan (with the bound) keeps the searched cost. Where
      // time decides, plans of equal time may move different bytes.
      const Plan plan = plan_redistribute(r.req);
      const Plan plain_plan = plan_redistribute(r.req, false);
      if (plain.bytes_first) BOOST_TEST(plan.max_recv_bytes() == plain_plan.max_recv_bytes());
      BOOST_TEST(same_time(plan.est_seconds, plain_plan.est_seconds),
                 fmt::format("plan time {} bounded, {} plain", plan.est_seconds, plain_plan.est_seconds));
    }
    expanded_plain += plain.expanded;
    expanded_bounded += bounded.expanded;
    ++compared;
  }
  BOOST_TEST_MESSAGE(fmt::format("{} requests ({} without a plan): {} states expanded plain, {} with the bound",
                                 compared, unplannable, expanded_plain, expanded_bounded));
  BOOST_TEST(compared > requests * 2 / 3);
  BOOST_TEST(expanded_bounded < expanded_plain);
}

// Every state the bounded search reached, searched again from there to the
// goal without the bound: the bound is at most the least bytes (exact
// busiest totals) and at most the least time.
BOOST_AUTO_TEST_CASE(the_bound_never_exceeds_the_cost_from_a_reached_state) {
  const std::uint64_t base_seed = testing::seeded(0xAD310000ull);
  std::mt19937_64 rng(base_seed);
  std::size_t checked = 0;
  const std::size_t requests = testing::scaled_cases(60, 8);
  for (std::size_t i = 0; i < requests; ++i) {
    const Request r = random_request(rng, base_seed + i);
    if (trivial(r.req) || numel(r.req.mesh_shape) > 24) continue;
    const Layout from = validate_layout(r.req.from, r.req.mesh_shape, r.req.global_shape);
    const Layout to = validate_layout(r.req.to, r.req.mesh_shape, r.req.global_shape);
    CompactLayout src, dst;
    planner::Problem P = planner::make_problem(r.req, from, to, src, dst);
    planner::Search s(P, src, dst);
    s.run();
    BOOST_TEST_CONTEXT(r.text()) {
      BOOST_TEST(s.bound(s.goal()).bytes == 0);
      BOOST_TEST(s.bound(s.goal()).time == 0.0);
      for (std::size_t k = 0; k < s.num_states(); ++k) {
        const int state = static_cast<int>(k);
        if (state == s.goal()) continue;
        const planner::Cost b = s.bound(state);
        planner::Problem bytes_first = P, time_first = P;
        bytes_first.lower_bound = time_first.lower_bound = false;
        bytes_first.bytes_first = bytes_first.exact_busiest = true;
        time_first.bytes_first = time_first.exact_busiest = false;
        planner::Search by_bytes(bytes_first, s.state(state).layout, dst);
        planner::Search by_time(time_first, s.state(state).layout, dst);
        by_bytes.run();
        by_time.run();
        BOOST_TEST(b.bytes <= by_bytes.found().bytes, fmt::format("state {}", state));
        BOOST_TEST(b.time <= by_time.found().time, fmt::format("state {}", state));
        ++checked;
      }
    }
  }
  BOOST_TEST_MESSAGE(fmt::format("{} reached states checked", checked));
  BOOST_TEST(checked > requests * 10 / 3);  // 200 over the full 60
}

// Counts, not times: deterministic. The 4x4x4x4 request is the one the
// plain search took about 0.1 s on.
BOOST_AUTO_TEST_CASE(the_bound_expands_fewer_states_with_partial_mesh_dims) {
  struct Known {
    PlanRequest req;
    double at_most;  // bounded over plain expanded states
  };
  auto req = [](Shape mesh, Shape shape, const char* from, const char* to) {
    return PlanRequest{mesh, shape, DType::Float32, Layout::parse(from), Layout::parse(to), CostModel{}};
  };
  const std::vector<Known> known = {
      {req({4, 4, 4, 4}, {1000, 1001}, "P(sum),P(sum),R,R", "S(0),S(1),R,R"), 0.5},
      {req({2, 2, 2, 2}, {64, 64}, "P(sum),P(sum),P(sum),R", "S(0),R,S(1),R"), 0.5},
      {req({4, 4, 4, 4}, {16, 16}, "P(sum),P(sum),S(0),R", "R,S(1),R,S(0)"), 0.5},
      {req({2, 2, 2}, {64, 64, 64}, "P(sum),P(sum),S(0)", "S(1),R,S(2)"), 0.5},
  };
  for (const Known& k : known) {
    PlanSearchStats plain, bounded;
    const Plan a = plan_redistribute(k.req, false, &plain);
    const Plan b = plan_redistribute(k.req, true, &bounded);
    BOOST_TEST_MESSAGE(fmt::format("{} -> {} on {}: expanded {} plain, {} bounded", k.req.from, k.req.to,
                                   fmt::join(k.req.mesh_shape, "x"), plain.expanded, bounded.expanded));
    BOOST_TEST_CONTEXT(fmt::format("{} -> {} on {}", k.req.from, k.req.to, fmt::join(k.req.mesh_shape, "x"))) {
      BOOST_TEST(b.max_recv_bytes() == a.max_recv_bytes());
      BOOST_TEST(static_cast<double>(bounded.expanded) <= k.at_most * static_cast<double>(plain.expanded),
                 fmt::format("expanded {} plain, {} bounded", plain.expanded, bounded.expanded));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
