#pragma once
// The planner's search state: a compact, fixed-size value form of a Layout,
// its state key, and every rank's box of one, with the few rules the search,
// its closed-form prices and the executor share. Each rule is written once
// here; its contract is the comment above it, and tests/test_algebra.cpp
// checks every contract over random cases. Not installed: only
// redistribute/ and the tests read it.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/core/placement.h"
#include "dtensor/core/reduce_op.h"
#include "dtensor/core/shape.h"

#include "dtensor/core/layout_rules.h"

namespace dtensor {

/// One mesh dim's placement: kind, op (Partial only), tensor dim and nesting
/// level (Shard only). Normalised (see normalize_levels), the fields a kind
/// does not use hold their defaults, so == compares placements.
struct CompactPlacement {
  enum Kind : std::int8_t { kRep = 0, kPar = 1, kShard = 2 };
  std::int8_t kind = kRep;
  ReduceOp op = ReduceOp::Sum;
  std::int32_t dim = -1;
  std::int32_t level = -1;
  bool operator==(const CompactPlacement&) const = default;
};

/// A Layout over at most kMaxMeshDims mesh dims, as a value without heap
/// storage: the planner's search state. `ndim` mesh dims are in use; the rest
/// hold default (Replicate) entries. Shard dims are resolved (>= 0).
struct CompactLayout {
  std::array<CompactPlacement, kMaxMeshDims> dims{};
  int ndim = 0;

  CompactPlacement& operator[](int m) { return dims[static_cast<std::size_t>(m)]; }
  const CompactPlacement& operator[](int m) const { return dims[static_cast<std::size_t>(m)]; }
  const CompactPlacement* begin() const { return dims.data(); }
  const CompactPlacement* end() const { return dims.data() + ndim; }
  bool operator==(const CompactLayout&) const = default;
};

/// Normalises `l` in place: levels as normalize_levels; dims >= ndim reset to
/// Replicate; unused fields reset. Post: two normalised compact layouts are
/// == exactly when they place the tensor the same way.
void normalize(CompactLayout& l);

/// The compact form of mesh dims `mesh_dims` of `layout` (at most
/// kMaxMeshDims, in that order), normalised. `layout` must be resolved (no
/// negative shard dims). The planner passes the mesh dims of size > 1: they
/// alone split, so the boxes equal those of the full layout.
CompactLayout compact(const Layout& layout, std::span<const int> mesh_dims);
/// All mesh dims of `layout` (mesh_ndim() <= kMaxMeshDims).
CompactLayout compact(const Layout& layout);

/// The state key of a normalised compact layout: kKeyBitsPerDim bits per
/// mesh dim, mesh dim m at bits [16m, 16m+16). Per mesh dim the code is
///   0                                          Replicate
///   1 + op                                     Partial(op), op < 7
///   kKeyShardBase + dim * kMaxMeshDims + level Shard(dim) at `level`
/// Post: injective on normalised layouts of one ndim with dims < 16382.
inline constexpr int kKeyBitsPerDim = 16;
inline constexpr std::uint64_t kKeyShardBase = 8;
std::uint64_t state_key(const CompactLayout& l);

/// The same for a compact layout, coord(m) giving the rank's coordinate on
/// compact mesh dim m.
template <class CoordFn>
bool holds_zeros(const CompactLayout& layout, CoordFn&& coord) {
  for (int m = 0; m < layout.ndim; ++m)
    if (layout[m].kind == CompactPlacement::kPar && layout[m].op == ReduceOp::Sum && coord(m) != 0) return true;
  return false;
}

/// Every rank's box of one layout, flat: rank r's offset and size along
/// tensor dim d at [r*nd + d].
struct RankBoxes {
  std::vector<std::int64_t> off, sz;  // ranks * nd
  std::vector<std::int64_t> numel;    // ranks
  std::int64_t max_numel = 0;
};

/// The shards of `l` in nesting order, (mesh dim, tensor dim): every tensor
/// dim's outermost split first. Returns how many were written.
int nesting_order(const CompactLayout& l, std::array<std::pair<int, int>, kMaxMeshDims>& out);

/// Fills b with each of `ranks` ranks' box of `l` over a tensor of `shape`,
/// mesh dim m of `l` having mesh[m] ranks and rank r sitting at coord(r, m).
/// Post: rank r's box equals local_box() of the Layout `l` came from at r's
/// coordinates (the boxes tile the tensor once per replica).
template <class CoordFn>
void fill_rank_boxes(RankBoxes& b, const CompactLayout& l, std::span<const std::int64_t> shape, int ranks,
                     std::span<const std::int64_t> mesh, CoordFn&& coord) {
  std::array<std::pair<int, int>, kMaxMeshDims> splits{};
  const int ns = nesting_order(l, splits);
  const int nd = static_cast<int>(shape.size());
  b.off.assign(static_cast<std::size_t>(ranks) * nd, 0);
  b.sz.resize(static_cast<std::size_t>(ranks) * nd);
  b.numel.resize(ranks);
  b.max_numel = 0;
  for (int r = 0; r < ranks; ++r) {
    std::int64_t* o = b.off.data() + static_cast<std::size_t>(r) * nd;
    std::int64_t* z = b.sz.data() + static_cast<std::size_t>(r) * nd;
    std::copy(shape.begin(), shape.end(), z);
    for (int i = 0; i < ns; ++i) {
      const auto [m, d] = splits[i];
      const Chunk c = chunk(z[d], mesh[m], coord(r, m));
      o[d] += c.offset;
      z[d] = c.size;
    }
    const std::int64_t n = numel(std::span<const std::int64_t>(z, static_cast<std::size_t>(nd)));
    b.numel[r] = n;
    b.max_numel = std::max(b.max_numel, n);
  }
}

/// Elements in the intersection of rank a's box in A and rank b's box in B.
inline std::int64_t inter_numel(const RankBoxes& A, int a, const RankBoxes& B, int b, int nd) {
  std::int64_t n = 1;
  const std::size_t ia = static_cast<std::size_t>(a) * nd, ib = static_cast<std::size_t>(b) * nd;
  for (int d = 0; d < nd; ++d) {
    const std::int64_t lo = std::max(A.off[ia + d], B.off[ib + d]);
    const std::int64_t hi = std::min(A.off[ia + d] + A.sz[ia + d], B.off[ib + d] + B.sz[ib + d]);
    if (hi <= lo) return 0;
    n = checked_mul(n, hi - lo, "elements of a box intersection");
  }
  return n;
}

/// True if ranks a and b of A hold the same box.
inline bool same_box(const RankBoxes& A, int a, int b, int nd) {
  const std::size_t ia = static_cast<std::size_t>(a) * nd, ib = static_cast<std::size_t>(b) * nd;
  return std::equal(A.off.begin() + ia, A.off.begin() + ia + nd, A.off.begin() + ib) &&
         std::equal(A.sz.begin() + ia, A.sz.begin() + ia + nd, A.sz.begin() + ib);
}

/// The exchange's sources: per rank the first rank holding the same
/// non-empty box (-1 for an empty box), and those first ranks ascending.
void fill_leaders(const RankBoxes& b, int ranks, int nd, std::vector<int>& leader, std::vector<int>& leaders);

}  // namespace dtensor
