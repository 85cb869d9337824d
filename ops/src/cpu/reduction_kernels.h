#pragma once
// Internal: CPU kernels of the reduction family (ops/src/reduction.cpp).
// They work on whole local tensors; the caller derives shapes and dims and
// validates dtypes. Contiguous row-major inputs only (every Tensor is).
#include <cstdint>
#include <span>

#include "dtensor/core/tensor.h"

namespace dtensor::cpu {

enum class ReduceKind { Sum, Max, Min, Norm };

/// Reduces `x` over the dims flagged in `reduced` (one flag per dim of x)
/// into a tensor of `out_shape` (x's shape with the reduced dims removed or
/// set to 1). Sum/Max/Min start from their identity (0, -inf/lowest,
/// +inf/max), so an empty extent gives the identity. Norm computes the
/// p-norm (p = 0: count of nonzeros, +-inf: max/min of |x|).
Tensor reduce_dims(const Tensor& x, std::span<const bool> reduced, const Shape& out_shape, ReduceKind kind,
                   double p = 2);

/// Index of the first maximum along `dim` (dim < 0: over the flattened
/// tensor) as int64, into a tensor of `out_shape`. The extent must be > 0.
Tensor argmax(const Tensor& x, int dim, const Shape& out_shape);

/// Softmax (or log-softmax) along `dim`, subtracting the maximum first.
Tensor softmax(const Tensor& x, int dim, bool log);

/// Normalizes over the trailing `normalized_ndim` dims: layer_norm
/// ((x - mean) / sqrt(var + eps), biased variance) or, with `rms`,
/// x / sqrt(mean(x^2) + eps); then times `weight` and plus `bias` where
/// given (undefined tensors otherwise; bias is ignored for rms).
Tensor normalize(const Tensor& x, int normalized_ndim, const Tensor& weight, const Tensor& bias, double eps, bool rms);

}  // namespace dtensor::cpu
