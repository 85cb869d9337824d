// Closed-form prices for the redistributions that propagation asks about
// most: the ones the planner answers with a local copy or with one
// collective on one mesh dim. Each rule below prices its step with the
// search's own one-step cost (planner_search.h: local_step_seconds,
// collective_recv_bytes, collective_step, exchange_seconds), so it returns
// exactly the est_seconds that plan_redistribute would return, and applies
// only where an argument shows that no other plan can win; everything else
// goes to the planner. tests/test_planner.cpp checks the agreement over
// random moves.
#include <algorithm>
#include <array>
#include <optional>

#include "dtensor/redistribute/detail/compact_layout.h"
#include "dtensor/redistribute/planner.h"
#include "objective.h"
#include "dtensor/redistribute/detail/planner_search.h"

namespace dtensor {
namespace {

constexpr int kMaxRanks = 256;  // the exchange rule is quadratic in ranks

// Per-rank boxes of both layouts, in scratch that is reused between calls.
struct Scratch {
  RankBoxes from, to;
  // What `from` and `coords` were computed for: propagation asks about one
  // source layout with many targets in a row.
  Shape mesh, shape;
  Layout from_layout;
  bool from_valid = false;
  // What `to` was computed for: the lower bound often follows a closed
  // form that declined the same move.
  Shape to_shape;
  Layout to_layout;
  bool to_valid = false;
  std::vector<int> leader;           // per rank: first rank with the same non-empty source box, or -1
  std::vector<int> leaders;          // those ranks, ascending
  std::vector<std::int64_t> coords;  // ranks*mesh_ndim
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

void fill_boxes(RankBoxes& b, const Layout& l, std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape,
                const std::vector<std::int64_t>& coords, int ranks);

// Rank coordinates for `mesh`, and the source boxes for `from`, unless the
// scratch already holds them.
void prepare(Scratch& s, std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape, const Layout& from,
             bool source_boxes) {
  const int mesh_ndim = static_cast<int>(mesh.size());
  const std::int64_t ranks = numel(mesh);
  if (!std::equal(mesh.begin(), mesh.end(), s.mesh.begin(), s.mesh.end())) {
    s.mesh.assign(mesh.begin(), mesh.end());
    s.from_valid = false;
    s.to_valid = false;
    s.coords.resize(static_cast<std::size_t>(ranks) * mesh_ndim);
    for (int r = 0, left; r < ranks; ++r) {
      left = r;
      for (int m = mesh_ndim - 1; m >= 0; --m) {
        s.coords[static_cast<std::size_t>(r) * mesh_ndim + m] = left % mesh[m];
        left /= static_cast<int>(mesh[m]);
      }
    }
  }
  if (!source_boxes) return;
  if (s.from_valid && s.from_layout == from && std::equal(shape.begin(), shape.end(), s.shape.begin(), s.shape.end()))
    return;
  s.shape.assign(shape.begin(), shape.end());
  s.from_layout = from;
  fill_boxes(s.from, from, mesh, shape, s.coords, static_cast<int>(ranks));
  s.from_valid = true;
}

// The boxes of `to` in s.to, unless they are there already (after prepare).
void prepare_target(Scratch& s, std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape,
                    const Layout& to, int ranks) {
  if (s.to_valid && s.to_layout == to && std::equal(shape.begin(), shape.end(), s.to_shape.begin(), s.to_shape.end()))
    return;
  s.to_shape.assign(shape.begin(), shape.end());
  s.to_layout = to;
  fill_boxes(s.to, to, mesh, shape, s.coords, ranks);
  s.to_valid = true;
}

// Shard dim of mesh dim m resolved against nd tensor dims; -1 if m does not shard.
std::int64_t shard_dim(const Layout& l, int m, int nd) {
  const auto* s = std::get_if<Shard>(&l[m]);
  if (!s) return -1;
  return s->dim < 0 ? s->dim + nd : s->dim;
}

void fill_boxes(RankBoxes& b, const Layout& l, std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape,
                const std::vector<std::int64_t>& coords, int ranks) {
  const int mesh_ndim = static_cast<int>(mesh.size());
  fill_rank_boxes(b, compact(l), shape, ranks, mesh,
                  [&](int r, int m) { return coords[static_cast<std::size_t>(r) * mesh_ndim + m]; });
}

// The planner's exchange sources.
void fill_leaders(Scratch& s, int ranks, int nd) { dtensor::fill_leaders(s.from, ranks, nd, s.leader, s.leaders); }

// Mesh dim m of `a` and `b` hold the same placement at the same nesting level.
bool same_on(const Layout& a, const Layout& b, int m, int nd) {
  if (a.level(m) != b.level(m)) return false;
  if (is_shard(a[m])) return is_shard(b[m]) && shard_dim(a, m, nd) == shard_dim(b, m, nd);
  return a[m] == b[m];
}

// True if m is the innermost split of its tensor dim in l.
bool innermost(const Layout& l, int m, int nd) {
  const auto d = shard_dim(l, m, nd);
  for (int o = 0; o < l.mesh_ndim(); ++o)
    if (o != m && shard_dim(l, o, nd) == d && l.level(o) > l.level(m)) return false;
  return true;
}

// The request as the prices accept it: meshes and shapes the planner would
// accept, both layouts valid with resolved shard dims (negative ones are left
// to the planner, which resolves them), at most kMaxRanks ranks. Returns the
// rank count, or 0 if the request is left to the planner.
int admissible_ranks(std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape, DType dtype,
                     const Layout& from, const Layout& to) {
  const std::size_t mesh_ndim = mesh.size();
  if (plan_size_problem(mesh, shape, dtype)) return 0;
  const std::int64_t ranks = numel(mesh);
  if (ranks > kMaxRanks) return 0;
  for (const Layout* l : {&from, &to})
    if (layout_problem(l->placements(), mesh_ndim, shape.size()) || has_negative_shard_dim(l->placements())) return 0;
  return static_cast<int>(ranks);
}

// What the closed forms share: the request, its ranks and the scratch.
struct Move {
  std::span<const std::int64_t> mesh, shape;
  const Layout& from;
  const Layout& to;
  const CostModel& cost;
  int mesh_ndim, tensor_ndim, ranks;
  DType dtype;
  std::int64_t itemsize;
  int differ;   // the one mesh dim that changes, if ndiffer == 1
  int ndiffer;  // how many mesh dims change
  Scratch& s;

  std::int64_t coord(int r, int m) const { return s.coords[static_cast<std::size_t>(r) * mesh_ndim + m]; }
};

// Replicate to Partial on one mesh dim, everything else kept, from a source
// without Partial: the planner's local zero-fill (sum: the source's largest
// shard at copy speed) or relabel (avg, max, min: free). Every other plan
// needs a collective, which costs at least the base latency.
std::optional<double> to_partial(const Move& mv, ReduceOp op) {
  if (mv.ndiffer != 1 || mv.from.has_partial() || !is_replicate(mv.from[mv.differ]) || !is_partial(mv.to[mv.differ]))
    return std::nullopt;
  if (op != ReduceOp::Sum) return 0.0;
  // The Partial dim does not split: the target's boxes are the source's.
  const double t = planner::local_step_seconds(mv.s.to.max_numel, mv.itemsize, mv.cost);
  if (!(t < mv.cost.base_latency_s)) return std::nullopt;
  return t;
}

// One Partial mesh dim reduced to Replicate with everything else kept: the
// planner's all_reduce. Any plan of two or more collectives costs at least
// two base latencies, and no other single collective removes the Partial
// without a gather after it, so the all_reduce wins when it costs less than
// that.
std::optional<double> from_partial(const Move& mv, DType dtype, ReduceOp op) {
  if (mv.ndiffer != 1 || !is_replicate(mv.to[mv.differ])) return std::nullopt;
  int npartial = 0;
  for (int m = 0; m < mv.mesh_ndim; ++m) npartial += is_partial(mv.from[m]);
  if (npartial != 1 || !is_partial(mv.from[mv.differ])) return std::nullopt;
  if (op == ReduceOp::Avg && !is_floating(dtype)) return std::nullopt;  // the planner's integer-avg rule
  // Without elements a reduce_scatter followed by a free local copy wins.
  if (numel(mv.shape) == 0) return std::nullopt;
  // Where the planner ranks by bytes, splitting over a replicated mesh dim
  // before reducing can receive less than the all_reduce.
  double fastest = 0;
  for (int o = 0; o < mv.mesh_ndim; ++o)
    if (mv.mesh[o] > 1) fastest = std::max(fastest, mv.cost.link(o).bandwidth_Bps);
  if (planner::bandwidth_dominates(byte_size(mv.shape, static_cast<std::size_t>(mv.itemsize)), fastest, mv.cost))
    return std::nullopt;
  const int m = mv.differ;
  const std::int64_t n = mv.mesh[m];
  std::int64_t busiest = 0;
  for (int r = 0; r < mv.ranks; ++r)
    // The source box equals the target box: the Partial dim does not split.
    busiest = std::max(busiest, planner::collective_recv_bytes(StepKind::AllReduce, n, mv.coord(r, m), mv.s.to, mv.s.to,
                                                               r, mv.tensor_ndim, dtype, op));
  const std::array<int, 1> dims{m};
  const double t = planner::collective_step(StepKind::AllReduce, dims, n, busiest, mv.cost).time;
  if (!(t < 2 * mv.cost.base_latency_s)) return std::nullopt;
  return t;
}

// The direct exchange of a one-mesh-dim move, as the planner prices it.
// Every remote block must come from a rank that differs from the receiver on
// m alone, so that its best holder is reached over m's link; nullopt if not.
std::optional<double> one_dim_exchange(const Move& mv, int m) {
  Scratch& s = mv.s;
  fill_leaders(s, mv.ranks, mv.tensor_ndim);
  const LinkParams& link = mv.cost.link(m);
  std::int64_t step = 1;  // rank stride of mesh dim m
  for (int o = mv.mesh_ndim - 1; o > m; --o) step *= mv.mesh[o];
  int max_peers = 0;
  double max_bw_time = 0;
  for (int r = 0; r < mv.ranks; ++r) {
    if (s.to.numel[r] == 0) continue;
    const int own = s.leader[r];
    int peers = 0;
    double bw_time = 0;
    for (int l : s.leaders) {
      const std::int64_t k = inter_numel(s.from, l, s.to, r, mv.tensor_ndim);
      if (k == 0 || l == own) continue;
      // The rank with r's coordinates except l's on m.
      const std::int64_t h = r + (mv.coord(l, m) - mv.coord(r, m)) * step;
      if (s.leader[h] != l) return std::nullopt;
      bw_time += static_cast<double>(checked_mul(k, mv.itemsize, "bytes of an exchange block")) / link.bandwidth_Bps;
      ++peers;
    }
    max_peers = std::max(max_peers, peers);
    max_bw_time = std::max(max_bw_time, bw_time);
  }
  return planner::exchange_seconds(mv.cost, max_peers, link.hop_latency_s, max_bw_time);
}

// One mesh dim m changes by a step the planner takes directly: all_gather of
// m's split (m innermost of its tensor dim) or all_to_all moving it to
// another tensor dim (innermost there). Both receive exactly what each rank
// lacks, the least any plan can, so the planner takes the cheaper of that
// collective and its direct exchange, unless two collectives could be faster
// still.
std::optional<double> one_dim_move(const Move& mv, std::int64_t most_lacking) {
  if (mv.ndiffer != 1) return std::nullopt;
  const int m = mv.differ, nd = mv.tensor_ndim;
  if (!is_shard(mv.from[m]) || !innermost(mv.from, m, nd)) return std::nullopt;
  StepKind kind = StepKind::AllGather;
  if (is_shard(mv.to[m])) {
    if (shard_dim(mv.to, m, nd) == shard_dim(mv.from, m, nd) || !innermost(mv.to, m, nd)) return std::nullopt;
    kind = StepKind::AllToAll;
  } else if (!is_replicate(mv.to[m])) {
    return std::nullopt;
  }
  const std::int64_t n = mv.mesh[m];
  std::int64_t busiest = 0;
  for (int r = 0; r < mv.ranks; ++r)
    busiest = std::max(busiest, planner::collective_recv_bytes(kind, n, mv.coord(r, m), mv.s.from, mv.s.to, r, nd,
                                                               mv.dtype, ReduceOp::Sum));
  const std::array<int, 1> dims{m};
  const double collective = planner::collective_step(kind, dims, n, busiest, mv.cost).time;
  const auto exchange = one_dim_exchange(mv, m);
  if (!exchange) return std::nullopt;
  const double best = std::min(collective, *exchange);

  // Two communicating steps cost at least two base latencies plus the
  // least bytes over the fastest link; keep a margin for rounding.
  double fastest = 0;
  for (int o = 0; o < mv.mesh_ndim; ++o)
    if (mv.mesh[o] > 1) fastest = std::max(fastest, mv.cost.link(o).bandwidth_Bps);
  const double two_steps = 2 * mv.cost.base_latency_s +
                           static_cast<double>(checked_mul(most_lacking, mv.itemsize, "bytes a rank lacks")) / fastest;
  if (!(two_steps > best * (1 + planner::kRoundingSlack))) return std::nullopt;
  return best;
}

}  // namespace

std::optional<double> closed_form_seconds(std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape,
                                          DType dtype, const Layout& from, const Layout& to, const CostModel& cost) {
  const int mesh_ndim = static_cast<int>(mesh.size()), nd = static_cast<int>(shape.size());
  if (!(cost.base_latency_s > 0) || !(cost.local_copy_Bps > 0)) return std::nullopt;
  const int R = admissible_ranks(mesh, shape, dtype, from, to);
  if (R == 0) return std::nullopt;
  // Mixed Partial ops across the two layouts are left to the planner.
  const Partial* partial = nullptr;
  for (const Layout* l : {&from, &to})
    for (int m = 0; m < mesh_ndim; ++m)
      if (const auto* q = std::get_if<Partial>(&(*l)[m])) {
        if (partial && partial->op != q->op) return std::nullopt;
        partial = q;
      }
  if (from == to) return 0.0;
  // The planner relabels moves on size-1 mesh dims for free; leave those to it.
  int differ = -1, ndiffer = 0;
  for (int m = 0; m < mesh_ndim; ++m) {
    if (same_on(from, to, m, nd)) continue;
    if (mesh[m] == 1) return std::nullopt;
    differ = m;
    ++ndiffer;
  }
  Scratch& s = scratch();
  prepare(s, mesh, shape, from, false);
  prepare_target(s, mesh, shape, to, R);
  const Move mv{mesh,   shape,   from, to, cost, mesh_ndim, nd, R, dtype, static_cast<std::int64_t>(itemsize(dtype)),
                differ, ndiffer, s};

  if (to.has_partial()) return to_partial(mv, partial->op);
  if (from.has_partial()) return from_partial(mv, dtype, partial->op);

  prepare(s, mesh, shape, from, true);
  std::int64_t most_lacking = 0;
  for (int r = 0; r < R; ++r)
    most_lacking = std::max(most_lacking, s.to.numel[r] - inter_numel(s.from, r, s.to, r, nd));
  if (most_lacking == 0) {
    // Every rank already holds its new region: the planner's local copy (a
    // slice, or its exchange without remote blocks) costs the largest new
    // shard at copy speed. Any other plan needs a collective, which costs at
    // least the base latency.
    const double t = planner::local_step_seconds(s.to.max_numel, mv.itemsize, cost);
    if (!(t < cost.base_latency_s)) return std::nullopt;
    return t;
  }
  return one_dim_move(mv, most_lacking);
}

double redistribute_lower_bound_seconds(std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape,
                                        DType dtype, const Layout& from, const Layout& to, const CostModel& cost) {
  const int mesh_ndim = static_cast<int>(mesh.size()), nd = static_cast<int>(shape.size());
  if (from == to || !(cost.base_latency_s > 0)) return 0;
  const int R = admissible_ranks(mesh, shape, dtype, from, to);
  if (R == 0) return 0;
  // Every communicating step costs at least the base latency plus what its
  // busiest rank receives over the fastest link; slack for rounding.
  constexpr double kSlack = 1 - planner::kRoundingSlack;
  if (from.has_partial()) {
    // A Partial mesh dim that does not stay the same Partial must be reduced.
    for (int m = 0; m < mesh_ndim; ++m)
      if (mesh[m] > 1 && is_partial(from[m]) && !(to[m] == from[m])) return cost.base_latency_s * kSlack;
    return 0;
  }
  Scratch& s = scratch();
  prepare(s, mesh, shape, from, true);
  prepare_target(s, mesh, shape, to, R);
  std::int64_t most_lacking = 0;
  for (int r = 0; r < R; ++r)
    if (!holds_zeros(to, std::span(s.coords.data() + static_cast<std::size_t>(r) * mesh_ndim, mesh_ndim)))
      most_lacking = std::max(most_lacking, s.to.numel[r] - inter_numel(s.from, r, s.to, r, nd));
  if (most_lacking == 0) return 0;
  double fastest = 0;
  for (int o = 0; o < mesh_ndim; ++o)
    if (mesh[o] > 1) fastest = std::max(fastest, cost.link(o).bandwidth_Bps);
  const auto isz = static_cast<std::int64_t>(itemsize(dtype));
  return (cost.base_latency_s + static_cast<double>(checked_mul(most_lacking, isz, "bytes a rank lacks")) / fastest) *
         kSlack;
}

std::optional<double> all_reduce_step_seconds(std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape,
                                              DType dtype, const Layout& layout, int mesh_dim, const CostModel& cost) {
  const int mesh_ndim = static_cast<int>(mesh.size()), nd = static_cast<int>(shape.size());
  const int R = admissible_ranks(mesh, shape, dtype, layout, layout);
  if (R == 0 || mesh_dim < 0 || mesh_dim >= mesh_ndim || mesh[mesh_dim] == 1 || numel(shape) == 0) return std::nullopt;
  const auto* q = std::get_if<Partial>(&layout[mesh_dim]);
  if (!q || (q->op == ReduceOp::Avg && !is_floating(dtype))) return std::nullopt;
  Scratch& s = scratch();
  prepare(s, mesh, shape, layout, false);
  prepare_target(s, mesh, shape, layout, R);
  const std::int64_t n = mesh[mesh_dim];
  std::int64_t busiest = 0;
  for (int r = 0; r < R; ++r)
    // The Partial dim does not split: the boxes before and after are the same.
    busiest =
        std::max(busiest, planner::collective_recv_bytes(StepKind::AllReduce, n,
                                                         s.coords[static_cast<std::size_t>(r) * mesh_ndim + mesh_dim],
                                                         s.to, s.to, r, nd, dtype, q->op));
  const std::array<int, 1> dims{mesh_dim};
  return planner::collective_step(StepKind::AllReduce, dims, n, busiest, cost).time;
}

double redistribute_seconds(std::span<const std::int64_t> mesh_shape, std::span<const std::int64_t> global_shape,
                            DType dtype, const Layout& from, const Layout& to, const CostModel& cost) {
  if (auto t = closed_form_seconds(mesh_shape, global_shape, dtype, from, to, cost)) return *t;
  PlanRequest request{Shape(mesh_shape.begin(), mesh_shape.end()),
                      Shape(global_shape.begin(), global_shape.end()),
                      dtype,
                      from,
                      to,
                      cost};
  return cached_plan(request).est_seconds;
}

}  // namespace dtensor
