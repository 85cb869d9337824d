#pragma once
// Placements: how a tensor lies along one mesh dimension, and Layout: the
// placements for every mesh dimension together with the order in which
// several mesh dimensions split the same tensor dimension.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/reduce_op.h"
#include "dtensor/core/shape.h"

namespace dtensor {

/// The tensor dim `dim` is split across this mesh dim, torch.chunk style.
/// A negative dim counts from the end and is resolved against a tensor.
struct Shard {
  std::int64_t dim = 0;
  bool operator==(const Shard&) const = default;
};
/// Every rank along this mesh dim holds the same values.
struct Replicate {
  bool operator==(const Replicate&) const = default;
};
/// The tensor is op(local values) over the ranks of this mesh dim.
struct Partial {
  ReduceOp op = ReduceOp::Sum;
  bool operator==(const Partial&) const = default;
};

using Placement = std::variant<Shard, Replicate, Partial>;

inline bool is_shard(const Placement& p) { return std::holds_alternative<Shard>(p); }
inline bool is_shard(const Placement& p, std::int64_t dim) { return is_shard(p) && std::get<Shard>(p).dim == dim; }
inline bool is_replicate(const Placement& p) { return std::holds_alternative<Replicate>(p); }
inline bool is_partial(const Placement& p) { return std::holds_alternative<Partial>(p); }

/// Short spellings for building layouts in code, alongside the text form:
///   using namespace dtensor::shorthand;
///   Layout l{S(0), R, P()};            // same as Layout::parse("S(0),R,P(sum)")
///   Layout m{Shard{0}, Replicate{}};   // the long spelling works without it
/// In their own namespace so that one-letter names reach only code that asks.
namespace shorthand {
constexpr Shard S(std::int64_t dim) { return Shard{dim}; }
inline constexpr Replicate R{};
constexpr Partial P(ReduceOp op = ReduceOp::Sum) { return Partial{op}; }
}  // namespace shorthand

/// "S(0)", "R", "P(sum)".
std::string to_string(const Placement& p);
/// Accepts "S(0)", "Shard(0)", "Shard(dim=0)", "R", "Replicate", "P", "P(sum)",
/// "Partial(max)", with or without "()" after R. ParseError naming the text.
Placement parse_placement(std::string_view text);

/// Placements for every mesh dim plus the nesting order of shards.
///
/// When several mesh dims shard the same tensor dim, they split it one after
/// the other: the first splits the whole extent, the next splits each piece,
/// and so on. By default they nest left to right (mesh dim 0 outermost). Any
/// other order can be given (PyTorch's shard_order / _StridedShard); FSDP
/// over tensor parallelism splits dim 0 by the inner (tp) mesh dim first.
///
/// Text form: "S(0),R,P(sum)"; a non-default order is written as the nesting
/// level (0 = splits first) after each shard: "S(0)[1],S(0)[0]".
class Layout {
 public:
  Layout() = default;
  /// Default (left to right) nesting.
  Layout(std::vector<Placement> placements);  // NOLINT(google-explicit-constructor): implicit on purpose
  Layout(std::initializer_list<Placement> placements) : Layout(std::vector<Placement>(placements)) {}
  /// `split_order[i]` lists, for one tensor dim, the mesh dims that shard it
  /// in the order they split it (outermost first); tensor dims not listed
  /// nest left to right. LayoutError if a list does not name exactly the
  /// mesh dims that shard that tensor dim.
  Layout(std::vector<Placement> placements, std::span<const std::pair<std::int64_t, std::vector<int>>> split_order);

  /// Parses the text form above; ParseError names the bad part.
  static Layout parse(std::string_view text);
  /// All Replicate on `mesh_ndim` dims.
  static Layout replicated(int mesh_ndim);

  int mesh_ndim() const { return static_cast<int>(placements_.size()); }
  const std::vector<Placement>& placements() const { return placements_; }
  /// The placement on `mesh_dim`; LayoutError naming it and the range
  /// outside [0, mesh_ndim()).
  const Placement& operator[](int mesh_dim) const {
    check_mesh_dim(mesh_dim);
    return placements_[static_cast<std::size_t>(mesh_dim)];
  }
  /// Nesting level of a Shard mesh dim among the mesh dims sharding the same
  /// tensor dim (0 = outermost); -1 for a mesh dim that does not shard.
  int level(int mesh_dim) const {
    check_mesh_dim(mesh_dim);
    return levels_[static_cast<std::size_t>(mesh_dim)];
  }
  const std::vector<int>& levels() const { return levels_; }
  /// Mesh dims sharding tensor dim `dim`, outermost first.
  std::vector<int> split_order(std::int64_t dim) const;
  /// The innermost mesh dim sharding `dim`, or -1.
  int innermost(std::int64_t dim) const;
  bool has_partial() const;
  bool default_order() const;
  /// Shards with negative dims resolved against a tensor of `ndim` dims.
  /// LayoutError if a shard dim is out of range.
  Layout resolved(int ndim) const;

  /// This layout with mesh dim m set to p. A new Shard becomes the innermost
  /// split of its tensor dim; levels of the remaining shards are compacted.
  Layout with(int mesh_dim, const Placement& p) const;
  /// This layout with every Partial mesh dim made Replicate: where a
  /// Partial value goes once reduced (and a gradient of a Partial input).
  Layout without_partial() const;

  bool operator==(const Layout&) const = default;
  std::size_t hash() const;

 private:
  void compact_levels();
  void check_mesh_dim(int mesh_dim) const {
    if (mesh_dim < 0 || mesh_dim >= mesh_ndim()) [[unlikely]]
      bad_mesh_dim(mesh_dim);
  }
  [[noreturn]] void bad_mesh_dim(int mesh_dim) const;
  std::vector<Placement> placements_;
  std::vector<int> levels_;
};

/// Checks a layout against a mesh and a tensor: one placement per mesh dim,
/// shard dims in range, at most one kind of Partial op. Throws LayoutError
/// naming the bad placement. Returns the layout with dims resolved.
Layout validate_layout(const Layout& layout, std::span<const std::int64_t> mesh_shape,
                       std::span<const std::int64_t> global_shape);

/// The box of the global tensor that the rank at `coord` holds: PyTorch's
/// compute_local_shape_and_global_offset, extended to any nesting order.
/// Replicate and Partial mesh dims do not split. Empty shards report offset
/// equal to the extent being split, as PyTorch does.
Box local_box(std::span<const std::int64_t> mesh_shape, std::span<const std::int64_t> global_shape,
              const Layout& layout, std::span<const std::int64_t> coord);

}  // namespace dtensor

template <>
struct fmt::formatter<dtensor::Placement> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  auto format(const dtensor::Placement& p, fmt::format_context& ctx) const {
    return fmt::format_to(ctx.out(), "{}", dtensor::to_string(p));
  }
};
template <>
struct fmt::formatter<dtensor::Layout> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  fmt::format_context::iterator format(const dtensor::Layout& l, fmt::format_context& ctx) const;
};
template <>
struct std::hash<dtensor::Layout> {
  std::size_t operator()(const dtensor::Layout& l) const noexcept { return l.hash(); }
};
