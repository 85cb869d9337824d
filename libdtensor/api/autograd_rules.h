#pragma once
// Helpers of the backward rules: front-end ops by name, and the reshaping a
// gradient needs to match its input.
#include <cstdint>
#include <vector>

#include "dtensor/api/functional.h"
#include "libdtensor/api/autograd_engine.h"

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
/// A broadcast gradient summed back to the input's shape.
template <class X>
X sum_to(const X& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const auto lead = static_cast<std::int64_t>(g.shape().size() - shape.size());
  std::vector<std::int64_t> dims;
  for (std::int64_t d = 0; d < lead; ++d) dims.push_back(d);
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == 1 && g.shape()[lead + i] != 1) dims.push_back(lead + static_cast<std::int64_t>(i));
  if (dims.empty()) return reshape_to(g, shape);
  return reshape_to(run<"sum">(ReduceAttrs{.dims = dims, .keepdim = true}, g), shape);
}
inline std::int64_t norm_dim(std::int64_t d, std::size_t nd) { return d < 0 ? d + static_cast<std::int64_t>(nd) : d; }

}  // namespace dtensor::rules
