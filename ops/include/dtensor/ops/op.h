#pragma once
// The op registry: one registration per op — its name, how its output shape
// follows from its inputs, its sharding strategies and its local kernels per
// device. Propagation (dispatch.h) prices every strategy with the planner's
// cost model and runs the cheapest; a strategy never issues a collective.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/dtype.h"
#include "dtensor/core/placement.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/attrs.h"

namespace dtensor {

/// A tensor argument as propagation sees it: metadata only.
struct TensorMeta {
  Shape shape;
  DType dtype = DType::Float32;
  bool operator==(const TensorMeta&) const = default;
};

/// One candidate: the layouts it needs its inputs in, and the layout it gives
/// its output.
struct Strategy {
  std::vector<Layout> inputs;
  Layout output;
  /// Why this candidate moves the inputs, for explain mode (empty: nothing
  /// worth saying), e.g. "S(1) does not survive [4,6]->[24], redistributing
  /// to R first".
  std::string note;
  bool operator==(const Strategy&) const = default;
};

/// What a strategy function is told.
struct StrategyQuery {
  Shape mesh_shape;
  std::span<const TensorMeta> inputs;
  std::span<const Layout> layouts;  // the inputs' current layouts
  const OpAttrs& attrs;
  TensorMeta output;  // from the op's meta function
};
using StrategyFn = std::function<std::vector<Strategy>(const StrategyQuery&)>;

/// Output shape and dtype from input metadata; throws ShapeError/ValueError
/// naming the op and the bad value.
using MetaFn = std::function<TensorMeta(std::span<const TensorMeta> inputs, const OpAttrs& attrs)>;

/// What a local kernel sees: the local shards and where they sit in the
/// global tensors (so that e.g. mean divides by the global size, rand fills
/// its own box, an embedding shard masks indices outside its rows).
struct KernelArgs {
  std::span<const Tensor> inputs;      // local shards, in the strategy's layouts
  std::span<const TensorMeta> global;  // the inputs' global metadata
  std::span<const Box> boxes;          // each input's box in its global tensor
  std::span<const Layout> layouts;     // the layouts the inputs are in
  const OpAttrs& attrs;
  // By reference, like the spans: a cache hit hands the kernel its entry's
  // own copies instead of copying vectors on every call.
  const TensorMeta& output;  // global metadata of the output (a CPU kernel sees a
                             // bf16/f16 output in its compute dtype, f32)
  const Box& output_box;     // this rank's box of the output
  const Layout& output_layout;
};
using Kernel = std::function<Tensor(const KernelArgs&)>;

/// Strategies for one mesh dim: placements for each input and the output.
struct DimStrategy {
  std::vector<Placement> inputs;
  Placement output;
};
/// Per-mesh-dim options, which the registry expands to the whole mesh (as
/// PyTorch's register_single_dim_strategy): see expand_to_mesh.
using DimStrategyFn = std::function<std::vector<DimStrategy>(const StrategyQuery&)>;

/// An op's backward rule. Defined by the api layer (dtensor/api/autograd.h,
/// make_backward), since a rule is written with call_op on Tensors and
/// DTensors, which live above ops: the registry only carries it, as an
/// opaque pointer. The library's own ops get theirs from the api layer's
/// table (keyed by op), so their registrations here stay as they are.
struct BackwardRule;

struct OpDef {
  std::string name;
  /// Number of tensor inputs; -1 for any number (cat, stack, einsum).
  int num_inputs = 1;
  MetaFn meta;
  /// The candidates over the whole mesh. An op may instead give
  /// dim_strategy, the options of one mesh dim; OpRegistry::add then sets
  /// strategy to their expansion (expand_to_mesh).
  StrategyFn strategy;
  DimStrategyFn dim_strategy;
  /// With dim_strategy: order the expanded candidates so that those keeping
  /// more inputs in their current layouts come first (ties in cost go to the
  /// earliest candidate). Stable otherwise.
  bool prefer_kept_layouts = false;
  /// The local kernel per device; an empty one means the op has none there,
  /// which dispatch reports as UnsupportedError naming the op and the device.
  Kernel cpu_kernel;
  Kernel cuda_kernel;
  /// The CPU kernel takes bf16/f16 tensors as they are (it only moves
  /// values, or converts in blocks itself); otherwise dispatch widens each
  /// such input to f32 around it and rounds the output back.
  bool cpu_handles_half = false;
  /// One line for people (explain mode, errors).
  std::string doc;
  /// How gradients pass back through the op (dtensor/api/autograd.h,
  /// make_backward); null: the api layer's table of rules, if it has one.
  std::shared_ptr<const BackwardRule> backward;
  /// Math does not differentiate the op (comparisons, argmax, integer
  /// ops): its outputs never require a gradient. An op with neither this
  /// nor a rule fails only when a gradient has to pass through it.
  bool not_differentiable = false;

  const Kernel& kernel(Device device) const { return device == Device::CUDA ? cuda_kernel : cpu_kernel; }
};

/// A handle to a registered op: calling through it (call_op(Op, ...) in
/// dtensor/api/functional.h, dispatch) skips the lookup by name. Valid for
/// the life of the process (the registry never removes an op).
class Op {
 public:
  Op(const OpDef& def) : def_(&def) {}  // NOLINT: a registered OpDef is an Op
  /// The registered op of that name (ValueError as OpRegistry::get).
  static Op find(std::string_view name);
  const OpDef& def() const { return *def_; }
  const std::string& name() const { return def_->name; }
  operator const OpDef&() const { return *def_; }  // NOLINT: usable wherever an OpDef is
  bool operator==(const Op&) const = default;

 private:
  const OpDef* def_;
};

/// The registry. The library's own ops are registered on first use; users
/// add theirs with add() (see examples/custom_op.cpp).
class OpRegistry {
 public:
  static OpRegistry& global();
  /// ValueError if the name is taken or the definition lacks meta or a
  /// strategy (strategy or dim_strategy). Returns the registered op, whose
  /// address stays valid.
  const OpDef& add(OpDef def);
  /// A hash lookup; ValueError naming the op and listing close names if
  /// unknown.
  const OpDef& get(std::string_view name) const;
  bool contains(std::string_view name) const;
  std::vector<std::string> names() const;

 private:
  OpRegistry() = default;
  // Looked up by string_view without building a std::string.
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view name) const { return std::hash<std::string_view>{}(name); }
  };
  std::unordered_map<std::string, std::unique_ptr<OpDef>, NameHash, std::equal_to<>> defs_;
};

// ---- Expanding per-mesh-dim options --------------------------------------------

/// Expands per-mesh-dim options to the whole mesh (every combination, one
/// option per mesh dim), keeping those whose layouts are valid for the
/// shapes (shard dims in range, one kind of Partial per layout). Always
/// includes the all-Replicate candidate if the options do. Shards nest left
/// to right, except that for an input whose layout nests in another order
/// (e.g. S(0)[1],S(0)[0]) the candidates with that input's placements come
/// once more with its order carried over to every tensor, so that it runs
/// where it lies.
std::vector<Strategy> expand_to_mesh(std::span<const DimStrategy> per_dim, const StrategyQuery& query);

}  // namespace dtensor
