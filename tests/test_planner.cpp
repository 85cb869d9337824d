// The planner as a pure function: known answers from the issue, the lower
// bound on received bytes, validation, the cache, and the closed-form prices
// against the planner. The executor's tests are in test_executor.cpp.
#include <boost/test/unit_test.hpp>

#include "planner_checks.h"
#include "support.h"

#include <chrono>
#include <ostream>
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

using namespace dtensor;
using planner_test::make_plan;

namespace {

// Independent of the planner: max over ranks of |needed(to) \ held(from)| in
// elements, from local_box only. Partial(sum) targets: only coordinate 0
// needs data; other Partial targets need their whole box.
std::int64_t lower_bound(const Shape& mesh, const Shape& shape, const Layout& from, const Layout& to) {
  std::int64_t best = 0;
  for (std::int64_t r = 0; r < numel(mesh); ++r) {
    Shape c = unravel_index(r, mesh);
    bool needs = true;
    for (int m = 0; m < to.mesh_ndim(); ++m)
      if (is_partial(to[m]) && std::get<Partial>(to[m]).op == ReduceOp::Sum && c[m] != 0) needs = false;
    if (!needs) continue;
    Box want = local_box(mesh, shape, to, c), have = local_box(mesh, shape, from, c);
    best = std::max(best, want.numel() - intersect(want, have).numel());
  }
  return best;
}

std::int64_t comm_steps(const Plan& p) { return p.num_collectives(); }

// Bytes the busiest rank receives across mesh dim 0 of the mesh: exchange
// blocks between ranks on different rows, plus the bytes of every step whose
// group includes dim 0 (all of them, an upper bound for groups of several dims).
std::int64_t across_dim0(const Plan& p) {
  const std::int64_t per_row = numel(p.mesh_shape) / p.mesh_shape[0];
  std::vector<std::int64_t> got(p.recv_bytes.size(), 0);
  for (const PlanStep& s : p.steps) {
    if (s.kind == StepKind::Exchange) {
      for (const ExchangeBlock& b : s.blocks)
        if (b.src_rank / per_row != b.dst_rank / per_row) got[b.dst_rank] += b.box.numel() * 4;
    } else if (std::find(s.mesh_dims.begin(), s.mesh_dims.end(), 0) != s.mesh_dims.end()) {
      for (std::size_t r = 0; r < got.size(); ++r) got[r] += s.recv_bytes[r];  // an upper bound
    }
  }
  return *std::max_element(got.begin(), got.end());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(planner_known_answers)

BOOST_AUTO_TEST_CASE(gather_one_dim_mesh_of_4) {
  for (Shape shape : {Shape{12, 3}, Shape{13, 3}, Shape{14, 3}, Shape{3, 12}, Shape{3, 13}, Shape{3, 14}})
    for (const char* from : {"S(0)", "S(1)"}) {
      Plan p = make_plan({4}, shape, from, "R");
      BOOST_TEST_INFO(fmt::format("{}", p));
      BOOST_TEST(p.steps.size() == 1u);
      BOOST_TEST(comm_steps(p) == 1);
      if (p.steps.size() == 1 && p.steps[0].kind != StepKind::AllGather)  // an equivalent step: same bytes
        BOOST_TEST(p.max_recv_bytes() == lower_bound({4}, shape, p.from, p.to) * 4);
      BOOST_TEST(p.max_recv_bytes() == lower_bound({4}, shape, p.from, p.to) * 4);
      // Exact sizes, not padded: every rank receives the others' shards.
      for (int r = 0; r < 4; ++r) {
        Box mine = local_box(Shape{4}, shape, p.from, Shape{r});
        BOOST_TEST(p.recv_bytes[r] == (numel(shape) - mine.numel()) * 4);
      }
    }
}

BOOST_AUTO_TEST_CASE(slice_needs_no_communication) {
  for (const char* to : {"S(0)", "S(1)"}) {
    Plan p = make_plan({4}, {13, 3}, "R", to);
    BOOST_TEST(p.steps.size() == 1u);
    BOOST_TEST(p.steps[0].kind == StepKind::Slice);
    BOOST_TEST(comm_steps(p) == 0);
    BOOST_TEST(p.max_recv_bytes() == 0);
  }
  Plan p = make_plan({2, 2}, {8, 8}, "R,R", "S(0),S(1)");
  BOOST_TEST(comm_steps(p) == 0);
  BOOST_TEST(p.steps.size() == 1u);  // consecutive slices merge
}

BOOST_AUTO_TEST_CASE(partial_to_replicate_is_one_all_reduce) {
  Plan p = make_plan({4}, {13, 3}, "P(sum)", "R");
  BOOST_TEST_REQUIRE(p.steps.size() == 1u);
  BOOST_TEST(p.steps[0].kind == StepKind::AllReduce);
  // Ring volumes: (n-1)*seg(r) + (count - seg(r)) elements, seg = even split of 39 over 4.
  for (int r = 0; r < 4; ++r) {
    std::int64_t seg = even_split(39, 4, r).size;
    BOOST_TEST(p.recv_bytes[r] == (3 * seg + 39 - seg) * 4);
  }
  for (const char* op : {"P(max)", "P(min)", "P(avg)"}) {
    Plan q = make_plan({4}, {8}, op, "R");
    BOOST_TEST(q.steps.size() == 1u);
    BOOST_TEST((q.steps[0].kind == StepKind::AllReduce));
  }
}

BOOST_AUTO_TEST_CASE(partial_to_shard_is_one_reduce_scatter) {
  for (const char* to : {"S(0)", "S(1)"}) {
    Plan p = make_plan({4}, {13, 14}, "P(sum)", to);
    BOOST_TEST_REQUIRE(p.steps.size() == 1u);
    BOOST_TEST(p.steps[0].kind == StepKind::ReduceScatter);
    for (int r = 0; r < 4; ++r)
      BOOST_TEST(p.recv_bytes[r] == 3 * local_box(Shape{4}, Shape{13, 14}, p.to, Shape{r}).numel() * 4);
  }
}

BOOST_AUTO_TEST_CASE(two_partial_dims_reduce_as_one_group) {
  // One all_reduce over 4 ranks receives 2*3/4 of the data; two in a row 2*(2*1/2).
  Plan p = make_plan({2, 2}, {64, 64}, "P(sum),P(sum)", "R,R");
  const std::int64_t bytes = 64 * 64 * 4;
  BOOST_TEST_INFO(fmt::format("{}", p));
  BOOST_TEST(p.max_recv_bytes() <= bytes * 3 / 2);
  BOOST_TEST(p.num_collectives() <= 2);
  BOOST_TEST(p.est_seconds < 2 * (6.6e-6 + 2 * 0.6e-6 + bytes / 87.7e9));
}

BOOST_AUTO_TEST_CASE(shard_to_shard_is_one_all_to_all) {
  for (Shape shape : {Shape{8, 8}, Shape{8, 8, 8}, Shape{8, 5}, Shape{5, 8}, Shape{5, 5}})
    for (auto [from, to] : {std::pair{"S(0)", "S(1)"}, std::pair{"S(1)", "S(0)"}}) {
      Plan p = make_plan({4}, shape, from, to);
      BOOST_TEST_INFO(fmt::format("{}", p));
      BOOST_TEST(p.steps.size() == 1u);
      BOOST_TEST(comm_steps(p) == 1);
      BOOST_TEST(p.max_recv_bytes() == lower_bound({4}, shape, p.from, p.to) * 4);
    }
}

BOOST_AUTO_TEST_CASE(two_by_two) {
  struct K {
    const char* from;
    const char* to;
    int most;
  };
  for (K k : {K{"S(0),S(1)", "S(0),S(0)", 1}, K{"S(0),S(1)", "S(1),S(0)", 2}, K{"S(0),S(0)", "S(1),S(1)", 2}}) {
    Plan p = make_plan({2, 2}, {8, 8}, k.from, k.to);
    BOOST_TEST_INFO(fmt::format("{}", p));
    BOOST_TEST(comm_steps(p) <= k.most);
    BOOST_TEST(p.max_recv_bytes() == lower_bound({2, 2}, {8, 8}, p.from, p.to) * 4);
  }
}

BOOST_AUTO_TEST_CASE(two_by_two_by_two) {
  struct K {
    const char* from;
    const char* to;
    int most;
  };
  for (K k : {K{"S(0),S(0),S(0)", "S(1),S(1),S(1)", 3}, K{"S(0),S(1),S(2)", "S(2),S(1),S(0)", 2},
              K{"S(1),S(0),S(0)", "R,S(0),S(0)", 1}}) {
    Plan p = make_plan({2, 2, 2}, {8, 8, 8}, k.from, k.to);
    BOOST_TEST_INFO(fmt::format("{}", p));
    BOOST_TEST(comm_steps(p) <= k.most);
    BOOST_TEST(p.max_recv_bytes() == lower_bound({2, 2, 2}, {8, 8, 8}, p.from, p.to) * 4);
  }
}

BOOST_AUTO_TEST_CASE(mesh_dims_of_size_one_never_communicate) {
  for (auto [from, to] : {std::pair{"S(0)", "R"}, std::pair{"P(sum)", "R"}, std::pair{"R", "P(sum)"},
                          std::pair{"S(0)", "S(1)"}, std::pair{"P(max)", "P(sum)"}}) {
    Plan p = make_plan({1}, {6, 5}, from, to);
    BOOST_TEST(comm_steps(p) == 0);
    BOOST_TEST(p.max_recv_bytes() == 0);
  }
  // Changes only on the size-1 dim of a 1x4 or 4x1 mesh.
  BOOST_TEST(comm_steps(make_plan({1, 4}, {6, 5}, "S(1),S(0)", "R,S(0)")) == 0);
  BOOST_TEST(comm_steps(make_plan({4, 1}, {6, 5}, "S(0),P(sum)", "S(0),S(1)")) == 0);
  // Collectives on a mixed mesh only use the dims of size > 1.
  Plan p = make_plan({2, 1, 2}, {6, 5}, "S(0),S(1),S(1)", "R,R,R");
  for (const PlanStep& s : p.steps)
    if (!is_local(s.kind) && s.kind != StepKind::Exchange)
      for (int m : s.mesh_dims) BOOST_TEST(m != 1);
  BOOST_TEST(p.max_recv_bytes() == lower_bound({2, 1, 2}, {6, 5}, p.from, p.to) * 4);
}

BOOST_AUTO_TEST_CASE(gather_on_two_by_four_moves_seven_eighths) {
  Plan p = make_plan({2, 4}, {16, 16}, "S(0),S(1)", "R,R");
  BOOST_TEST_MESSAGE("uniform links:\n" << fmt::format("{}", p));
  for (int r = 0; r < 8; ++r) BOOST_TEST(p.recv_bytes[r] == 16 * 16 * 4 * 7 / 8);
}

BOOST_AUTO_TEST_CASE(slow_outer_dim_changes_the_plan) {
  CostModel slow;
  slow.links = {inter_node_link()};
  Plan uniform = make_plan({2, 4}, {16, 16}, "S(0),S(1)", "R,R");
  Plan p = make_plan({2, 4}, {16, 16}, "S(0),S(1)", "R,R", DType::Float32, slow);
  BOOST_TEST_MESSAGE("slow mesh dim 0:\n" << fmt::format("{}", p));
  // Both reach the lower bound ...
  BOOST_TEST(p.max_recv_bytes() == 16 * 16 * 4 * 7 / 8);
  BOOST_TEST(uniform.max_recv_bytes() == p.max_recv_bytes());
  // ... but with a slow dim 0 one exchange would pay the inter-host latency
  // for each of 7 peers and move half the tensor across hosts: the plan uses
  // collectives and moves less across dim 0.
  BOOST_TEST(uniform.steps.size() == 1u);
  BOOST_TEST(p.steps.size() > 1u);
  BOOST_TEST(across_dim0(p) < across_dim0(uniform));
  BOOST_TEST(across_dim0(uniform) == 16 * 16 * 4 / 2);
}

BOOST_AUTO_TEST_CASE(exchange_holders_prefer_fast_links) {
  // (R,S(0)) -> (S(0),R) on 2x4 with a slow dim 0: every piece a rank lacks has
  // a holder on its own host (dim 0 replicated in the source).
  CostModel slow;
  slow.links = {inter_node_link()};
  Plan p = make_plan({2, 4}, {16, 16}, "R,S(0)", "S(0),R", DType::Float32, slow);
  for (const PlanStep& s : p.steps)
    for (const ExchangeBlock& b : s.blocks) BOOST_TEST(b.src_rank / 4 == b.dst_rank / 4);
  BOOST_TEST(p.max_recv_bytes() == lower_bound({2, 4}, {16, 16}, p.from, p.to) * 4);
}

BOOST_AUTO_TEST_CASE(partial_op_change_goes_through_a_reduction) {
  Plan p = make_plan({4}, {8}, "P(max)", "P(sum)");
  BOOST_TEST_INFO(fmt::format("{}", p));
  BOOST_TEST_REQUIRE(p.steps.size() == 2u);
  BOOST_TEST(p.steps[0].kind == StepKind::AllReduce);
  BOOST_TEST(p.steps[1].kind == StepKind::ZeroFill);
}

BOOST_AUTO_TEST_CASE(plans_print_and_explain) {
  Plan p = make_plan({2, 4}, {8, 13}, "S(0),S(1)", "S(1),R", DType::Float32);
  std::string text = fmt::format("{}", p);
  BOOST_TEST_MESSAGE(text);
  BOOST_TEST(text.find("plan S(0),S(1) -> S(1),R on mesh 2x4, tensor 8x13 f32") == 0u);
  for (const PlanStep& s : p.steps) {
    BOOST_TEST(!s.reason.empty());
    BOOST_TEST(text.find(s.reason) != std::string::npos);
  }
  BOOST_TEST(p.steps[0].reason.find("plans") != std::string::npos);
  BOOST_TEST(fmt::format("{}", make_plan({2}, {4}, "R", "R")).find("nothing to do") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(exchange_blocks_match_bytes) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 50; ++i) {
    Plan p = make_plan({2, 3}, {7, 5}, i % 2 ? "S(0),S(1)" : "S(1),S(0)", i % 3 ? "S(0)[1],S(0)[0]" : "R,S(0)");
    for (const PlanStep& s : p.steps) {
      if (s.kind != StepKind::Exchange) continue;
      std::vector<std::int64_t> bytes(6, 0);
      for (const ExchangeBlock& b : s.blocks)
        if (b.src_rank != b.dst_rank) bytes[b.dst_rank] += b.box.numel() * 4;
      BOOST_TEST(bytes == s.recv_bytes);
      BOOST_TEST(std::is_sorted(s.blocks.begin(), s.blocks.end(), [](auto& a, auto& b) {
        return std::tie(a.dst_rank, a.src_rank, a.box.offset) < std::tie(b.dst_rank, b.src_rank, b.box.offset);
      }));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(planner_lower_bound)

// Random layouts without Partial in the source (any target, any nesting):
// the busiest rank receives exactly the independent lower bound.
BOOST_AUTO_TEST_CASE(random_non_partial_sources_reach_the_bound) {
  std::mt19937_64 rng(20240601);
  const std::vector<Shape> meshes = {{2}, {3}, {4}, {8}, {2, 2}, {2, 3}, {1, 4}, {2, 4}, {4, 2}, {2, 2, 2}, {2, 1, 3}};
  const std::int64_t sizes[] = {0, 1, 2, 3, 5, 7, 8, 9, 13, 16};
  auto random_layout = [&](int mesh_nd, int nd, bool partial) {
    std::vector<Placement> ps;
    for (int m = 0; m < mesh_nd; ++m) {
      int pick = static_cast<int>(rng() % 6);
      if (partial && pick == 0)
        ps.push_back(Partial{ReduceOp::Sum});
      else if (nd > 0 && pick < 4)
        ps.push_back(Shard{static_cast<std::int64_t>(rng() % nd)});
      else
        ps.push_back(Replicate{});
    }
    std::vector<std::pair<std::int64_t, std::vector<int>>> order;
    Layout l(ps);
    for (int d = 0; d < nd && rng() % 2; ++d) {
      std::vector<int> dims = l.split_order(d);
      std::shuffle(dims.begin(), dims.end(), rng);
      if (dims.size() > 1) order.emplace_back(d, dims);
    }
    return Layout(ps, order);
  };
  int checked = 0;
  for (int i = 0; i < 600; ++i) {
    const Shape& mesh = meshes[rng() % meshes.size()];
    int nd = 1 + static_cast<int>(rng() % 3);
    Shape shape;
    for (int d = 0; d < nd; ++d) shape.push_back(sizes[rng() % std::size(sizes)]);
    Layout from = random_layout(static_cast<int>(mesh.size()), nd, false);
    Layout to = random_layout(static_cast<int>(mesh.size()), nd, true);
    CostModel cost;
    if (rng() % 2) cost.links = {inter_node_link()};
    DType dtype = rng() % 2 ? DType::Float32 : DType::Float64;
    Plan p = plan_redistribute(PlanRequest{mesh, shape, dtype, from, to, cost});
    const std::int64_t bound = lower_bound(mesh, shape, p.from, p.to) * static_cast<std::int64_t>(itemsize(dtype));
    BOOST_TEST(p.max_recv_bytes() == bound, fmt::format("{}", p));
    std::vector<std::int64_t> sum(p.recv_bytes.size(), 0);
    double t = 0;
    for (const PlanStep& s : p.steps) {
      for (std::size_t r = 0; r < sum.size(); ++r) sum[r] += s.recv_bytes[r];
      t += s.est_seconds;
    }
    BOOST_TEST(sum == p.recv_bytes);
    BOOST_TEST(std::abs(t - p.est_seconds) <= 1e-12);
    if (!p.steps.empty()) {
      BOOST_TEST(p.steps.front().from == p.from);
      BOOST_TEST(p.steps.back().to == p.to);
    }
    for (std::size_t s = 1; s < p.steps.size(); ++s) BOOST_TEST(p.steps[s].from == p.steps[s - 1].to);
    ++checked;
  }
  BOOST_TEST(checked == 600);
}

BOOST_AUTO_TEST_CASE(needed_box_is_empty_off_coordinate_zero_of_a_sum) {
  Layout l = Layout::parse("S(0),P(sum)");
  Shape mesh{2, 2}, shape{4, 3};
  BOOST_TEST(needed_box(mesh, shape, l, Shape{1, 0}) == local_box(mesh, shape, l, Shape{1, 0}));
  BOOST_TEST(needed_box(mesh, shape, l, Shape{1, 1}).numel() == 0);
  Layout m = Layout::parse("S(0),P(max)");
  BOOST_TEST(needed_box(mesh, shape, m, Shape{1, 1}) == local_box(mesh, shape, m, Shape{1, 1}));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(planner_validation)

template <class E>
void expect_error(const PlanRequest& req, const std::string& part) {
  try {
    plan_redistribute(req);
    BOOST_ERROR("no error; expected one naming: " << part);
  } catch (const E& e) {
    std::string what = e.what();
    BOOST_TEST(what.find(part) != std::string::npos, what);
    BOOST_TEST(what.rfind("[redistribute]", 0) == 0u, what);
  }
}

BOOST_AUTO_TEST_CASE(bad_requests_name_the_bad_value) {
  expect_error<LayoutError>(PlanRequest{{2, 2}, {4, 4}, DType::Float32, Layout::parse("R,S(2)"), Layout::parse("R,R")},
                            "Shard(2) on mesh dim 1: the tensor has 2 dims");
  expect_error<LayoutError>(PlanRequest{{2, 2}, {4, 4}, DType::Float32, Layout::parse("R,R"), Layout::parse("S(-3),R")},
                            "Shard(-3) on mesh dim 0: the tensor has 2 dims");
  expect_error<LayoutError>(PlanRequest{{2, 2, 2}, {4}, DType::Float32, Layout::parse("R,R"), Layout::parse("R,R,R")},
                            "has 2 placements: the mesh [2,2,2] has 3 dims");
  expect_error<LayoutError>(PlanRequest{{2, 2},
                                        {4},
                                        DType::Float32,
                                        Layout::parse("P(sum),P(max)"),
                                        Layout::parse("R,R")},
                            "mixes P(sum) and P(max)");
  expect_error<ShapeError>(PlanRequest{{2}, {4, -1}, DType::Float32, Layout::parse("R"), Layout::parse("S(0)")},
                           "size -1 of dim 1 is negative");
  expect_error<ShapeError>(PlanRequest{{2, 0}, {4}, DType::Float32, Layout::parse("R,R"), Layout::parse("S(0),R")},
                           "mesh dim 1 has size 0");
  expect_error<ShapeError>(PlanRequest{{-2}, {4}, DType::Float32, Layout::parse("R"), Layout::parse("S(0)")},
                           "mesh dim 0 has size -2");
}

BOOST_AUTO_TEST_CASE(negative_shard_dims_resolve) {
  Plan p = make_plan({4}, {8, 6}, "S(-1)", "S(0)");
  BOOST_TEST(p.from == Layout::parse("S(1)"));
  BOOST_TEST(p.max_recv_bytes() == lower_bound({4}, {8, 6}, p.from, p.to) * 4);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(plan_cache)

// A repeated request is answered from the cache, each time the same plan;
// new requests are misses, counted. How fast either is belongs to
// bench/plan_cache, not to a test.
BOOST_AUTO_TEST_CASE(repeated_requests_are_hits_on_the_same_plan) {
  clear_plan_cache();
  PlanRequest req{{2, 2, 2},
                  {64, 64, 64},
                  DType::Float32,
                  Layout::parse("S(0),S(1),S(2)"),
                  Layout::parse("S(2),S(1),S(0)")};
  const Plan& first = cached_plan(req);
  BOOST_TEST(plan_cache_stats().misses == 1u);
  BOOST_TEST(&cached_plan(req) == &first);
  BOOST_TEST(plan_cache_stats().hits == 1u);

  constexpr int kHits = 1'000;
  int same = 0;
  for (int i = 0; i < kHits; ++i) same += &cached_plan(req) == &first;
  BOOST_TEST(same == kHits);
  BOOST_TEST(plan_cache_stats().hits == 1u + kHits);
  BOOST_TEST(plan_cache_stats().misses == 1u);

  // Misses: a few requests on small meshes, planned from scratch.
  const std::vector<PlanRequest> misses = {
      req,
      {{2, 4}, {16, 16}, DType::Float32, Layout::parse("S(0),S(1)"), Layout::parse("R,R")},
      {{2, 2, 2}, {8, 8, 8}, DType::Float32, Layout::parse("S(0),S(0),S(0)"), Layout::parse("S(1),S(1),S(1)")},
      {{2, 2, 2}, {8, 8, 8}, DType::Float32, Layout::parse("P(sum),P(sum),S(0)"), Layout::parse("S(1),R,S(2)")},
      {{8}, {13, 7}, DType::Float64, Layout::parse("S(0)"), Layout::parse("S(1)")},
  };
  clear_plan_cache();
  for (const PlanRequest& m : misses) BOOST_TEST(cached_plan(m).max_recv_bytes() > 0);
  BOOST_TEST(plan_cache_stats().misses == misses.size());
  BOOST_TEST(plan_cache_stats().hits == 0u);
}

BOOST_AUTO_TEST_CASE(options_are_part_of_the_key) {
  clear_plan_cache();
  PlanRequest a{{2, 4}, {16, 16}, DType::Float32, Layout::parse("S(0),S(1)"), Layout::parse("R,R")};
  PlanRequest b = a;
  b.cost.links = {inter_node_link()};
  BOOST_TEST(!(a == b));
  const Plan& pa = cached_plan(a);
  const Plan& pb = cached_plan(b);
  BOOST_TEST(&pa != &pb);
  BOOST_TEST(plan_cache_stats().misses == 2u);
}

BOOST_AUTO_TEST_SUITE_END()

// Propagation prices candidates with closed_form_seconds where it applies;
// it must give exactly the planner's est_seconds (the same number, not a
// close one), or strategy choices would change with it. It skips candidates
// by redistribute_lower_bound_seconds, which must never exceed the planner's.
BOOST_AUTO_TEST_SUITE(closed_form_prices)

BOOST_AUTO_TEST_CASE(equal_the_planner_on_random_moves) {
  const std::uint64_t seed = testing::seeded(314159);
  std::mt19937_64 rng(seed);
  const std::vector<Shape> meshes = {{2}, {3}, {4}, {8}, {2, 2}, {2, 3}, {1, 4}, {2, 4}, {4, 2}, {2, 2, 2}, {2, 1, 3}};
  const std::int64_t sizes[] = {0, 1, 2, 3, 5, 7, 8, 9, 13, 16, 64, 257, 4096};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};
  auto random_placement = [&](int nd, bool partial, ReduceOp op) -> Placement {
    const int pick = static_cast<int>(rng() % 6);
    if (partial && pick == 0) return Partial{op};
    if (pick < 4) return Shard{static_cast<std::int64_t>(rng() % nd)};
    return Replicate{};
  };
  int applied = 0, bounded = 0, by_kind[3] = {0, 0, 0}, all_reduce_steps = 0;
  // Not scaled by DTENSOR_TEST_SCALE: the counts below (each rule applied to
  // more than 20 moves) need the whole seeded set, and planning 3000 small
  // moves takes seconds even under the sanitizers.
  const int cases = 3000;
  for (int i = 0; i < cases; ++i) {
    const Shape& mesh = meshes[rng() % meshes.size()];
    const int mesh_nd = static_cast<int>(mesh.size());
    const int nd = 1 + static_cast<int>(rng() % 3);
    Shape shape;
    for (int d = 0; d < nd; ++d) shape.push_back(sizes[rng() % std::size(sizes)]);
    const ReduceOp op = ops[rng() % std::size(ops)];
    std::vector<Placement> ps;
    for (int m = 0; m < mesh_nd; ++m) ps.push_back(random_placement(nd, rng() % 3 == 0, op));
    std::vector<std::pair<std::int64_t, std::vector<int>>> order;
    Layout plain(ps);
    for (int d = 0; d < nd && rng() % 2; ++d) {
      std::vector<int> dims = plain.split_order(d);
      std::shuffle(dims.begin(), dims.end(), rng);
      if (dims.size() > 1) order.emplace_back(d, dims);
    }
    const Layout from(ps, order);
    // Mostly one mesh dim changes (a new Shard goes innermost); sometimes two.
    Layout to = from;
    const int changes = rng() % 4 == 0 ? 2 : 1;
    for (int c = 0; c < changes; ++c)
      to = to.with(static_cast<int>(rng() % mesh_nd), random_placement(nd, rng() % 3 == 0, op));
    // Half the Partial sources reduce one of their Partial dims.
    for (int m = 0; m < mesh_nd; ++m)
      if (is_partial(from[m]) && rng() % 2) to = from.with(m, Replicate{});
    CostModel cost;
    switch (rng() % 4) {
      case 0: break;
      case 1: cost.links = {inter_node_link()}; break;
      case 2: cost.links = {LinkParams{1e-6, 5e9}, LinkParams{0.2e-6, 200e9}}; break;
      default:
        cost.base_latency_s = 1e-6;
        cost.local_copy_Bps = 5e9;
        break;
    }
    const DType dtype = rng() % 4 == 0 ? DType::Int64 : DType::Float32;
    const std::string what = fmt::format("case {} (seed {}): mesh {} shape [{}] {} {} -> {} ({})", i, seed,
                                         fmt::join(mesh, "x"), fmt::join(shape, ","), dtype, from, to, cost);
    std::optional<double> fast = closed_form_seconds(mesh, shape, dtype, from, to, cost);
    double planned = 0;
    Plan plan;
    try {
      plan = plan_redistribute(PlanRequest{mesh, shape, dtype, from, to, cost});
      planned = plan.est_seconds;
    } catch (const LayoutError&) {
      BOOST_TEST(!fast.has_value(), what);  // the planner refuses: no price either
      continue;
    }
    const double bound = redistribute_lower_bound_seconds(mesh, shape, dtype, from, to, cost);
    BOOST_TEST(bound <= planned, what << fmt::format(": lower bound {:.17g}, planner {:.17g}", bound, planned));
    if (bound > 0) ++bounded;
    // The owed-reduction price is the planner's all_reduce step, exactly.
    for (int m = 0; m < mesh_nd; ++m) {
      if (!is_partial(from[m]) || !(to == from.with(m, Replicate{}))) continue;
      const auto step = all_reduce_step_seconds(mesh, shape, dtype, from, m, cost);
      if (!step) continue;
      if (fast)
        BOOST_TEST(*step == *fast, what << fmt::format(": all_reduce step {:.17g}, closed form {:.17g}", *step, *fast));
      if (plan.steps.size() == 1 && plan.steps[0].kind == StepKind::AllReduce) {
        ++all_reduce_steps;
        BOOST_TEST(*step == planned, what << fmt::format(": all_reduce step {:.17g}, planner {:.17g}", *step, planned));
      }
    }
    if (!fast) continue;
    ++applied;
    if (from != to) ++by_kind[from.has_partial() ? 2 : *fast < cost.base_latency_s ? 0 : 1];
    BOOST_TEST(*fast == planned, what << fmt::format(": closed form {:.17g}, planner {:.17g}", *fast, planned));
  }
  BOOST_TEST_MESSAGE(
      fmt::format("closed form applied to {} of {} moves (local {}, collective {}, all_reduce {}); "
                  "a lower bound to {}",
                  applied, cases, by_kind[0], by_kind[1], by_kind[2], bounded));
  BOOST_TEST(bounded > cases / 4);
  BOOST_TEST(all_reduce_steps > 20);
  // The rules must cover a good share of the moves, each rule some.
  BOOST_TEST(applied > cases / 4);
  for (int k : by_kind) BOOST_TEST(k > 20);
}

BOOST_AUTO_TEST_CASE(apply_to_the_common_moves) {
  const Shape mesh{2, 2}, shape{16, 8};
  const CostModel cost;
  auto fast = [&](const char* from, const char* to) {
    return closed_form_seconds(mesh, shape, DType::Float32, Layout::parse(from), Layout::parse(to), cost);
  };
  BOOST_TEST(fast("S(0),R", "S(0),R").value_or(-1) == 0.0);
  BOOST_TEST(fast("S(0),R", "R,R").has_value());                  // all_gather
  BOOST_TEST(fast("S(0),R", "S(1),R").has_value());               // all_to_all
  BOOST_TEST(fast("R,R", "S(0),S(1)").has_value());               // local slices
  BOOST_TEST(fast("P(sum),R", "R,R").has_value());                // all_reduce
  BOOST_TEST(fast("S(0),R", "S(0),P(sum)").has_value());          // zero-fill
  BOOST_TEST(fast("S(0),R", "S(0),P(max)").value_or(-1) == 0.0);  // relabel
  BOOST_TEST(!fast("S(0),S(0)", "R,S(0)").has_value());           // not innermost: the planner decides
}

BOOST_AUTO_TEST_SUITE_END()
