#include "dtensor/api/functional.h"

#include <optional>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/core/inline_vector.h"
#include "autograd_engine.h"

namespace dtensor {

namespace detail {
struct DispatchAccess {
  static DTensor wrap(ShardedTensor out, const DeviceMesh& mesh, const CostModel& cost) {
    // A kernel may hand an input's shard back, with that shard's record.
    if (out.local.autograd_meta()) out.local.set_autograd_meta(nullptr);
    return DTensor(std::move(out.local), mesh, std::move(out.meta), cost);
  }
  static const Tensor& local(const DTensor& x) { return x.local_; }
};
}  // namespace detail

namespace {

// Small calls keep their argument lists on the stack.
constexpr std::size_t kInline = 4;

}  // namespace

namespace {

// One tensor passed twice (mul(y, y) on a Partial y) may reach the kernel as
// two layouts: dispatch reduced one copy and left the other Partial, which
// the op accepts (Partial times Replicate is Partial). The backward computes
// with what the node saves, and a Partial saved input makes a Partial
// gradient, which every later op then carries or reduces again (a Megatron
// MLP's backward had four collectives instead of none). The values are the
// same, so the node saves the reduced copy in both places: no extra memory,
// the same gradients.
void save_reduced_copies(std::span<const DTensor* const> inputs, std::vector<std::optional<DTensor>>& as_used) {
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (as_used[i] || inputs[i]->autograd_meta() == nullptr || !inputs[i]->placements().has_partial()) continue;
    for (std::size_t j = 0; j < inputs.size(); ++j)
      if (j != i && as_used[j] && inputs[j]->autograd_meta() == inputs[i]->autograd_meta() &&
          !as_used[j]->placements().has_partial()) {
        as_used[i] = as_used[j];
        break;
      }
  }
}

}  // namespace

DTensor call_op(std::string_view name, std::span<const DTensor> inputs, const OpAttrs& attrs) {
  return call_op(Op::find(name), inputs, attrs);
}

Tensor call_op(std::string_view name, std::span<const Tensor> inputs, const OpAttrs& attrs) {
  return call_op(Op(OpRegistry::global().get(name)), inputs, attrs);
}

DTensor call_op(Op op, std::span<const DTensor> inputs, const OpAttrs& attrs) {
  InlineVector<const DTensor*, kInline> ptrs(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) ptrs[i] = &inputs[i];
  return call_op(op, std::span<const DTensor* const>(ptrs), attrs);
}

DTensor call_op(Op handle, std::span<const DTensor* const> inputs, const OpAttrs& attrs) {
  const OpDef& op = handle.def();
  if (inputs.empty()) throw ValueError(fmt::format("[{}] needs at least one DTensor input to know its mesh", op.name));
  const DeviceMesh& mesh = inputs[0]->mesh();
  InlineVector<ShardedInput, kInline> args(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const DTensor& x = *inputs[i];
    before_reading(x.autograd_meta());
    if (i > 0 && !(x.mesh() == mesh))
      throw MeshError(fmt::format("[{}] input {} is on mesh {}, input 0 on mesh {}: expected one mesh", op.name, i,
                                  x.mesh(), mesh));
    args[i] = ShardedInput{&detail::DispatchAccess::local(x), &x.placements(), &x.shape()};
  }
  const CostModel& cost = inputs[0]->cost_model();
  if (!records(op, inputs)) return detail::DispatchAccess::wrap(dispatch(op, mesh, args, attrs, cost), mesh, cost);
  // Recorded: the node keeps the inputs as the kernel received them.
  std::vector<ShardedTensor> moved;
  DTensor out = detail::DispatchAccess::wrap(dispatch(op, mesh, args, attrs, cost, &moved), mesh, cost);
  std::vector<std::optional<DTensor>> as_used;  // empty (no allocation) when nothing moved
  if (!moved.empty()) {
    as_used.resize(inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (moved[i].local.defined()) as_used[i] = detail::DispatchAccess::wrap(std::move(moved[i]), mesh, cost);
    save_reduced_copies(inputs, as_used);
  }
  record_op(op, attrs, inputs, out, as_used);
  return out;
}

Tensor call_op(Op op, std::span<const Tensor> inputs, const OpAttrs& attrs) {
  Tensor out = run_unsharded(op.def(), inputs, attrs);
  record_op(op.def(), attrs, inputs, out);
  return out;
}

}  // namespace dtensor
