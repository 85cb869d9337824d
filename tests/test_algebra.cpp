// The placement algebra of dtensor/core/layout_rules.h and the planner's compact layouts (dtensor/redistribute/detail/compact_layout.h): one reusable
// checker per function states its contract (as CuTe's @post comments do),
// and each test applies the checker over seeded random cases, naming the
// seed and the case on failure.
#include <boost/test/unit_test.hpp>

#include "checks.h"

#include <algorithm>
#include <numeric>
#include <random>

#include <fmt/ranges.h>

#include "dtensor/redistribute/detail/compact_layout.h"
#include "dtensor/core/error.h"
#include "dtensor/core/placement.h"

using namespace dtensor;
using dtensor::testing::check_throws;

namespace {

constexpr unsigned kSeed = 20261201;

// A random valid layout over `mesh_nd` mesh dims for a tensor of `nd` dims,
// with a random nesting order where several mesh dims shard one tensor dim.
Layout random_layout(std::mt19937& rng, int mesh_nd, int nd, bool partial) {
  std::vector<Placement> ps;
  const ReduceOp op = static_cast<ReduceOp>(rng() % 4);
  for (int m = 0; m < mesh_nd; ++m) {
    const unsigned pick = rng() % (partial ? 3 : 2);
    if (pick == 0) ps.push_back(Replicate{});
    if (pick == 1) ps.push_back(Shard{static_cast<std::int64_t>(rng() % nd)});
    if (pick == 2) ps.push_back(Partial{op});
  }
  std::vector<std::pair<std::int64_t, std::vector<int>>> order;
  for (int d = 0; d < nd; ++d) {
    std::vector<int> dims;
    for (int m = 0; m < mesh_nd; ++m)
      if (is_shard(ps[m], d)) dims.push_back(m);
    std::shuffle(dims.begin(), dims.end(), rng);
    if (!dims.empty()) order.emplace_back(d, std::move(dims));
  }
  return Layout(std::move(ps), order);
}

Shape random_mesh(std::mt19937& rng, int mesh_nd) {
  Shape mesh(mesh_nd);
  for (auto& n : mesh) n = 1 + rng() % 3;
  return mesh;
}

// --- checkers ---------------------------------------------------------------

// normalize_levels: shard entries' levels become 0..c-1 per tensor dim in the
// order of (old level, mesh dim); other entries are untouched.
void check_normalize_levels(const std::vector<std::int64_t>& dims, const std::vector<int>& before) {
  std::vector<int> after = before;
  normalize_levels(dims, after);
  const std::size_t n = dims.size();
  for (std::size_t m = 0; m < n; ++m) {
    if (before[m] < 0) {
      BOOST_TEST(after[m] == before[m], "mesh dim " << m << " does not shard but changed");
      continue;
    }
    int c = 0;
    for (std::size_t o = 0; o < n; ++o) {
      if (before[o] < 0 || dims[o] != dims[m]) continue;
      ++c;
      const bool was_outer = before[o] < before[m] || (before[o] == before[m] && o < m);
      if (o != m) BOOST_TEST((after[o] < after[m]) == was_outer, "order of mesh dims " << o << " and " << m);
    }
    BOOST_TEST((after[m] >= 0 && after[m] < c),
               "level " << after[m] << " of mesh dim " << m << " outside 0.." << c - 1);
  }
}

// compact + normalize + state_key: the compact form of a layout is
// normalised (normalising again changes nothing) and two compact layouts
// have the same key exactly when they are equal.
void check_compact_and_key(const Layout& a, const Layout& b) {
  const CompactLayout ca = compact(a), cb = compact(b);
  CompactLayout again = ca;
  normalize(again);
  BOOST_TEST((again == ca), "compact form of " << fmt::format("{}", a) << " is not normalised");
  // Compact forms are equal exactly when the layouts are (all mesh dims kept).
  BOOST_TEST((ca == cb) == (a == b), fmt::format("{} vs {}", a, b));
  BOOST_TEST((state_key(ca) == state_key(cb)) == (ca == cb), fmt::format("keys of {} vs {}", a, b));
  for (int m = 0; m < a.mesh_ndim(); ++m) {
    const CompactPlacement& p = ca[m];
    if (is_shard(a[m])) {
      BOOST_TEST((p.kind == CompactPlacement::kShard && p.dim == std::get<Shard>(a[m]).dim && p.level == a.level(m)));
    } else if (is_partial(a[m])) {
      BOOST_TEST((p.kind == CompactPlacement::kPar && p.op == std::get<Partial>(a[m]).op));
    } else {
      BOOST_TEST((p == CompactPlacement{}));
    }
  }
}

// layout_problem: nullopt exactly when there is one placement per mesh dim,
// every shard dim is in [-nd, nd) and one kind of Partial at most; otherwise
// the first rule broken, in that order, and validate_layout throws naming it.
void check_layout_problem(const std::vector<Placement>& ps, const Shape& mesh, const Shape& shape) {
  const auto nd = static_cast<std::int64_t>(shape.size());
  std::optional<LayoutProblem::Kind> expected;
  if (ps.size() != mesh.size()) expected = LayoutProblem::Kind::MeshDims;
  for (const Placement& p : ps)
    if (!expected && is_shard(p) && (std::get<Shard>(p).dim < -nd || std::get<Shard>(p).dim >= nd))
      expected = LayoutProblem::Kind::ShardDim;
  std::optional<ReduceOp> op;
  for (const Placement& p : ps)
    if (const auto* q = std::get_if<Partial>(&p)) {
      if (!expected && op && *op != q->op) expected = LayoutProblem::Kind::MixedPartial;
      op = q->op;
    }
  const auto got = layout_problem(ps, mesh.size(), shape.size());
  BOOST_TEST(got.has_value() == expected.has_value());
  if (!got || !expected) {
    if (!got) BOOST_CHECK_NO_THROW(validate_layout(Layout(ps), mesh, shape));
    return;
  }
  BOOST_TEST((got->kind == *expected));
  const Layout l(ps);
  check_throws<LayoutError>([&] { validate_layout(l, mesh, shape); }, "[layout] " + describe(*got, l, mesh));
}

// fill_rank_boxes: every rank's box of the compact form equals local_box of
// the layout at its coordinates, over all mesh dims and over the mesh dims of
// size > 1 only (as the planner reduces a request).
void check_rank_boxes(const Shape& mesh, const Shape& shape, const Layout& l) {
  const int ranks = static_cast<int>(numel(mesh)), M = static_cast<int>(mesh.size()),
            nd = static_cast<int>(shape.size());
  RankBoxes all, reduced;
  fill_rank_boxes(all, compact(l), shape, ranks, mesh, [&](int r, int m) { return unravel_index(r, mesh)[m]; });
  std::vector<int> big;
  Shape big_sizes;
  for (int m = 0; m < M; ++m)
    if (mesh[m] > 1) {
      big.push_back(m);
      big_sizes.push_back(mesh[m]);
    }
  fill_rank_boxes(reduced, compact(l, big), shape, ranks, big_sizes,
                  [&](int r, int i) { return unravel_index(r, mesh)[big[i]]; });
  std::int64_t most = 0;
  for (int r = 0; r < ranks; ++r) {
    const Box want = local_box(mesh, shape, l, unravel_index(r, mesh));
    for (const RankBoxes* b : {&all, &reduced}) {
      const Shape off(b->off.begin() + r * nd, b->off.begin() + (r + 1) * nd);
      const Shape sz(b->sz.begin() + r * nd, b->sz.begin() + (r + 1) * nd);
      BOOST_TEST(sz == want.size, "rank " << r);
      BOOST_TEST(off == want.offset, "rank " << r);
      BOOST_TEST(b->numel[r] == want.numel(), "rank " << r);
      BOOST_TEST(inter_numel(*b, r, *b, r, nd) == want.numel(), "rank " << r);
    }
    most = std::max(most, want.numel());
  }
  BOOST_TEST(all.max_numel == most);
  BOOST_TEST(reduced.max_numel == most);
}

// holds_zeros: true exactly when some Partial(sum) mesh dim has a nonzero
// coordinate; the Layout and compact forms agree.
void check_holds_zeros(const Layout& l, const Shape& coord) {
  bool expected = false;
  for (int m = 0; m < l.mesh_ndim(); ++m)
    if (l[m] == Placement(Partial{ReduceOp::Sum}) && coord[m] != 0) expected = true;
  BOOST_TEST(holds_zeros(l, coord) == expected);
  BOOST_TEST(holds_zeros(compact(l), [&](int m) { return coord[m]; }) == expected);
}

// all_reduce_recv_count: a reduce-scatter in which rank i owns segment i of
// the even split (it receives that segment from each of the n-1 others),
// then an all-gather of the other segments: the sum of those receipts.
void check_all_reduce_recv_count(std::int64_t count, std::int64_t n) {
  std::int64_t total = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t want = 0;
    for (std::int64_t p = 0; p < n; ++p)
      if (p != i) want += even_split(count, n, i).size + even_split(count, n, p).size;
    total += even_split(count, n, i).size;
    BOOST_TEST(all_reduce_recv_count(count, n, i) == want, "index " << i);
    BOOST_TEST(all_reduce_recv_count(count, n, i) <= 2 * (n - 1) * ((count + n - 1) / n), "index " << i);
  }
  BOOST_TEST(total == count);
  if (n == 1) BOOST_TEST(all_reduce_recv_count(count, n, 0) == 0);
  BOOST_TEST(reduce_scatter_recv_count(count, n) == (n - 1) * count);
}

// Runs `cases` seeded cases: draw(rng) draws one and returns its description
// and the check to run on it, which runs under that description (with the
// seed and the case number) so that a failure names its case.
template <class Draw>
void over_random_cases(unsigned seed, int cases, Draw&& draw) {
  std::mt19937 rng(seed);
  for (int i = 0; i < cases; ++i) {
    auto [what, check] = draw(rng);
    BOOST_TEST_CONTEXT("seed " << seed << " case " << i << ": " << what) { check(); }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(placement_algebra)

BOOST_AUTO_TEST_CASE(normalize_levels_keeps_order_and_compacts) {
  over_random_cases(kSeed, 2000, [](std::mt19937& rng) {
    const std::size_t n = 1 + rng() % 6;
    std::vector<std::int64_t> dims(n);
    std::vector<int> levels(n);
    for (std::size_t m = 0; m < n; ++m) {
      dims[m] = static_cast<std::int64_t>(rng() % 3) - 1;  // negative dims are still dims
      const unsigned pick = rng() % 4;
      levels[m] = pick == 0 ? -1 : pick == 1 ? kInnermost + static_cast<int>(rng() % 2) : static_cast<int>(rng() % 5);
    }
    return std::pair{fmt::format("dims {} levels {}", dims, levels), [=] { check_normalize_levels(dims, levels); }};
  });
}

BOOST_AUTO_TEST_CASE(layout_levels_use_the_same_normalisation) {
  // Layout::with puts a new shard innermost: its level is the count of the
  // other shards of its tensor dim.
  over_random_cases(kSeed + 1, 500, [](std::mt19937& rng) {
    const int mesh_nd = 1 + rng() % 4, nd = 1 + rng() % 3;
    const Layout l = random_layout(rng, mesh_nd, nd, false);
    const int m = rng() % mesh_nd;
    const std::int64_t d = rng() % nd;
    return std::pair{fmt::format("layout {}, mesh dim {} -> S({})", l, m, d), [=] {
                       const Layout w = l.with(m, Shard{d});
                       BOOST_TEST(w.innermost(d) == m);
                       BOOST_TEST(w.level(m) == static_cast<int>(w.split_order(d).size()) - 1);
                       check_compact_and_key(w, l);
                     }};
  });
}

BOOST_AUTO_TEST_CASE(compact_forms_and_state_keys) {
  over_random_cases(kSeed + 2, 2000, [](std::mt19937& rng) {
    const int mesh_nd = 1 + rng() % 4, nd = 1 + rng() % 3;
    const Layout a = random_layout(rng, mesh_nd, nd, true);
    const Layout b = rng() % 4 ? random_layout(rng, mesh_nd, nd, true) : a;
    return std::pair{fmt::format("{} / {}", a, b), [=] { check_compact_and_key(a, b); }};
  });
}

BOOST_AUTO_TEST_CASE(layout_problem_names_the_first_broken_rule) {
  over_random_cases(kSeed + 3, 2000, [](std::mt19937& rng) {
    const int mesh_nd = 1 + rng() % 3, nd = rng() % 3;
    const Shape mesh = random_mesh(rng, mesh_nd), shape(nd, 4);
    std::vector<Placement> ps;
    const int np = rng() % 5 ? mesh_nd : 1 + rng() % 4;
    for (int m = 0; m < np; ++m) {
      const unsigned pick = rng() % 3;
      if (pick == 0) ps.push_back(Replicate{});
      if (pick == 1) ps.push_back(Shard{static_cast<std::int64_t>(rng() % 7) - 3});
      if (pick == 2) ps.push_back(Partial{static_cast<ReduceOp>(rng() % 2)});
    }
    return std::pair{fmt::format("{} on mesh {}, {} tensor dims", Layout(ps), mesh, nd),
                     [=] { check_layout_problem(ps, mesh, shape); }};
  });
}

BOOST_AUTO_TEST_CASE(rank_boxes_equal_local_boxes) {
  over_random_cases(kSeed + 4, 500, [](std::mt19937& rng) {
    const int mesh_nd = 1 + rng() % 4, nd = 1 + rng() % 3;
    const Shape mesh = random_mesh(rng, mesh_nd);
    Shape shape(nd);
    for (auto& s : shape) s = rng() % 9;
    const Layout l = random_layout(rng, mesh_nd, nd, true);
    return std::pair{fmt::format("mesh {} shape {} layout {}", mesh, shape, l),
                     [=] { check_rank_boxes(mesh, shape, l); }};
  });
}

BOOST_AUTO_TEST_CASE(zeros_sit_off_coordinate_zero_of_partial_sum) {
  over_random_cases(kSeed + 5, 1000, [](std::mt19937& rng) {
    const int mesh_nd = 1 + rng() % 4;
    const Shape mesh = random_mesh(rng, mesh_nd);
    const Layout l = random_layout(rng, mesh_nd, 2, true);
    const Shape coord = unravel_index(static_cast<std::int64_t>(rng() % numel(mesh)), mesh);
    return std::pair{fmt::format("layout {} coord {}", l, coord), [=] { check_holds_zeros(l, coord); }};
  });
}

BOOST_AUTO_TEST_CASE(all_reduce_receipts) {
  over_random_cases(kSeed + 6, 500, [](std::mt19937& rng) {
    const std::int64_t n = 1 + rng() % 9, count = rng() % 3 ? rng() % 40 : rng() % 100000;
    return std::pair{fmt::format("count {} over {} ranks", count, n), [=] { check_all_reduce_recv_count(count, n); }};
  });
}

BOOST_AUTO_TEST_CASE(layouts_from_placement_values) {
  using namespace dtensor::shorthand;
  BOOST_TEST((Layout{S(0), R} == Layout::parse("S(0),R")));
  BOOST_TEST((Layout{Shard{0}, Replicate{}} == Layout::parse("S(0),R")));
  BOOST_TEST((Layout{R, P(), S(-1)} == Layout::parse("R,P(sum),S(-1)")));
  BOOST_TEST((Layout{P(ReduceOp::Max), S(1), S(1)} == Layout::parse("P(max),S(1),S(1)")));
  static_assert(S(2).dim == 2 && P(ReduceOp::Avg).op == ReduceOp::Avg);
  // A nesting order other than left to right takes the split order.
  const std::vector<std::pair<std::int64_t, std::vector<int>>> order{{0, {1, 0}}};
  BOOST_TEST((Layout({S(0), S(0)}, order) == Layout::parse("S(0)[1],S(0)[0]")));
}

BOOST_AUTO_TEST_SUITE_END()
