#include "dtensor/core/layout_rules.h"

#include <algorithm>

#include <fmt/ranges.h>

#include "dtensor/core/inline_vector.h"

namespace dtensor {

void normalize_levels(std::span<const std::int64_t> shard_dim, std::span<int> level) {
  const std::size_t n = level.size();
  // At most a few mesh dims: rank each shard among those of its tensor dim.
  InlineVector<int, 16> ranked(n);
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

}  // namespace dtensor
