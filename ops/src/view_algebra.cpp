// The view algebra behind every shape op's strategy (see view_algebra.h).
#include "view_algebra.h"

#include <algorithm>
#include <optional>

#include "dtensor/core/error.h"

namespace dtensor::view {

ViewRule reshape_rule(const Shape& a, const Shape& b) {
  ViewRule r;
  const int na = static_cast<int>(a.size()), nb = static_cast<int>(b.size());
  int i = 0, o = 0;
  while (i < na || o < nb) {
    Group g;
    std::int64_t pa = 1, pb = 1;
    if (i < na) pa *= a[i], g.in.push_back(i++);
    if (o < nb) pb *= b[o], g.out.push_back(o++);
    while (pa != pb) {
      if (pa < pb && i < na)
        pa *= a[i], g.in.push_back(i++);
      else if (pb < pa && o < nb)
        pb *= b[o], g.out.push_back(o++);
      else
        break;  // only for zero sizes: any grouping will do, every box is empty
    }
    // Trailing singletons join the group they follow.
    while (i < na && a[i] == 1 && (o >= nb || b[o] != 1)) g.in.push_back(i++);
    while (o < nb && b[o] == 1 && (i >= na || a[i] != 1)) g.out.push_back(o++);
    r.groups.push_back(std::move(g));
  }
  return r;
}

ViewRule identity_rule(int ndim, int skip) {
  ViewRule r;
  for (int d = 0; d < ndim; ++d) r.groups.push_back(Group{{d}, {d}, d != skip});
  return r;
}

ViewRule permute_rule(const std::vector<int>& perm) {
  ViewRule r;
  for (int o = 0; o < static_cast<int>(perm.size()); ++o) r.groups.push_back(Group{{perm[o]}, {o}, true});
  return r;
}

namespace {

/// The elements of `box` restricted to `dims` as a range [start, start+len)
/// of the row-major order of those dims; nullopt if not contiguous.
std::optional<std::pair<std::int64_t, std::int64_t>> flat_range(const Box& box, const Shape& shape,
                                                                const std::vector<int>& dims) {
  const int n = static_cast<int>(dims.size());
  std::int64_t total = 1;
  for (int d : dims) {
    if (box.size[d] == 0) return std::pair<std::int64_t, std::int64_t>{0, 0};
    total *= shape[d];
  }
  int k = n - 1;
  while (k >= 0 && box.offset[dims[k]] == 0 && box.size[dims[k]] == shape[dims[k]]) --k;
  if (k < 0) return std::pair<std::int64_t, std::int64_t>{0, total};
  for (int j = 0; j < k; ++j)
    if (box.size[dims[j]] != 1) return std::nullopt;
  std::int64_t start = 0, stride = 1, len = 0;
  for (int j = n - 1; j >= 0; --j) {
    start += box.offset[dims[j]] * stride;
    if (j == k) len = box.size[dims[j]] * stride;
    stride *= shape[dims[j]];
  }
  return std::pair<std::int64_t, std::int64_t>{start, len};
}

bool whole(const Box& box, const Shape& shape, const std::vector<int>& dims) {
  return std::all_of(dims.begin(), dims.end(), [&](int d) { return box.offset[d] == 0 && box.size[d] == shape[d]; });
}

/// True if, on every rank, the output box is exactly what the rule makes of
/// the input boxes, so the local kernel needs no data from other ranks.
bool boxes_correspond(const ViewRule& rule, const StrategyQuery& q, const Strategy& s) {
  // Boxes vary only along mesh dims that shard something: walk those alone.
  Shape walk = q.mesh_shape;
  for (std::size_t m = 0; m < walk.size(); ++m) {
    bool shards = is_shard(s.output[static_cast<int>(m)]);
    for (const Layout& l : s.inputs) shards = shards || is_shard(l[static_cast<int>(m)]);
    if (!shards) walk[m] = 1;
  }
  const std::int64_t ranks = numel(walk);
  for (std::int64_t r = 0; r < ranks; ++r) {
    const Shape coord = unravel_index(r, walk);
    const Box ob = local_box(q.mesh_shape, q.output.shape, s.output, coord);
    for (std::size_t i = 0; i < q.inputs.size(); ++i) {
      const Box ib = local_box(q.mesh_shape, q.inputs[i].shape, s.inputs[i], coord);
      if (ib.numel() == 0 && ob.numel() == 0) continue;
      for (const Group& g : rule.groups) {
        if (g.flat) {
          auto a = flat_range(ib, q.inputs[i].shape, g.in);
          auto b = flat_range(ob, q.output.shape, g.out);
          if (!a || !b || *a != *b) return false;
        } else if (!whole(ib, q.inputs[i].shape, g.in) || !whole(ob, q.output.shape, g.out)) {
          return false;
        }
      }
    }
  }
  return true;
}

/// The inputs' current layout (when all inputs share one) carried through
/// the rule with its nesting order kept, so that a layout such as
/// S(0)[1],S(0)[0] need not move for a view that can keep it. expand_to_mesh
/// offers the same where the per-dim options hold the input's placements;
/// the caller drops the duplicate.
std::optional<Strategy> follow_current_layout(const ViewRule& rule, const StrategyQuery& q,
                                              const std::vector<DimStrategy>& per_dim) {
  const Layout& cur = q.layouts[0];
  if (cur.default_order()) return std::nullopt;  // expand_to_mesh has it already
  for (const Layout& l : q.layouts)
    if (!(l == cur)) return std::nullopt;
  std::vector<Placement> out;
  for (const Placement& p : cur.placements()) {
    auto it = std::find_if(per_dim.begin(), per_dim.end(), [&](const DimStrategy& s) { return s.inputs[0] == p; });
    if (it == per_dim.end()) return std::nullopt;
    out.push_back(it->output);
  }
  std::vector<std::pair<std::int64_t, std::vector<int>>> order;
  for (int m = 0; m < cur.mesh_ndim(); ++m) {
    if (!is_shard(out[m])) continue;
    const std::int64_t d = std::get<Shard>(out[m]).dim;
    if (std::none_of(order.begin(), order.end(), [&](const auto& o) { return o.first == d; }))
      order.emplace_back(d, cur.split_order(std::get<Shard>(cur[m]).dim));
  }
  try {
    Strategy s;
    for (std::size_t i = 0; i < q.inputs.size(); ++i) s.inputs.push_back(cur);
    s.output = validate_layout(Layout(out, order), q.mesh_shape, q.output.shape);
    return s;
  } catch (const LayoutError&) {
    return std::nullopt;
  }
}

/// Tells explain mode, on each candidate that drops a shard of the input's
/// current layout, that the shard cannot ride through this view.
void note_lost_shards(const StrategyQuery& q, std::vector<Strategy>& cands) {
  const Layout& cur = q.layouts[0];
  std::vector<std::string> lost;
  for (Strategy& s : cands) {
    lost.clear();
    for (int m = 0; m < cur.mesh_ndim(); ++m)
      if (is_shard(cur[m]) && !(s.inputs[0][m] == cur[m])) lost.push_back(to_string(cur[m]));
    if (lost.empty()) continue;
    s.note = fmt::format("{} {} not survive [{}]->[{}], redistributing to {} first", fmt::join(lost, ","),
                         lost.size() == 1 ? "does" : "do", fmt::join(q.inputs[0].shape, ","),
                         fmt::join(q.output.shape, ","), s.inputs[0]);
  }
}

}  // namespace

std::vector<Strategy> view_strategies(const ViewRule& rule, const StrategyQuery& q) {
  const std::size_t nin = q.inputs.size();
  std::vector<DimStrategy> per_dim{{std::vector<Placement>(nin, Replicate{}), Replicate{}}};
  const Shape& in0 = q.inputs[0].shape;
  for (const Group& g : rule.groups) {
    if (!g.flat) continue;
    auto lead = [](const std::vector<int>& dims, const Shape& shape) {
      for (int d : dims)
        if (shape[d] != 1) return d;
      return -1;
    };
    int i = lead(g.in, in0), o = lead(g.out, q.output.shape);
    if (i < 0 || o < 0) continue;
    per_dim.push_back({std::vector<Placement>(nin, Shard{i}), Shard{o}});
  }
  if (rule.linear) {
    std::vector<ReduceOp> ops{ReduceOp::Sum};
    for (const Layout& l : q.layouts)
      for (const Placement& p : l.placements())
        if (is_partial(p) && std::find(ops.begin(), ops.end(), std::get<Partial>(p).op) == ops.end())
          ops.push_back(std::get<Partial>(p).op);
    for (ReduceOp op : ops) per_dim.push_back({std::vector<Placement>(nin, Partial{op}), Partial{op}});
  }
  std::vector<Strategy> all = expand_to_mesh(per_dim, q);
  if (auto own = follow_current_layout(rule, q, per_dim); own && std::find(all.begin(), all.end(), *own) == all.end())
    all.push_back(std::move(*own));
  // Partial only passes through: a mesh dim where no input is Partial gets
  // no Partial candidate (turning a shard into a Partial is cheap but leaves
  // the caller a reduction to pay).
  auto partial_passes = [&](const Strategy& s) {
    for (int m = 0; m < s.output.mesh_ndim(); ++m) {
      if (!is_partial(s.output[m])) continue;
      bool any = false;
      for (const Layout& l : q.layouts) any = any || l[m] == s.output[m];
      if (!any) return false;
    }
    return true;
  };
  std::vector<Strategy> out;
  for (auto& s : all)
    if (partial_passes(s) && boxes_correspond(rule, q, s)) out.push_back(std::move(s));
  if (nin == 1) note_lost_shards(q, out);
  return out;
}

}  // namespace dtensor::view
