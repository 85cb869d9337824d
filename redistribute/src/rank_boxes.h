#pragma once
// Internal to redistribute/: every rank's box of one layout, flat, and the
// box arithmetic the planner's search (planner_search.cpp) and the
// closed-form prices (price.cpp) both run on. One copy, so that the prices
// cannot drift from the plans they must equal.
#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "dtensor/core/shape.h"

namespace dtensor::rank_boxes {

struct RankBoxes {
  std::vector<std::int64_t> off, sz;  // ranks * nd
  std::vector<std::int64_t> numel;    // ranks
  std::int64_t max_numel = 0;
};

/// Fills b for `ranks` ranks of a tensor of `shape`: each rank starts with
/// the whole tensor and splits it along `splits`, (mesh dim, tensor dim)
/// pairs in nesting order (outermost first), taking chunk coord(r, m) of
/// mesh[m] parts.
template <class CoordFn>
void fill(RankBoxes& b, std::span<const std::int64_t> shape, int ranks, std::span<const std::pair<int, int>> splits,
          std::span<const std::int64_t> mesh, CoordFn&& coord) {
  const int nd = static_cast<int>(shape.size());
  b.off.assign(static_cast<std::size_t>(ranks) * nd, 0);
  b.sz.resize(static_cast<std::size_t>(ranks) * nd);
  b.numel.resize(ranks);
  b.max_numel = 0;
  for (int r = 0; r < ranks; ++r) {
    std::int64_t* o = b.off.data() + static_cast<std::size_t>(r) * nd;
    std::int64_t* z = b.sz.data() + static_cast<std::size_t>(r) * nd;
    std::copy(shape.begin(), shape.end(), z);
    for (const auto& [m, d] : splits) {
      const Chunk c = chunk(z[d], mesh[m], coord(r, m));
      o[d] += c.offset;
      z[d] = c.size;
    }
    std::int64_t n = 1;
    for (int d = 0; d < nd; ++d) n *= z[d];
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
    n *= hi - lo;
  }
  return n;
}

inline bool same_box(const RankBoxes& A, int a, int b, int nd) {
  const std::size_t ia = static_cast<std::size_t>(a) * nd, ib = static_cast<std::size_t>(b) * nd;
  return std::equal(A.off.begin() + ia, A.off.begin() + ia + nd, A.off.begin() + ib) &&
         std::equal(A.sz.begin() + ia, A.sz.begin() + ia + nd, A.sz.begin() + ib);
}

/// The exchange's sources: per rank the first rank holding the same
/// non-empty box (-1 for an empty box), and those first ranks ascending.
inline void fill_leaders(const RankBoxes& b, int ranks, int nd, std::vector<int>& leader, std::vector<int>& leaders) {
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

}  // namespace dtensor::rank_boxes
