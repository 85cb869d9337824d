#include <algorithm>

#include "dtensor/core/layout_rules.h"
#include "dtensor/core/error.h"
#include "dtensor/ops/op.h"

namespace dtensor {
namespace {

using SplitOrder = std::vector<std::pair<std::int64_t, std::vector<int>>>;

// `candidate` with the nesting order of `input` carried over to every tensor
// of the candidate: each group of mesh dims that splits one tensor dim of
// the input, in the input's order, splits whichever dim the candidate puts
// on those mesh dims of each tensor in the same order (strategies map tensor
// dims mesh dim by mesh dim, so the shards still line up element for
// element). Nullopt where a tensor shards that group inconsistently.
std::optional<Strategy> with_order_of(const Layout& input, const Strategy& candidate, const StrategyQuery& query) {
  std::vector<std::vector<int>> groups;  // mesh dims, outermost first
  for (int m = 0; m < input.mesh_ndim(); ++m) {
    const auto* s = std::get_if<Shard>(&input[m]);
    if (!s || input.level(m) != 0) continue;
    std::vector<int> group = input.split_order(s->dim);
    if (group.size() > 1) groups.push_back(std::move(group));
  }
  auto reorder = [&](const Layout& l, std::span<const std::int64_t> shape) -> std::optional<Layout> {
    SplitOrder order;
    for (const std::vector<int>& group : groups) {
      const auto* first = std::get_if<Shard>(&l[group[0]]);
      const bool all_same = std::all_of(group.begin(), group.end(),
                                        [&](int m) { return first ? is_shard(l[m], first->dim) : !is_shard(l[m]); });
      if (!all_same) return std::nullopt;
      if (first) order.emplace_back(first->dim, group);
    }
    try {
      return validate_layout(Layout(l.placements(), order), query.mesh_shape, shape);
    } catch (const LayoutError&) {  // another mesh dim shards that dim too
      return std::nullopt;
    }
  };
  Strategy out;
  for (std::size_t i = 0; i < candidate.inputs.size(); ++i) {
    auto l = reorder(candidate.inputs[i], query.inputs[i].shape);
    if (!l) return std::nullopt;
    out.inputs.push_back(std::move(*l));
  }
  auto o = reorder(candidate.output, query.output.shape);
  if (!o) return std::nullopt;
  out.output = std::move(*o);
  return out;
}

// What validate_layout accepts unchanged: valid (core's layout_problem) with
// shard dims already resolved. Checked without building a Layout or
// throwing, since most candidates pass and many fail.
bool plainly_valid(const std::vector<Placement>& ps, std::size_t ndim) {
  return !layout_problem(ps, ps.size(), ndim) && !has_negative_shard_dim(ps);
}

// Invalid however negative dims resolve: a shard dim out of range on either
// side, or two kinds of Partial.
bool plainly_invalid(const std::vector<Placement>& outp, std::size_t out_ndim,
                     const std::vector<std::vector<Placement>>& in, const StrategyQuery& query) {
  if (layout_problem(outp, outp.size(), out_ndim)) return true;
  for (std::size_t i = 0; i < in.size(); ++i)
    if (layout_problem(in[i], in[i].size(), query.inputs[i].shape.size())) return true;
  return false;
}

}  // namespace

std::vector<Strategy> expand_to_mesh(std::span<const DimStrategy> per_dim, const StrategyQuery& query) {
  const int mesh_nd = static_cast<int>(query.mesh_shape.size());
  const std::size_t nin = query.inputs.size();
  std::vector<Strategy> out;
  if (per_dim.empty()) return out;
  std::size_t combinations = 1;
  for (int m = 0; m < mesh_nd && combinations <= 4096; ++m) combinations *= per_dim.size();
  out.reserve(std::min<std::size_t>(combinations, 4096));
  // Odometer over one option per mesh dim.
  std::vector<std::size_t> pick(static_cast<std::size_t>(mesh_nd), 0);
  std::vector<std::vector<Placement>> in(nin, std::vector<Placement>(static_cast<std::size_t>(mesh_nd)));
  std::vector<Placement> outp(static_cast<std::size_t>(mesh_nd));
  while (true) {
    for (int m = 0; m < mesh_nd; ++m) {
      const DimStrategy& s = per_dim[pick[m]];
      for (std::size_t i = 0; i < nin; ++i) in[i][m] = s.inputs.at(i);
      outp[m] = s.output;
    }
    bool valid = plainly_valid(outp, query.output.shape.size());
    for (std::size_t i = 0; i < nin && valid; ++i) valid = plainly_valid(in[i], query.inputs[i].shape.size());
    if (valid) {
      Strategy& cand = out.emplace_back();
      cand.inputs.reserve(nin);
      for (std::size_t i = 0; i < nin; ++i) cand.inputs.emplace_back(in[i]);
      cand.output = Layout(outp);
    } else if (!plainly_invalid(outp, query.output.shape.size(), in, query)) {
      // Negative shard dims: let validation resolve them.
      Strategy cand;
      try {
        for (std::size_t i = 0; i < nin; ++i)
          cand.inputs.push_back(validate_layout(Layout(in[i]), query.mesh_shape, query.inputs[i].shape));
        cand.output = validate_layout(Layout(outp), query.mesh_shape, query.output.shape);
        out.push_back(std::move(cand));
      } catch (const LayoutError&) {
      }
    }
    int m = mesh_nd - 1;
    while (m >= 0 && ++pick[m] == per_dim.size()) pick[m--] = 0;
    if (m < 0) break;
  }

  // An input whose shards nest in another order than left to right gets the
  // candidates with its placements in its own order too, so that it can run
  // where it lies instead of being redistributed to the default order.
  const std::size_t defaults = out.size();
  for (std::size_t i = 0; i < nin && i < query.layouts.size(); ++i) {
    const Layout& layout = query.layouts[i];
    if (layout.default_order() || layout.mesh_ndim() != mesh_nd) continue;
    for (std::size_t c = 0; c < defaults; ++c) {
      if (out[c].inputs[i].placements() != layout.placements()) continue;
      std::optional<Strategy> variant = with_order_of(layout, out[c], query);
      if (variant && std::find(out.begin(), out.end(), *variant) == out.end()) out.push_back(std::move(*variant));
    }
  }
  return out;
}

}  // namespace dtensor
