#pragma once
// Internal to the CUDA build: the CUDA kernels of the pointwise and
// reduction families, behind the CUDA table (device_kernels.cpp, see
// ops/src/device_kernels.h). The same entry points as the CPU primitives
// (ops/src/cpu/pointwise_kernels.h, reduction_kernels.h), on CUDA tensors:
// inputs live on the current device, outputs are allocated there, and every
// kernel runs on the calling thread's stream. f32, f64 and i64 as on the
// CPU, plus bf16 and f16 computed in f32 and rounded once. Dtypes are
// checked by the ops' metas, once, before any kernel runs.
#include <cstdint>
#include <span>

#include "cpu/pointwise_kernels.h"
#include "cpu/reduction_kernels.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"

namespace dtensor::cuda_kernels {

/// pointwise::unary on a CUDA tensor.
Tensor unary(pointwise::Unary fn, const Tensor& x, double scalar);
/// pointwise::binary on CUDA tensors (numpy broadcasting to `out_shape`).
Tensor binary(pointwise::Binary fn, const Tensor& a, const Tensor& b, const Shape& out_shape);
/// pointwise::where on CUDA tensors.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, const Shape& out_shape);

/// cpu::reduce_dims on a CUDA tensor: the same identities for empty
/// extents, NaN-propagating max/min, the same p-norm modes. With
/// `mean_count` >= 0 (floating dtypes only) each result is also multiplied
/// by 1 / mean_count in the compute type before it is rounded (the CPU's
/// mean, which bf16/f16 round once), as scale_by_count would.
Tensor reduce_dims(const Tensor& x, std::span<const bool> reduced, const Shape& out_shape, cpu::ReduceKind kind,
                   double p = 2, std::int64_t mean_count = -1);
/// sums * (1 / count) in place, the reciprocal taken in the tensor's
/// compute type as the CPU mean does; sums / 0 when count is 0.
void scale_by_count(Tensor& sums, std::int64_t count);
/// cpu::argmax on a CUDA tensor (first maximum; i64 out).
Tensor argmax(const Tensor& x, int dim, const Shape& out_shape);
/// cpu::softmax on a CUDA tensor.
Tensor softmax(const Tensor& x, int dim, bool log);
/// cpu::normalize on CUDA tensors (x, weight and bias on one device).
Tensor normalize(const Tensor& x, int normalized_ndim, const Tensor& weight, const Tensor& bias, double eps, bool rms);

}  // namespace dtensor::cuda_kernels
