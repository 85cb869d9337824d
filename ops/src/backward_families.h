#pragma once
// Internal to the backward family (backward_ops.cpp, backward_index_ops.cpp):
// the checks and strategy pieces both files use.
#include <string_view>

#include "dtensor/ops/op.h"

namespace dtensor::backward {

/// DTypeError naming the op and the input unless `dtype` is floating.
void check_floating(std::string_view op, std::string_view what, DType dtype);
/// ShapeError/DTypeError unless `t` has `ref`'s shape and dtype.
void check_like(std::string_view op, std::string_view what, const TensorMeta& t, std::string_view ref_name,
                const TensorMeta& ref);
/// The option of one mesh dim that every backward op has: the incoming
/// gradient (input `grad_input`) Partial(sum), the others Replicate, the
/// output Partial(sum), for an op linear in its gradient.
DimStrategy partial_gradient(std::size_t num_inputs, std::size_t grad_input);

}  // namespace dtensor::backward

namespace dtensor {
void register_backward_index_ops(OpRegistry& registry);  // backward_index_ops.cpp
}  // namespace dtensor
