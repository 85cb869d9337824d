#pragma once
// Helpers of the backward rules: front-end ops by name, and the reshaping a
// gradient needs to match its input.
#include <cstdint>
#include <vector>

#include "dtensor/api/functional.h"
#include "dtensor/core/shape.h"
#include "autograd_engine.h"

namespace dtensor::rules {

using RuleList = std::vector<std::pair<std::string_view, std::shared_ptr<const BackwardRule>>>;

template <detail::OpName N, class X, class... Xs>
X run(const OpAttrs& attrs, const X& x, const Xs&... xs) {
  return call_op_on<X>(registered_op<N>(), attrs, x, xs...);
}
template <class X>
X scale(const X& x, double c) {
  return run<"mul_scalar">(ScalarAttrs{.value = c}, x);
}
template <class X>
X plus(const X& x, double c) {
  return run<"add_scalar">(ScalarAttrs{.value = c}, x);
}
template <class X>
X zeros_like(const X& x) {
  return scale(x, 0.0);
}
template <class X>
X reshape_to(const X& x, const Shape& shape) {
  return x.shape() == shape ? x : run<"reshape">(ShapeAttrs{.shape = shape}, x);
}
/// A broadcast gradient summed back to the input's shape (the sum_to_shape
/// op; no op when nothing was broadcast).
template <class X>
X sum_to(const X& g, const Shape& shape) {
  return g.shape() == shape ? g : run<"sum_to_shape">(ShapeAttrs{.shape = shape}, g);
}

/// A reduction's dims counted from 0, all of them when none are named.
inline std::vector<std::int64_t> reduced_dims(std::string_view op, const ReduceAttrs& r, std::size_t nd) {
  std::vector<std::int64_t> dims;
  if (r.dims.empty())
    for (std::size_t d = 0; d < nd; ++d) dims.push_back(static_cast<std::int64_t>(d));
  else
    for (auto d : r.dims) dims.push_back(wrap_dim(op, d, static_cast<std::int64_t>(nd)));
  return dims;
}

/// A reduction's output gradient broadcast back over the reduced dims of x.
template <class X>
X expand_reduced(std::string_view op, const X& g, const X& x, const ReduceAttrs& r) {
  Shape kept = x.shape();
  for (auto d : reduced_dims(op, r, kept.size())) kept[static_cast<std::size_t>(d)] = 1;
  return run<"expand">(ShapeAttrs{.shape = x.shape()}, reshape_to(g, kept));
}

}  // namespace dtensor::rules
