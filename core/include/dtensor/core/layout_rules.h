#pragma once
// The layout rules everything above core leans on, each written once: the
// nesting normalisation of shard levels, a layout's validity for a mesh and a
// tensor, and which ranks of a Partial(sum) hold zeros. Their contracts are
// the comments above them; tests/test_algebra.cpp checks each over random
// cases. The planner's compact search state built on them lives in
// redistribute/ (dtensor/redistribute/detail/compact_layout.h).
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "dtensor/core/placement.h"
#include "dtensor/core/reduce_op.h"
#include "dtensor/core/shape.h"

namespace dtensor {

/// The most mesh dims a DeviceMesh (and so a plan) has.
inline constexpr int kMaxMeshDims = 4;

/// A nesting level that sorts after every real one: a shard given this level
/// becomes the innermost split of its tensor dim once levels are normalised.
/// Several shards given it nest among themselves in mesh-dim order.
inline constexpr std::int32_t kInnermost = 1 << 20;

/// Nesting normalisation, shared by Layout and CompactLayout. Entries with
/// level[m] < 0 do not shard and are left alone. For every tensor dim d, the
/// mesh dims m with shard_dim[m] == d and level[m] >= 0 get the levels
/// 0..c-1 in the order of their old levels, ties broken by lower mesh dim
/// first (so kInnermost places a new shard innermost).
/// Post: the relative order of levels within each tensor dim is kept, and
/// each tensor dim's levels are exactly 0..c-1.
void normalize_levels(std::span<const std::int64_t> shard_dim, std::span<int> level);

/// What is wrong with a layout for a mesh and a tensor, as a value.
struct LayoutProblem {
  enum class Kind : std::int8_t {
    MeshDims,      // placements != mesh dims: `count` placements, `expected` mesh dims
    ShardDim,      // Shard(`count`) on `mesh_dim` outside [-expected, expected) for `expected` tensor dims
    MixedPartial,  // `first_op` on an earlier mesh dim and `second_op` on `mesh_dim`
  };
  Kind kind = Kind::MeshDims;
  int mesh_dim = -1;
  std::int64_t count = 0;
  std::int64_t expected = 0;
  ReduceOp first_op = ReduceOp::Sum;
  ReduceOp second_op = ReduceOp::Sum;
};

/// Is `placements` valid for a mesh of `mesh_ndim` dims and a tensor of
/// `tensor_ndim` dims: one placement per mesh dim, then every shard dim in
/// [-tensor_ndim, tensor_ndim) (negative counts from the end), then at most
/// one kind of Partial op. Returns the first problem in that order, or
/// nullopt. Allocates nothing, so hot paths may call it on every candidate.
std::optional<LayoutProblem> layout_problem(std::span<const Placement> placements, std::size_t mesh_ndim,
                                            std::size_t tensor_ndim);
/// The problem in words, naming the layout, without a "[where]" prefix:
/// callers add their own.
std::string describe(const LayoutProblem& problem, const Layout& layout, std::span<const std::int64_t> mesh_shape);

/// True if some shard dim is negative (valid, but not yet resolved).
bool has_negative_shard_dim(std::span<const Placement> placements);

/// A Partial(sum) is held as one addend per rank; redistribution keeps the
/// addend on coordinate 0 of each Partial(sum) mesh dim and zeros elsewhere.
/// True if the rank at `coord` holds zeros: it is off coordinate 0 of some
/// Partial(sum) mesh dim. Such a rank needs no data of the target.
bool holds_zeros(const Layout& layout, std::span<const std::int64_t> coord);

}  // namespace dtensor
