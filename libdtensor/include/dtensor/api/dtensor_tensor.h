#pragma once
// DTensor: a global tensor of which each rank holds only its own shard.
#include <cstdint>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "dtensor/core/placement.h"
#include "dtensor/core/tensor.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/ops/dispatch.h"
#include "dtensor/redistribute/cost_model.h"
#include "dtensor/redistribute/plan.h"

namespace dtensor {

namespace detail {
struct DispatchAccess;  // functional.cpp
struct AutogradAccess;  // autograd.cpp
}  // namespace detail

/// Whether DTensor::from_local checks what the ranks passed against each
/// other (one small all_gather) or trusts a given global shape.
enum class FromLocalCheck : std::uint8_t { RanksAgree, Trust };

class DTensor {
 public:
  /// Wraps this rank's shard. Without `global_shape` it is inferred from the
  /// local shapes: sizes of sharded dims are summed over the shard groups
  /// (exact for uneven shards, where PyTorch's inference is wrong, #110762).
  /// Either way one all_gather of a fixed-size record (dtype, dims,
  /// placements, local and global shape) checks that the ranks agree on the
  /// dtype, the number of dims, the placements and the global shape, and
  /// that every local shape is the box the layout gives that rank: the error
  /// (DTypeError / ShapeError / LayoutError) is the same on every rank and
  /// names the argument, rank 0's value and each rank that differs.
  /// `FromLocalCheck::Trust` with a global shape skips the exchange (as
  /// PyTorch does without run_check) and checks only this rank's shape: for
  /// callers that built the shards from one agreed shape. Checking is the
  /// default since a disagreement otherwise leaves garbage or a hang: one
  /// small all_gather, 17-18 us a call against about 1 us trusted on 4
  /// thread ranks (bench/from_local), less than any collective the tensor
  /// will take part in; a loop that rewraps shards it built itself from one
  /// agreed shape can pass Trust.
  static DTensor from_local(Tensor local, const DeviceMesh& mesh, Layout placements,
                            std::optional<Shape> global_shape = std::nullopt,
                            FromLocalCheck check = FromLocalCheck::RanksAgree);

  /// This rank's shard (shares storage). While recording (autograd.h), the
  /// shard of a DTensor that requires a gradient is itself recorded: its
  /// gradient flows back as a DTensor in this DTensor's layout.
  const Tensor& to_local() const {
    if (autograd_ && !local_.autograd_meta()) record_local();
    return local_;
  }
  /// The same, with the layout the shard's gradient has when it flows back
  /// (PyTorch's grad_placements), e.g. Partial where each rank's local
  /// gradient is only its part of the sum.
  Tensor to_local(const Layout& grad_layout) const;
  /// The whole tensor on every rank (redistributes to all-Replicate).
  Tensor full_tensor() const;
  /// The same global tensor under another layout; the planner picks the
  /// steps, cached per (mesh, shape, dtype, layouts, cost model).
  DTensor redistribute(const Layout& placements) const;
  /// The plan redistribute() would run.
  const Plan& plan_to(const Layout& placements) const;

  const Layout& placements() const { return meta().layout; }
  const Shape& shape() const { return meta().global_shape; }
  int dim() const { return static_cast<int>(meta().global_shape.size()); }
  DType dtype() const { return local_.dtype(); }
  const DeviceMesh& mesh() const { return mesh_; }
  /// The box of the global tensor this rank holds.
  Box local_box() const;

  /// The cost model used for this tensor's redistributions.
  const CostModel& cost_model() const { return cost_; }
  DTensor with_cost_model(CostModel cost) const;

  // ---- Autograd (dtensor/api/autograd.h), the same as on Tensor -------------
  /// Marks a leaf as needing a gradient (DTypeError naming the dtype for
  /// integer tensors). Returns *this.
  DTensor& requires_grad_(bool on = true);
  bool requires_grad() const;
  /// On this mesh with this global shape, in the layout backward produced
  /// (possibly Partial: full_tensor() reduces it).
  std::optional<DTensor> grad() const;
  void zero_grad();
  /// Replaces a leaf's gradient: the same mesh, global shape and dtype, in
  /// any layout (MeshError / ShapeError / DTypeError naming both otherwise);
  /// AutogradError on a DTensor that is not a leaf requiring a gradient.
  void set_grad(const DTensor& grad);
  /// Backward from a 0-d DTensor (ValueError naming the shape otherwise).
  void backward(bool retain_graph = false) const;
  void backward(const DTensor& grad_output, bool retain_graph = false) const;
  DTensor detach() const;
  const std::shared_ptr<AutogradMeta>& autograd_meta() const { return autograd_; }

 private:
  // call_op (functional.cpp) wraps a kernel's output without re-checking it:
  // dispatch already derived the layout and shapes.
  friend struct detail::DispatchAccess;
  DTensor(Tensor local, DeviceMesh mesh, Layout layout, Shape global_shape, CostModel cost);
  // from_local without recording.
  static DTensor wrap_local(Tensor local, const DeviceMesh& mesh, Layout placements,
                            std::optional<Shape> global_shape, FromLocalCheck check);
  DTensor(Tensor local, DeviceMesh mesh, std::shared_ptr<const ShardedMeta> meta, CostModel cost);
  mutable Tensor local_;  // mutable: to_local() records it lazily
  DeviceMesh mesh_;
  // Layout and global shape, immutable and shared: copies and the outputs of
  // one propagation-cache entry point at the same one, so that neither
  // copies vectors. Null only in a moved-from DTensor, which then reads as
  // empty (no placements, 0-d), as it did when these were plain members.
  std::shared_ptr<const ShardedMeta> meta_;
  const ShardedMeta& meta() const { return meta_ ? *meta_ : empty_meta(); }
  static const ShardedMeta& empty_meta();
  CostModel cost_;
  // Autograd's record (null: not in any graph), shared by copies. local_
  // gets its own record (its gradient flows back here) on first to_local().
  friend struct detail::AutogradAccess;
  std::shared_ptr<AutogradMeta> autograd_;
  void record_local() const;
};

/// Splits `full` (read on `src_rank` only; other ranks may pass an undefined
/// Tensor) into shards and sends each rank its own: one scatter of the
/// packed shards. Replicated mesh dims get copies; Partial(sum) keeps the
/// values on coordinate 0 and zeros elsewhere; Partial(avg|max|min) copies.
/// No rank but src_rank ever holds more than its shard.
DTensor distribute_tensor(const Tensor& full, const DeviceMesh& mesh, const Layout& placements, int src_rank = 0);

}  // namespace dtensor

template <>
struct fmt::formatter<dtensor::DTensor> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  fmt::format_context::iterator format(const dtensor::DTensor& t, fmt::format_context& ctx) const;
};
