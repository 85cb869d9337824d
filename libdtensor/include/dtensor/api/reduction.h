#pragma once
// Front-end functions of the reduction ops, for Tensor and DTensor alike.
// Each one validates what it can name in the user's terms and calls the
// registered op (ops/src/reduction.cpp); on DTensors sharding propagation
// picks the layouts:
// - sum/mean/max/min: a sharded reduced dim gives Partial(sum|sum|max|min)
//   with no communication (mean divides local sums by the global count, so
//   uneven and empty shards are right); kept dims keep their shards.
// - norm, argmax: reduced dims are gathered first.
// - softmax/log_softmax: the softmax dim is gathered first.
// - layer_norm/rms_norm: the normalized (trailing) dims are gathered first;
//   weight and bias are used replicated.
#include <algorithm>
#include <concepts>
#include <initializer_list>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "dtensor/api/functional.h"
#include "dtensor/core/error.h"

namespace dtensor {

namespace detail {
template <TensorOrDTensor X>
X reduce_call(Op op, const X& x, std::vector<std::int64_t> dims, bool keepdim, double p = 2) {
  return call_op_on<X>(op, ReduceAttrs{.dims = std::move(dims), .keepdim = keepdim, .p = p}, x);
}
}  // namespace detail

/// Sum over `dims` (empty: all dims); f32, f64, bf16, f16, i64.
template <TensorOrDTensor X>
X sum(const X& x, std::vector<std::int64_t> dims = {}, bool keepdim = false) {
  return detail::reduce_call(registered_op<"sum">(), x, std::move(dims), keepdim);
}
/// Mean over `dims` (empty: all dims); f32, f64, bf16, f16 (DTypeError for i64, as PyTorch).
template <TensorOrDTensor X>
X mean(const X& x, std::vector<std::int64_t> dims = {}, bool keepdim = false) {
  return detail::reduce_call(registered_op<"mean">(), x, std::move(dims), keepdim);
}
/// Max over `dims` (empty: all dims); ShapeError over an empty extent.
template <TensorOrDTensor X>
X max(const X& x, std::vector<std::int64_t> dims = {}, bool keepdim = false) {
  return detail::reduce_call(registered_op<"max">(), x, std::move(dims), keepdim);
}
/// Min over `dims` (empty: all dims); ShapeError over an empty extent.
template <TensorOrDTensor X>
X min(const X& x, std::vector<std::int64_t> dims = {}, bool keepdim = false) {
  return detail::reduce_call(registered_op<"min">(), x, std::move(dims), keepdim);
}
/// Index (i64) of the first maximum along `dim`; without a dim, over the
/// flattened tensor.
template <TensorOrDTensor X>
X argmax(const X& x, std::optional<std::int64_t> dim = std::nullopt, bool keepdim = false) {
  return detail::reduce_call(registered_op<"argmax">(), x,
                             dim ? std::vector<std::int64_t>{*dim} : std::vector<std::int64_t>{}, keepdim);
}
/// p-norm over `dims` (empty: all dims): (sum |x|^p)^(1/p); p = inf gives
/// max |x|, p = 0 the count of nonzeros. f32, f64, bf16, f16.
template <TensorOrDTensor X>
X norm(const X& x, double p = 2, std::vector<std::int64_t> dims = {}, bool keepdim = false) {
  return detail::reduce_call(registered_op<"norm">(), x, std::move(dims), keepdim, p);
}

/// exp(x) / sum(exp(x)) along `dim` (computed as exp(x - max)).
template <TensorOrDTensor X>
X softmax(const X& x, std::int64_t dim) {
  return call_op_on<X>(registered_op<"softmax">(), DimAttrs{.dim = dim}, x);
}
/// x - max - log(sum(exp(x - max))) along `dim`.
template <TensorOrDTensor X>
X log_softmax(const X& x, std::int64_t dim) {
  return call_op_on<X>(registered_op<"log_softmax">(), DimAttrs{.dim = dim}, x);
}

namespace detail {
template <TensorOrDTensor X>
X normalize_call(Op op, const X& x, int normalized_ndim, const std::optional<std::type_identity_t<X>>& weight,
                 const std::optional<std::type_identity_t<X>>& bias, double eps) {
  const NormAttrs attrs{.normalized_ndim = normalized_ndim,
                        .weight = weight.has_value(),
                        .bias = bias.has_value(),
                        .eps = eps};
  std::vector<X> inputs{x};
  if (weight) inputs.push_back(*weight);
  if (bias) inputs.push_back(*bias);
  return call_op(op, std::span<const X>(inputs), attrs);
}
template <TensorOrDTensor X>
int normalized_ndim_of(std::string_view op, const X& x, const Shape& normalized_shape) {
  const auto k = static_cast<std::ptrdiff_t>(normalized_shape.size());
  const Shape& shape = x.shape();
  if (k < 1 || k > static_cast<std::ptrdiff_t>(shape.size()) ||
      !std::equal(normalized_shape.begin(), normalized_shape.end(), shape.end() - k))
    throw ShapeError(fmt::format("[{}] normalized shape {} is not the trailing shape of the input {}", op,
                                 fmt::join(normalized_shape, "x"), fmt::join(shape, "x")));
  return static_cast<int>(k);
}
}  // namespace detail

/// (x - mean) / sqrt(var + eps) * weight + bias over the trailing
/// `normalized_ndim` dims (biased variance); weight and bias, where given,
/// have the normalized shape.
template <TensorOrDTensor X>
X layer_norm(const X& x, int normalized_ndim, const std::optional<std::type_identity_t<X>>& weight = std::nullopt,
             const std::optional<std::type_identity_t<X>>& bias = std::nullopt, double eps = 1e-5) {
  return detail::normalize_call(registered_op<"layer_norm">(), x, normalized_ndim, weight, bias, eps);
}
/// layer_norm with the normalized shape spelled out, as torch.nn.functional.
template <TensorOrDTensor X>
X layer_norm(const X& x, const Shape& normalized_shape,
             const std::optional<std::type_identity_t<X>>& weight = std::nullopt,
             const std::optional<std::type_identity_t<X>>& bias = std::nullopt, double eps = 1e-5) {
  return layer_norm(x, detail::normalized_ndim_of("layer_norm", x, normalized_shape), weight, bias, eps);
}
/// Braced shapes ({5}, {6, 5}) are normalized shapes, never a dim count.
template <TensorOrDTensor X>
X layer_norm(const X& x, std::initializer_list<std::int64_t> normalized_shape,
             const std::optional<std::type_identity_t<X>>& weight = std::nullopt,
             const std::optional<std::type_identity_t<X>>& bias = std::nullopt, double eps = 1e-5) {
  return layer_norm(x, Shape(normalized_shape), weight, bias, eps);
}
/// x / sqrt(mean(x^2) + eps) * weight over the trailing `normalized_ndim` dims.
template <TensorOrDTensor X>
X rms_norm(const X& x, int normalized_ndim, const std::optional<std::type_identity_t<X>>& weight = std::nullopt,
           double eps = 1e-6) {
  return detail::normalize_call(registered_op<"rms_norm">(), x, normalized_ndim, weight, std::optional<X>{}, eps);
}
template <TensorOrDTensor X>
X rms_norm(const X& x, const Shape& normalized_shape,
           const std::optional<std::type_identity_t<X>>& weight = std::nullopt, double eps = 1e-6) {
  return rms_norm(x, detail::normalized_ndim_of("rms_norm", x, normalized_shape), weight, eps);
}
template <TensorOrDTensor X>
X rms_norm(const X& x, std::initializer_list<std::int64_t> normalized_shape,
           const std::optional<std::type_identity_t<X>>& weight = std::nullopt, double eps = 1e-6) {
  return rms_norm(x, Shape(normalized_shape), weight, eps);
}

}  // namespace dtensor
