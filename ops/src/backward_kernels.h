#pragma once
// Internal: what each device gives the backward family
// (ops/src/backward_ops.cpp), one table per device as device_kernels.h does
// for the forward families: the CPU table in ops/src/cpu/backward_kernels.cpp,
// the CUDA one in ops/src/cuda/backward_kernels.cu (null in a build without
// CUDA, ops/src/cuda/no_cuda.cpp). Every entry works on the local
// shards; the op's meta has checked dtypes and shapes. CPU entries see f32
// and f64 (dispatch widens bf16/f16 around them) plus i64 index tensors;
// CUDA entries see every floating dtype, computed in f32 for bf16/f16.
#include <cstdint>
#include <span>

#include "device_kernels.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/op.h"

namespace dtensor::device {

enum class Activation { Gelu, Silu };

struct BackwardKernels {
  /// grad * f'(x) elementwise (x and grad of one shape): gelu in its exact
  /// erf form, silu.
  Tensor (*activation_backward)(Activation fn, const Tensor& x, const Tensor& grad);
  /// Along `dim` of y (the forward's output) and grad, one shape:
  /// softmax: y * (grad - sum(grad * y)); log: grad - exp(y) * sum(grad).
  Tensor (*softmax_backward)(const Tensor& y, const Tensor& grad, int dim, bool log);
  /// The input gradient of layer_norm (or rms_norm) over the trailing
  /// `normalized_ndim` dims, the statistics recomputed from x; `weight` may
  /// be undefined (no weight).
  Tensor (*norm_backward)(const Tensor& x, const Tensor& grad, const Tensor& weight, int normalized_ndim, double eps,
                          bool rms);
  /// sum over the leading dims of grad * normalized(x): the weight's
  /// gradient, of the normalized shape.
  Tensor (*norm_weight_backward)(const Tensor& x, const Tensor& grad, int normalized_ndim, double eps, bool rms);
  /// A [rows, cols] block (rows row0.. of a table of `vocab` rows) where row
  /// i - row0 is the sum of grad's rows n with indices[n] == i; indices
  /// outside the block add nothing. ValueError naming the first index
  /// outside [0, vocab).
  Tensor (*embedding_backward)(const Tensor& indices, const Tensor& grad, std::int64_t row0, std::int64_t rows,
                               std::int64_t vocab);
  /// out[r, c] = grad[r] * (exp(z[r, c] - lse[r]) - (targets[r] == col0 + c))
  /// for z [N, cols] (columns col0.. of `classes`). ValueError naming the
  /// first target outside [0, classes).
  Tensor (*cross_entropy_backward)(const Tensor& z, const Tensor& targets, const Tensor& lse, const Tensor& grad,
                                   std::int64_t col0, std::int64_t classes);
  /// x's shape, zeros except at the first maximum (or minimum) of each group
  /// of the `reduced` dims (row-major order over them; a NaN is the extremum,
  /// as the forward max/min propagate it), which gets that group's grad
  /// entry (grad: one entry per group, in row-major order of the kept dims).
  Tensor (*extremum_backward)(const Tensor& x, std::span<const bool> reduced, const Tensor& grad, bool max);
};

/// The CPU table (ops/src/cpu/backward_kernels.cpp); ops bind it and the
/// CUDA one with bind_kernels<BackwardKernels>.
template <>
const BackwardKernels& cpu_table<BackwardKernels>();
/// The CUDA table (ops/src/cuda/backward_kernels.cu).
template <>
const BackwardKernels* cuda_table<BackwardKernels>();

}  // namespace dtensor::device
