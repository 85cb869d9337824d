// Closed-form prices for the redistributions that propagation asks about
// most: the ones the planner answers with a local copy or with one
// collective on one mesh dim. Each rule below returns exactly the
// est_seconds that plan_redistribute would return (same formulas, same order
// of floating-point operations), and applies only where an argument shows
// that no other plan can win; everything else goes to the planner.
// tests/test_planner.cpp checks the agreement over random moves.
#include <algorithm>
#include <array>
#include <optional>

#include "dtensor/redistribute/planner.h"
#include "objective.h"
#include "rank_boxes.h"

namespace dtensor {
namespace {

constexpr int kMaxMeshDims = 4;   // as DeviceMesh and the planner
constexpr int kMaxRanks = 256;    // the exchange rule is quadratic in ranks

// Per-rank boxes of one layout, in scratch that is reused between calls.
using Boxes = rank_boxes::RankBoxes;
using rank_boxes::inter_numel;

struct Scratch {
  Boxes from, to;
  // What `from` and `coords` were computed for: propagation asks about one
  // source layout with many targets in a row.
  Shape mesh, shape;
  Layout from_layout;
  bool from_valid = false;
  std::vector<int> leader;   // per rank: first rank with the same non-empty source box, or -1
  std::vector<int> leaders;  // those ranks, ascending
  std::vector<std::int64_t> coords;  // ranks*mesh_ndim
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

void fill_boxes(Boxes& b, const Layout& l, std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape,
                const std::vector<std::int64_t>& coords, int ranks);

// Rank coordinates for `mesh`, and the source boxes for `from`, unless the
// scratch already holds them.
void prepare(Scratch& s, std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape,
             const Layout& from, bool source_boxes) {
  const int M = static_cast<int>(mesh.size());
  std::int64_t ranks = 1;
  for (auto n : mesh) ranks *= n;
  if (!std::equal(mesh.begin(), mesh.end(), s.mesh.begin(), s.mesh.end())) {
    s.mesh.assign(mesh.begin(), mesh.end());
    s.from_valid = false;
    s.coords.resize(static_cast<std::size_t>(ranks) * M);
    for (int r = 0, left; r < ranks; ++r) {
      left = r;
      for (int m = M - 1; m >= 0; --m) {
        s.coords[static_cast<std::size_t>(r) * M + m] = left % mesh[m];
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

// Shard dim of mesh dim m resolved against nd tensor dims; -1 if m does not shard.
std::int64_t shard_dim(const Layout& l, int m, int nd) {
  const auto* s = std::get_if<Shard>(&l[m]);
  if (!s) return -1;
  return s->dim < 0 ? s->dim + nd : s->dim;
}

void fill_boxes(Boxes& b, const Layout& l, std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape,
                const std::vector<std::int64_t>& coords, int ranks) {
  const int nd = static_cast<int>(shape.size()), M = static_cast<int>(mesh.size());
  // Mesh dims in nesting order: every tensor dim's outermost split first.
  std::array<std::pair<int, int>, kMaxMeshDims> splits{};
  int no = 0;
  for (int lv = 0; lv < M; ++lv)
    for (int m = 0; m < M; ++m)
      if (l.level(m) == lv) splits[no++] = {m, static_cast<int>(shard_dim(l, m, nd))};
  rank_boxes::fill(b, shape, ranks, std::span(splits.data(), no), mesh,
                   [&](int r, int m) { return coords[static_cast<std::size_t>(r) * M + m]; });
}

// The planner's exchange sources (rank_boxes::fill_leaders).
void fill_leaders(Scratch& s, int ranks, int nd) { rank_boxes::fill_leaders(s.from, ranks, nd, s.leader, s.leaders); }

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

}  // namespace

std::optional<double> closed_form_seconds(std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape,
                                          DType dtype, const Layout& from, const Layout& to, const CostModel& cost) {
  const int M = static_cast<int>(mesh.size()), nd = static_cast<int>(shape.size());
  if (M < 1 || M > kMaxMeshDims || from.mesh_ndim() != M || to.mesh_ndim() != M) return std::nullopt;
  if (!(cost.base_latency_s > 0) || !(cost.local_copy_Bps > 0)) return std::nullopt;
  std::int64_t ranks = 1;
  for (auto n : mesh) {
    if (n < 1) return std::nullopt;
    ranks *= n;
  }
  for (auto s : shape)
    if (s < 0) return std::nullopt;
  if (ranks > kMaxRanks) return std::nullopt;
  // Shapes of both layouts the planner would accept; mixed Partial ops are left to it.
  const Partial* partial = nullptr;
  for (const Layout* l : {&from, &to})
    for (int m = 0; m < M; ++m) {
      // Negative dims are left to the planner, which resolves them.
      if (const auto* sh = std::get_if<Shard>(&(*l)[m]); sh && (sh->dim < 0 || sh->dim >= nd)) return std::nullopt;
      if (const auto* q = std::get_if<Partial>(&(*l)[m])) {
        if (partial && partial->op != q->op) return std::nullopt;
        partial = q;
      }
    }
  if (from == to) return 0.0;
  // The planner relabels moves on size-1 mesh dims for free; leave those to it.
  int differ = -1, ndiffer = 0;
  for (int m = 0; m < M; ++m) {
    if (same_on(from, to, m, nd)) continue;
    if (mesh[m] == 1) return std::nullopt;
    differ = m;
    ++ndiffer;
  }
  const auto isz = static_cast<std::int64_t>(itemsize(dtype));
  Scratch& s = scratch();
  prepare(s, mesh, shape, from, false);
  const int R = static_cast<int>(ranks);
  fill_boxes(s.to, to, mesh, shape, s.coords, R);

  if (to.has_partial()) {
    // Replicate to Partial on one mesh dim, everything else kept, from a
    // source without Partial: the planner's local zero-fill (sum: the
    // source's largest shard at copy speed) or relabel (avg, max, min: free).
    // Every other plan needs a collective, which costs at least the base latency.
    if (ndiffer != 1 || from.has_partial() || !is_replicate(from[differ]) || !is_partial(to[differ]))
      return std::nullopt;
    if (partial->op != ReduceOp::Sum) return 0.0;
    // The Partial dim does not split: the target's boxes are the source's.
    const double t = static_cast<double>(s.to.max_numel * isz) / cost.local_copy_Bps;
    if (!(t < cost.base_latency_s)) return std::nullopt;
    return t;
  }

  if (from.has_partial()) {
    // One Partial mesh dim reduced to Replicate with everything else kept:
    // the planner's all_reduce. Any plan of two or more collectives costs at
    // least two base latencies, and no other single collective removes the
    // Partial without a gather after it, so the all_reduce wins when it costs
    // less than that.
    if (ndiffer != 1 || !is_replicate(to[differ])) return std::nullopt;
    int npartial = 0;
    for (int m = 0; m < M; ++m) npartial += is_partial(from[m]);
    if (npartial != 1 || !is_partial(from[differ])) return std::nullopt;
    if (partial->op == ReduceOp::Avg && !is_floating(dtype)) return std::nullopt;  // the planner's integer-avg rule
    // Without elements a reduce_scatter followed by a free local copy wins.
    if (numel(shape) == 0) return std::nullopt;
    // Where the planner ranks by bytes, splitting over a replicated mesh dim
    // before reducing can receive less than the all_reduce.
    double fastest = 0;
    for (int o = 0; o < M; ++o)
      if (mesh[o] > 1) fastest = std::max(fastest, cost.link(o).bandwidth_Bps);
    if (planner::bandwidth_dominates(numel(shape) * isz, fastest, cost)) return std::nullopt;
    const int m = differ;
    const std::int64_t n = mesh[m];
    std::int64_t busiest = 0;
    for (int r = 0; r < R; ++r) {
      // The source box equals the target box: the Partial dim does not split.
      const std::int64_t count = s.to.numel[r];
      const std::int64_t seg = even_split(count, n, s.coords[static_cast<std::size_t>(r) * M + m]).size;
      busiest = std::max(busiest, ((n - 1) * seg + (count - seg)) * isz);
    }
    const std::array<int, 1> dims{m};
    const double t = cost.collective_seconds(dims, 2 * (n - 1), busiest);
    if (!(t < 2 * cost.base_latency_s)) return std::nullopt;
    return t;
  }

  prepare(s, mesh, shape, from, true);
  std::int64_t most_lacking = 0;
  for (int r = 0; r < R; ++r)
    most_lacking = std::max(most_lacking, s.to.numel[r] - inter_numel(s.from, r, s.to, r, nd));

  if (most_lacking == 0) {
    // Every rank already holds its new region: the planner's local copy (a
    // slice, or its exchange without remote blocks) costs the largest new
    // shard at copy speed. Any other plan needs a collective, which costs at
    // least the base latency.
    const double t = static_cast<double>(s.to.max_numel * isz) / cost.local_copy_Bps;
    if (!(t < cost.base_latency_s)) return std::nullopt;
    return t;
  }

  // One mesh dim m changes by a step the planner takes directly: all_gather
  // of m's split (m innermost of its tensor dim) or all_to_all moving it to
  // another tensor dim (innermost there). Both receive exactly what each
  // rank lacks, the least any plan can, so the planner takes the cheaper of
  // that collective and its direct exchange, unless two collectives could
  // be faster still.
  if (ndiffer != 1) return std::nullopt;
  const int m = differ;
  if (!is_shard(from[m]) || !innermost(from, m, nd)) return std::nullopt;
  if (is_shard(to[m])) {
    if (shard_dim(to, m, nd) == shard_dim(from, m, nd) || !innermost(to, m, nd)) return std::nullopt;
  } else if (!is_replicate(to[m])) {
    return std::nullopt;
  }
  const std::int64_t n = mesh[m];
  const LinkParams& link = cost.link(m);
  const std::array<int, 1> dims{m};
  const double collective = cost.collective_seconds(dims, n - 1, most_lacking * isz);

  // The direct exchange, as the planner prices it. Every remote block must
  // come from a rank that differs from the receiver on m alone, so that its
  // best holder is reached over m's link.
  fill_leaders(s, R, nd);
  std::int64_t step = 1;  // rank stride of mesh dim m
  for (int o = M - 1; o > m; --o) step *= mesh[o];
  int max_peers = 0;
  double max_bw_time = 0;
  for (int r = 0; r < R; ++r) {
    if (s.to.numel[r] == 0) continue;
    const int own = s.leader[r];
    int peers = 0;
    double bw_time = 0;
    for (int l : s.leaders) {
      const std::int64_t k = inter_numel(s.from, l, s.to, r, nd);
      if (k == 0 || l == own) continue;
      // The rank with r's coordinates except l's on m.
      const std::int64_t h = r + (s.coords[static_cast<std::size_t>(l) * M + m] -
                                  s.coords[static_cast<std::size_t>(r) * M + m]) * step;
      if (s.leader[h] != l) return std::nullopt;
      bw_time += static_cast<double>(k * isz) / link.bandwidth_Bps;
      ++peers;
    }
    max_peers = std::max(max_peers, peers);
    max_bw_time = std::max(max_bw_time, bw_time);
  }
  const double exchange = cost.base_latency_s + max_peers * link.hop_latency_s + max_bw_time;
  const double best = std::min(collective, exchange);

  // Two communicating steps cost at least two base latencies plus the
  // least bytes over the fastest link; keep a margin for rounding.
  double fastest = 0;
  for (int o = 0; o < M; ++o)
    if (mesh[o] > 1) fastest = std::max(fastest, cost.link(o).bandwidth_Bps);
  const double two_steps = 2 * cost.base_latency_s + static_cast<double>(most_lacking * isz) / fastest;
  if (!(two_steps > best * (1 + 1e-9))) return std::nullopt;
  return best;
}

double redistribute_lower_bound_seconds(std::span<const std::int64_t> mesh, std::span<const std::int64_t> shape,
                                        DType dtype, const Layout& from, const Layout& to, const CostModel& cost) {
  const int M = static_cast<int>(mesh.size()), nd = static_cast<int>(shape.size());
  if (from == to || M < 1 || M > kMaxMeshDims || from.mesh_ndim() != M || to.mesh_ndim() != M) return 0;
  if (!(cost.base_latency_s > 0)) return 0;
  std::int64_t ranks = 1;
  for (auto n : mesh) {
    if (n < 1) return 0;
    ranks *= n;
  }
  for (auto x : shape)
    if (x < 0) return 0;
  if (ranks > kMaxRanks) return 0;
  for (const Layout* l : {&from, &to})
    for (int m = 0; m < M; ++m)
      if (const auto* sh = std::get_if<Shard>(&(*l)[m]); sh && (sh->dim < 0 || sh->dim >= nd)) return 0;
  // Every communicating step costs at least the base latency plus what its
  // busiest rank receives over the fastest link; slack for rounding.
  constexpr double kSlack = 1 - 1e-9;
  if (from.has_partial()) {
    // A Partial mesh dim that does not stay the same Partial must be reduced.
    for (int m = 0; m < M; ++m)
      if (mesh[m] > 1 && is_partial(from[m]) && !(to[m] == from[m])) return cost.base_latency_s * kSlack;
    return 0;
  }
  Scratch& s = scratch();
  prepare(s, mesh, shape, from, true);
  const int R = static_cast<int>(ranks);
  fill_boxes(s.to, to, mesh, shape, s.coords, R);
  std::int64_t most_lacking = 0;
  for (int r = 0; r < R; ++r) {
    bool needs = true;  // ranks off coordinate 0 of a Partial(sum) hold zeros
    for (int m = 0; m < M; ++m)
      if (const auto* q = std::get_if<Partial>(&to[m]);
          q && q->op == ReduceOp::Sum && s.coords[static_cast<std::size_t>(r) * M + m] != 0)
        needs = false;
    if (needs) most_lacking = std::max(most_lacking, s.to.numel[r] - inter_numel(s.from, r, s.to, r, nd));
  }
  if (most_lacking == 0) return 0;
  double fastest = 0;
  for (int o = 0; o < M; ++o)
    if (mesh[o] > 1) fastest = std::max(fastest, cost.link(o).bandwidth_Bps);
  const auto isz = static_cast<std::int64_t>(itemsize(dtype));
  return (cost.base_latency_s + static_cast<double>(most_lacking * isz) / fastest) * kSlack;
}

double redistribute_seconds(std::span<const std::int64_t> mesh_shape, std::span<const std::int64_t> global_shape,
                            DType dtype, const Layout& from, const Layout& to, const CostModel& cost) {
  if (auto t = closed_form_seconds(mesh_shape, global_shape, dtype, from, to, cost)) return *t;
  PlanRequest request{Shape(mesh_shape.begin(), mesh_shape.end()), Shape(global_shape.begin(), global_shape.end()),
                      dtype, from, to, cost};
  return cached_plan(request).est_seconds;
}

}  // namespace dtensor
