#include "dtensor/core/compact_layout.h"

#include <fmt/ranges.h>

namespace dtensor {

void normalize_levels(std::span<const std::int64_t> shard_dim, std::span<int> level) {
  const std::size_t n = level.size();
  // At most a few mesh dims: rank each shard among those of its tensor dim.
  std::array<int, 16> small{};
  std::vector<int> large;
  int* ranked = small.data();
  if (n > small.size()) {
    large.resize(n);
    ranked = large.data();
  }
  for (std::size_t m = 0; m < n; ++m) {
    if (level[m] < 0) continue;
    int rank = 0;
    for (std::size_t o = 0; o < n; ++o)
      if (o != m && level[o] >= 0 && shard_dim[o] == shard_dim[m] &&
          (level[o] < level[m] || (level[o] == level[m] && o < m)))
        ++rank;
    ranked[m] = rank;
  }
  for (std::size_t m = 0; m < n; ++m)
    if (level[m] >= 0) level[m] = ranked[m];
}

void normalize(CompactLayout& l) {
  std::array<std::int64_t, kMaxMeshDims> dims{};
  std::array<int, kMaxMeshDims> levels{};
  for (int m = 0; m < l.ndim; ++m) {
    const bool shard = l[m].kind == CompactPlacement::kShard;
    dims[m] = shard ? l[m].dim : -1;
    levels[m] = shard ? std::max<std::int32_t>(l[m].level, 0) : -1;
  }
  normalize_levels(std::span(dims.data(), l.ndim), std::span(levels.data(), l.ndim));
  for (int m = 0; m < kMaxMeshDims; ++m) {
    CompactPlacement& p = l[m];
    if (m >= l.ndim) {
      p = CompactPlacement{};
    } else if (p.kind == CompactPlacement::kShard) {
      p.level = levels[m];
      p.op = ReduceOp::Sum;
    } else {
      p.dim = -1;
      p.level = -1;
      if (p.kind == CompactPlacement::kRep) p.op = ReduceOp::Sum;
    }
  }
}

CompactLayout compact(const Layout& layout, std::span<const int> mesh_dims) {
  CompactLayout c;
  c.ndim = static_cast<int>(mesh_dims.size());
  for (int i = 0; i < c.ndim; ++i) {
    const int m = mesh_dims[i];
    const Placement& p = layout[m];
    if (const auto* s = std::get_if<Shard>(&p))
      c[i] =
          CompactPlacement{CompactPlacement::kShard, ReduceOp::Sum, static_cast<std::int32_t>(s->dim), layout.level(m)};
    if (const auto* q = std::get_if<Partial>(&p)) c[i] = CompactPlacement{CompactPlacement::kPar, q->op, -1, -1};
  }
  normalize(c);
  return c;
}

CompactLayout compact(const Layout& layout) {
  std::array<int, kMaxMeshDims> all{};
  for (int m = 0; m < layout.mesh_ndim(); ++m) all[m] = m;
  return compact(layout, std::span(all.data(), layout.mesh_ndim()));
}

std::uint64_t state_key(const CompactLayout& l) {
  std::uint64_t key = 0;
  for (int m = 0; m < l.ndim; ++m) {
    std::uint64_t code = 0;
    if (l[m].kind == CompactPlacement::kPar) code = 1 + static_cast<std::uint64_t>(l[m].op);
    if (l[m].kind == CompactPlacement::kShard)
      code =
          kKeyShardBase + static_cast<std::uint64_t>(l[m].dim) * kMaxMeshDims + static_cast<std::uint64_t>(l[m].level);
    key |= code << (kKeyBitsPerDim * m);
  }
  return key;
}

std::optional<LayoutProblem> layout_problem(std::span<const Placement> placements, std::size_t mesh_ndim,
                                            std::size_t tensor_ndim) {
  using Kind = LayoutProblem::Kind;
  if (placements.size() != mesh_ndim)
    return LayoutProblem{.kind = Kind::MeshDims,
                         .count = static_cast<std::int64_t>(placements.size()),
                         .expected = static_cast<std::int64_t>(mesh_ndim)};
  const auto nd = static_cast<std::int64_t>(tensor_ndim);
  for (std::size_t m = 0; m < placements.size(); ++m)
    if (const auto* s = std::get_if<Shard>(&placements[m]); s && (s->dim < -nd || s->dim >= nd))
      return LayoutProblem{.kind = Kind::ShardDim, .mesh_dim = static_cast<int>(m), .count = s->dim, .expected = nd};
  const Partial* first = nullptr;
  for (std::size_t m = 0; m < placements.size(); ++m)
    if (const auto* q = std::get_if<Partial>(&placements[m])) {
      if (first && first->op != q->op)
        return LayoutProblem{.kind = Kind::MixedPartial,
                             .mesh_dim = static_cast<int>(m),
                             .first_op = first->op,
                             .second_op = q->op};
      first = q;
    }
  return std::nullopt;
}

std::string describe(const LayoutProblem& problem, const Layout& layout, std::span<const std::int64_t> mesh_shape) {
  switch (problem.kind) {
    case LayoutProblem::Kind::MeshDims:
      return fmt::format("{} has {} placements for a mesh of {} dims ({}): expected one per mesh dim", layout,
                         problem.count, problem.expected, fmt::join(mesh_shape, "x"));
    case LayoutProblem::Kind::ShardDim:
      return fmt::format("Shard({}) on mesh dim {}: the tensor has {} dims", problem.count, problem.mesh_dim,
                         problem.expected);
    case LayoutProblem::Kind::MixedPartial:
      return fmt::format("{} mixes P({}) and P({}): one layout may hold one kind of Partial", layout, problem.first_op,
                         problem.second_op);
  }
  return {};
}

bool has_negative_shard_dim(std::span<const Placement> placements) {
  return std::any_of(placements.begin(), placements.end(), [](const Placement& p) {
    const auto* s = std::get_if<Shard>(&p);
    return s && s->dim < 0;
  });
}

bool holds_zeros(const Layout& layout, std::span<const std::int64_t> coord) {
  for (int m = 0; m < layout.mesh_ndim(); ++m)
    if (const auto* q = std::get_if<Partial>(&layout[m]); q && q->op == ReduceOp::Sum && coord[m] != 0) return true;
  return false;
}

int nesting_order(const CompactLayout& l, std::array<std::pair<int, int>, kMaxMeshDims>& out) {
  int n = 0;
  for (int lv = 0; lv < l.ndim; ++lv)
    for (int m = 0; m < l.ndim; ++m)
      if (l[m].kind == CompactPlacement::kShard && l[m].level == lv) out[n++] = {m, l[m].dim};
  return n;
}

void fill_leaders(const RankBoxes& b, int ranks, int nd, std::vector<int>& leader, std::vector<int>& leaders) {
  leader.assign(ranks, -1);
  leaders.clear();
  for (int r = 0; r < ranks; ++r) {
    if (b.numel[r] == 0) continue;
    for (int l : leaders)
      if (same_box(b, r, l, nd)) {
        leader[r] = l;
        break;
      }
    if (leader[r] < 0) {
      leader[r] = r;
      leaders.push_back(r);
    }
  }
}

}  // namespace dtensor
