#pragma once
// Reverse-mode autograd for Tensor and DTensor alike, with PyTorch's names:
// x.requires_grad_(), y.backward(), x.grad(), x.zero_grad(), x.detach(),
// NoGradGuard.
//
// Recording happens at call_op (every op goes through it) and at the layout
// changes (redistribute, distribute_tensor, from_local, to_local): an op
// whose inputs require a gradient makes a node that keeps its attrs, its
// inputs and its output. backward() walks the nodes in reverse creation
// order (the same order on every rank, so their collectives match) and
// calls each op's backward rule, which is written with call_op on the same
// front end: the backward is itself dispatched, planned, counted by
// CommCounter and shown by ExplainScope as "[backward of <op>] ...".
//
// Where the rules live: OpDef (ops/, below this layer) cannot name Tensor or
// DTensor rules' types, so it carries an opaque pointer to a BackwardRule,
// defined here. A user's op sets OpDef::backward = make_backward(...) before
// OpRegistry::add (examples/custom_op.cpp); the library's own ops take
// theirs from a table in this layer (autograd_rules*.cpp), which
// set_backward() can override (a fused backward kernel plugs in that way).
//
// Guarantees:
// - A DTensor's gradient is a DTensor on its mesh with its global shape, in
//   the layout backward produced; it may be Partial (the reduction is
//   deferred; full_tensor() gives the true gradient). Gradients accumulate
//   over backward calls, through the add op's propagation, so Partial plus
//   Partial stays Partial.
// - A layout change's gradient goes back to the forward source layout with
//   Partial replaced by Replicate; the planner picks the collective.
// - The graph is freed after backward unless retain_graph; a second
//   backward through it raises AutogradError saying so.
// - An op with neither a rule nor OpDef::not_differentiable raises
//   AutogradError naming it when a gradient must pass through it, never at
//   forward time. The outputs of a not-differentiable op, and integer
//   outputs (to(x, Int64)), never require one.
// - Saved tensors share storage with the forward's: an in-place op (add_)
//   on one of them between forward and backward changes the gradient.
// - No higher-order gradients: the backward itself is not recorded.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtensor/api/dtensor_tensor.h"
#include "dtensor/ops/op.h"

namespace dtensor {

/// A hook registered by on_gradient_ready: removed when this handle is
/// destroyed (or remove() is called), so that the hook never outlives what
/// it captures.
class GradientReadyHook {
 public:
  GradientReadyHook() = default;
  GradientReadyHook(std::weak_ptr<AutogradMeta> leaf, std::uint64_t id);
  GradientReadyHook(GradientReadyHook&& other) noexcept;
  GradientReadyHook& operator=(GradientReadyHook&& other) noexcept;
  GradientReadyHook(const GradientReadyHook&) = delete;
  GradientReadyHook& operator=(const GradientReadyHook&) = delete;
  ~GradientReadyHook();
  void remove() noexcept;

 private:
  std::weak_ptr<AutogradMeta> leaf_;
  std::uint64_t id_ = 0;
};

/// Runs `hook` in every backward that reaches `leaf`, once that backward has
/// added its last contribution to leaf.grad() (PyTorch's
/// register_post_accumulate_grad_hook): where a parameter is used several
/// times, after the last use's gradient. This is where DDP starts a
/// bucket's all_reduce while the rest of the backward runs. Hooks run on
/// the thread of the backward, in the order registered, with grad mode off;
/// a backward that gives the leaf no gradient runs none. The split
/// backwards of pipeline schedules (backward_input / backward_weight) do not
/// run them. AutogradError unless `leaf` is a leaf that requires a gradient.
[[nodiscard]] GradientReadyHook on_gradient_ready(const Tensor& leaf, std::function<void()> hook);
[[nodiscard]] GradientReadyHook on_gradient_ready(const DTensor& leaf, std::function<void()> hook);

/// Runs `hook` once, on this thread, before the next read of `leaf`'s values
/// by an op, a redistribute, or redistribute_all or its started form (not
/// by a bare to_local()), then forgets it. This is how ZeRO's overlapped
/// parameter gather (ShardingOptions::overlap_parameter_gather) makes a
/// parameter's first use in the next forward wait for the bucket that
/// brings its value (Megatron's forward pre-hooks, per tensor rather than
/// per module). One hook per leaf: a second replaces the first, and an
/// empty one clears it. AutogradError unless `leaf` is a leaf that
/// requires a gradient.
void on_next_read(const DTensor& leaf, std::function<void()> hook);

/// Whether this thread records ops (true unless a NoGradGuard is alive).
bool grad_enabled();

/// Switches recording off on this thread while alive (PyTorch's no_grad).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

/// Switches recording back on while alive, inside a NoGradGuard or a
/// backward pass (recompute's second forward records that way).
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

/// f(inputs), computed without recording anything but this call: the
/// backward runs f again on the saved inputs, recording, and differentiates
/// that (PyTorch's torch.utils.checkpoint, activation checkpointing; the
/// checkpoints that save a model are dtensor/checkpoint/). What f makes in
/// between is freed after the forward and made again for the backward:
/// memory traded for a second forward, and f's collectives run again
/// (FSDP's re-gather of a block's parameters for its backward). f must
/// compute the same values both times, and every rank must call it alike.
Tensor recompute(const std::function<Tensor(std::span<const Tensor>)>& f, std::span<const Tensor> inputs);
DTensor recompute(const std::function<DTensor(std::span<const DTensor>)>& f, std::span<const DTensor> inputs);

/// recompute for FSDP's units: f(inputs, gathered), where `gathered` is
/// `params` brought to `gathered_layouts` by one redistribute_all (one
/// coalesced all_gather where they are shards of one mesh dim). Nothing f
/// makes is kept, the gathered parameters included; the backward gathers
/// them again (one call), runs f on them as fresh leaves, and sends their
/// gradients back to the parameters' layouts (Partial replaced by
/// Replicate) by one more redistribute_all (one coalesced reduce_scatter).
/// ValueError unless there is one gathered layout per parameter.
DTensor recompute_gathered(
    const std::function<DTensor(std::span<const DTensor> inputs, std::span<const DTensor> gathered)>& f,
    std::span<const DTensor> inputs, std::span<const DTensor> params, std::span<const Layout> gathered_layouts);

/// The old names of recompute and recompute_gathered.
[[deprecated("renamed recompute; checkpoints are what dtensor/checkpoint/ saves")]] inline Tensor checkpoint(
    const std::function<Tensor(std::span<const Tensor>)>& f, std::span<const Tensor> inputs) {
  return recompute(f, inputs);
}
[[deprecated("renamed recompute; checkpoints are what dtensor/checkpoint/ saves")]] inline DTensor checkpoint(
    const std::function<DTensor(std::span<const DTensor>)>& f, std::span<const DTensor> inputs) {
  return recompute(f, inputs);
}
[[deprecated("renamed recompute_gathered")]] inline DTensor checkpoint_gathered(
    const std::function<DTensor(std::span<const DTensor> inputs, std::span<const DTensor> gathered)>& f,
    std::span<const DTensor> inputs, std::span<const DTensor> params, std::span<const Layout> gathered_layouts) {
  return recompute_gathered(f, inputs, params, gathered_layouts);
}

/// A step autograd cannot look into (a collective on local shards: MoE's
/// all_to_allv of token rows) made differentiable by its own backward, as
/// PyTorch's autograd.Function: `output` was computed from `inputs` with
/// nothing recorded, and `backward(grad)` returns one gradient per input
/// (nullopt: none), shaped as that input. While recording and when an input
/// needs a gradient, `output` becomes one node named `name` that calls
/// `backward` (which may itself run collectives: every rank runs the
/// backward's nodes in the same order); otherwise `output` is returned as
/// it is. AutogradError naming the node if backward returns the wrong
/// number of gradients or a gradient of the wrong shape.
using CustomBackward = std::function<std::vector<std::optional<Tensor>>(const Tensor& grad)>;
Tensor record_custom(std::string name, std::span<const Tensor> inputs, Tensor output, CustomBackward backward);
/// The same on DTensors: `backward(grad)` gets the output's gradient in the
/// layout it arrived and returns one per input on its mesh with its global
/// shape, in any layout (FSDP's unit gather, whose backward may start its
/// reduce_scatter and deliver the gradient later, returning none).
using CustomDTensorBackward = std::function<std::vector<std::optional<DTensor>>(const DTensor& grad)>;
DTensor record_custom(std::string name, std::span<const DTensor> inputs, DTensor output,
                      CustomDTensorBackward backward);

/// What a backward rule is given. Saved tensors are detached copies (same
/// storage).
template <class X>
struct BackwardArgs {
  const OpAttrs& attrs;
  std::span<const X> inputs;
  const X& output;
  const X& grad;                   // the output's gradient, in whatever layout it arrived
  const std::vector<bool>& needs;  // which inputs need a gradient
  bool needs_grad(std::size_t i) const { return needs[i]; }
};

/// One gradient per input (empty where not needed or not defined).
template <class X>
using InputGrads = std::vector<std::optional<X>>;

struct BackwardRule {
  std::function<InputGrads<Tensor>(const BackwardArgs<Tensor>&)> on_tensor;
  std::function<InputGrads<DTensor>(const BackwardArgs<DTensor>&)> on_dtensor;
};

/// A rule from one generic callable `[](const auto& a) { ... }` taking
/// BackwardArgs<X> and returning InputGrads<X>, written with the front-end
/// functions (or call_op), instantiated for Tensor and DTensor.
template <class F>
std::shared_ptr<const BackwardRule> make_backward(F f) {
  return std::make_shared<const BackwardRule>(BackwardRule{f, f});
}

/// Replaces the rule of a registered op (for the library's own ops: the
/// table's). Thread-safe; meant for start-up.
void set_backward(Op op, std::shared_ptr<const BackwardRule> rule);

/// The rule backward would use for `op` (null: none).
std::shared_ptr<const BackwardRule> backward_rule(const OpDef& op);
/// Marked not differentiable (OpDef::not_differentiable or the library's
/// table: comparisons, argmax).
bool is_not_differentiable(const OpDef& op);

}  // namespace dtensor
