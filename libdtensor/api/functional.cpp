#include "dtensor/api/functional.h"

#include "dtensor/core/error.h"

namespace dtensor {

namespace detail {
struct DispatchAccess {
  static DTensor wrap(ShardedTensor out, const DeviceMesh& mesh, CostModel cost) {
    return DTensor(std::move(out.local), mesh, std::move(out.layout), std::move(out.global_shape), std::move(cost));
  }
};
}  // namespace detail

DTensor call_op(std::string_view name, std::span<const DTensor> inputs, const OpAttrs& attrs) {
  return call_op(Op::find(name), inputs, attrs);
}

Tensor call_op(std::string_view name, std::span<const Tensor> inputs, const OpAttrs& attrs) {
  return run_unsharded(OpRegistry::global().get(name), inputs, attrs);
}

DTensor call_op(Op handle, std::span<const DTensor> inputs, const OpAttrs& attrs) {
  const OpDef& op = handle.def();
  const std::string& name = op.name;
  if (inputs.empty()) throw ValueError(fmt::format("[{}] needs at least one DTensor input to know its mesh", name));
  const DeviceMesh& mesh = inputs[0].mesh();
  constexpr std::size_t kInline = 4;
  std::array<ShardedTensor, kInline> inline_args;
  std::array<const ShardedTensor*, kInline> inline_ptrs;
  std::vector<ShardedTensor> heap_args;
  std::vector<const ShardedTensor*> heap_ptrs;
  std::span<ShardedTensor> args;
  std::span<const ShardedTensor*> ptrs;
  if (inputs.size() <= kInline) {
    args = std::span<ShardedTensor>(inline_args.data(), inputs.size());
    ptrs = std::span<const ShardedTensor*>(inline_ptrs.data(), inputs.size());
  } else {
    heap_args.resize(inputs.size());
    heap_ptrs.resize(inputs.size());
    args = heap_args;
    ptrs = heap_ptrs;
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (i > 0 && !(inputs[i].mesh() == mesh))
      throw MeshError(fmt::format("[{}] input {} is on mesh {}, input 0 on mesh {}: expected one mesh", name, i,
                                  inputs[i].mesh(), mesh));
    args[i] = ShardedTensor{inputs[i].to_local(), inputs[i].placements(), inputs[i].shape()};
    ptrs[i] = &args[i];
  }
  ShardedTensor out = dispatch(op, mesh, ptrs, attrs, inputs[0].cost_model());
  return detail::DispatchAccess::wrap(std::move(out), mesh, inputs[0].cost_model());
}

Tensor call_op(Op op, std::span<const Tensor> inputs, const OpAttrs& attrs) {
  return run_unsharded(op.def(), inputs, attrs);
}

}  // namespace dtensor
