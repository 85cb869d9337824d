#include "dtensor/redistribute/detail/compact_layout.h"

namespace dtensor {

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
