#pragma once
// Front-end functions of the embedding family (ops/src/embedding.cpp) and
// cross entropy, for Tensor and DTensor alike. On DTensors:
// - embedding: a row-sharded table (S(0)) gives Partial(sum) with no
//   communication (each rank looks up its own rows, zeros elsewhere); a
//   column-sharded table (S(1)) gives the output sharded on its last dim; a
//   replicated table keeps the indices' shards.
// - cross_entropy: composed of registered ops (max, sub, exp, sum, log,
//   pick, mean); with logits sharded on the class dim (vocab-parallel) only
//   per-row values are reduced, the logits are never gathered. Its backward
//   is one fused op (cross_entropy_backward), vocab-parallel as well.
#include <cstdint>
#include <optional>

#include <fmt/format.h>

#include "dtensor/api/autograd.h"
#include "dtensor/api/functional.h"
#include "dtensor/core/error.h"

namespace dtensor {

namespace detail {
/// `loss` made the output of cross_entropy's node, whose backward gives the
/// logits dloss/dlogits = (softmax - one-hot) / N from their `lse` [N]
/// (autograd_rules_fused.cpp).
Tensor record_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& lse, Tensor loss);
DTensor record_cross_entropy(const DTensor& logits, const DTensor& targets, const DTensor& lse, DTensor loss);
}  // namespace detail

/// Rows of `table` [V, D] at the i64 `indices` [...]: an [..., D] tensor.
/// ValueError naming the index for an index outside [0, V) (checked by the
/// rank whose shard of the indices holds it).
template <TensorOrDTensor X>
X embedding(const X& indices, const X& table) {
  if (indices.dtype() != DType::Int64)
    throw DTypeError(fmt::format("[embedding] indices are {}; expected i64", indices.dtype()));
  if (table.dim() != 2)
    throw ShapeError(
        fmt::format("[embedding] table of shape {}; expected 2 dims [rows, dim]", fmt::join(table.shape(), "x")));
  return call_op_on(registered_op<"embedding">(), {}, indices, table);
}

/// logits[n, targets[n]] for logits [N, C] and i64 targets [N]: an [N]
/// tensor. ValueError for a target outside [0, C).
template <TensorOrDTensor X>
X pick(const X& logits, const X& targets) {
  return call_op_on(registered_op<"pick">(), {}, logits, targets);
}

/// Mean over N of -log softmax(logits)[n, targets[n]] for floating logits
/// [N, C] and i64 targets [N]; a 0-d tensor. Computed as
/// lse(z) - z[target] with z = logits - max, so it stays finite for large
/// logits.
template <TensorOrDTensor X>
X cross_entropy(const X& logits, const X& targets) {
  if (logits.dim() != 2)
    throw ShapeError(
        fmt::format("[cross_entropy] logits of shape {}; expected 2 dims [N, C]", fmt::join(logits.shape(), "x")));
  if (!is_floating(logits.dtype()))
    throw DTypeError(fmt::format("[cross_entropy] logits are {}; expected f32, f64, bf16 or f16", logits.dtype()));
  if (targets.dtype() != DType::Int64)
    throw DTypeError(fmt::format("[cross_entropy] targets are {}; expected i64", targets.dtype()));
  if (targets.dim() != 1 || targets.shape()[0] != logits.shape()[0])
    throw ShapeError(fmt::format("[cross_entropy] targets of shape {}; expected [{}] to match logits {}",
                                 fmt::join(targets.shape(), "x"), logits.shape()[0], fmt::join(logits.shape(), "x")));
  // Recorded as one node whose backward is the fused softmax minus one-hot
  // (detail::record_cross_entropy): with vocab-parallel logits it moves only
  // per-row values, and the max shift needs no gradient of its own.
  const bool record = grad_enabled() && logits.requires_grad();
  std::optional<X> lse, loss;
  {
    NoGradGuard unrecorded;
    X m = call_op_on(registered_op<"max">(), ReduceAttrs{.dims = {1}, .keepdim = true}, logits);
    // With vocab-parallel logits the row max is Partial(max); it is used
    // twice (the shift, and lse for the backward), so it is reduced once
    // here rather than by each use.
    if constexpr (std::same_as<X, DTensor>)
      if (m.placements().has_partial()) m = m.redistribute(m.placements().without_partial());
    const X z = call_op_on(registered_op<"sub">(), {}, logits, m);
    const ReduceAttrs row_sum{.dims = {1}};
    const X lse_z = call_op_on(registered_op<"log">(), {},
                               call_op_on(registered_op<"sum">(), row_sum, call_op_on(registered_op<"exp">(), {}, z)));
    loss =
        call_op_on(registered_op<"mean">(), {},
                   call_op_on(registered_op<"sub">(), {}, lse_z, call_op_on(registered_op<"pick">(), {}, z, targets)));
    if (!record) return *loss;
    lse = call_op_on(registered_op<"add">(), {}, lse_z,
                     call_op_on(registered_op<"reshape">(), ShapeAttrs{.shape = {logits.shape()[0]}}, m));
  }
  return detail::record_cross_entropy(logits, targets, *lse, std::move(*loss));
}

}  // namespace dtensor
