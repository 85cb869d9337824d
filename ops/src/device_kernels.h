#pragma once
// Internal: what each device gives the op families, one table per device.
// The families write each op's kernel once against a table (adapting
// KernelArgs to its entries) and bind it once per device (bind_kernels):
// OpDef::cpu_kernel from cpu_table(), OpDef::cuda_kernel from cuda_table().
// No kernel branches on a tensor's device. The CPU table lives in
// ops/src/cpu/device_kernels.cpp, the CUDA one in
// ops/src/cuda/device_kernels.cpp; a build without CUDA links
// ops/src/cuda/no_cuda.cpp, where cuda_table() is null, so the ops have
// no CUDA kernel and dispatch says so.
//
// CPU entries see f32, f64 and i64 only (dispatch widens bf16/f16 around
// them); CUDA entries see every dtype, on the current device and stream.
#include <cstdint>
#include <span>

#include "cpu/pointwise_kernels.h"
#include "cpu/reduction_kernels.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"
#include "dtensor/ops/op.h"

namespace dtensor::device {

struct Kernels {
  // -- pointwise (ops/src/pointwise.cpp): as pointwise::unary, binary, where.
  Tensor (*unary)(pointwise::Unary fn, const Tensor& x, double scalar);
  Tensor (*binary)(pointwise::Binary fn, const Tensor& a, const Tensor& b, const Shape& out_shape);
  Tensor (*where)(const Tensor& cond, const Tensor& a, const Tensor& b, const Shape& out_shape);

  // -- reduction (ops/src/reduction.cpp): as cpu::reduce_dims; with
  // mean_count >= 0 each result is also multiplied by 1 / mean_count in the
  // compute type (sums / 0 when it is 0).
  Tensor (*reduce_dims)(const Tensor& x, std::span<const bool> reduced, const Shape& out_shape, cpu::ReduceKind kind,
                        double p, std::int64_t mean_count);
  Tensor (*argmax)(const Tensor& x, int dim, const Shape& out_shape);
  Tensor (*softmax)(const Tensor& x, int dim, bool log);
  Tensor (*normalize)(const Tensor& x, int normalized_ndim, const Tensor& weight, const Tensor& bias, double eps,
                      bool rms);

  // -- data movement (views, einsum, to).
  /// dst[idx] = src[sum idx[d] * src_strides[d]] for every index of dst's
  /// shape (strides in elements; 0 broadcasts); dst is allocated.
  void (*gather_strided)(const Tensor& src, Tensor& dst, std::span<const std::int64_t> src_strides);
  /// dst = src converted elementwise to dst's dtype (same numel).
  void (*cast)(const Tensor& src, Tensor& dst);
  /// dst[r] = sum over c of src[r * cols + c].
  void (*sum_last)(const Tensor& src, Tensor& dst, std::int64_t rows, std::int64_t cols);
  /// y[r * cols + c] += bias[c].
  void (*add_bias)(Tensor& y, const Tensor& bias, std::int64_t rows, std::int64_t cols);
  /// `batch` row-major GEMMs as cuda_kernels::gemm_batched (strides in
  /// elements); `accumulate` (C += ...) only where gemm_accumulates.
  void (*gemm_batched)(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                       const void* a, std::int64_t lda, std::int64_t stride_a, const void* b, std::int64_t ldb,
                       std::int64_t stride_b, void* c, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch,
                       bool accumulate);
  /// Whether gemm_batched accumulates (C += ...) in one rounding for this
  /// dtype, so that einsum folds a bias into C instead of adding it in a
  /// pass of its own after (CUDA: every dtype; CPU: f32 and f64, OpenBLAS's
  /// beta = 1, which also spares the pass that zeroes C for beta = 0).
  bool (*gemm_accumulates)(DType dtype);

  // -- embedding (ops/src/embedding.cpp).
  /// out[..., :] = table[idx - row0, :] for indices in [row0, row0 + rows),
  /// zeros elsewhere; ValueError naming the first index outside [0, vocab).
  Tensor (*embedding)(const Tensor& indices, const Tensor& table, std::int64_t row0, std::int64_t vocab);
  /// out[r] = logits[r, targets[r] - col0] where that is in this shard, 0
  /// elsewhere; ValueError naming the first target outside [0, classes).
  Tensor (*pick)(const Tensor& logits, const Tensor& targets, std::int64_t col0, std::int64_t classes);
};

/// Each device's table of a kind (Kernels here, BackwardKernels in
/// backward_kernels.h): the CPU's, and the CUDA one, null in a build without
/// CUDA (ops/src/cuda/no_cuda.cpp). Each kind declares its own below.
template <class Table>
const Table& cpu_table();
template <class Table>
const Table* cuda_table();

/// The CPU table (ops/src/cpu/device_kernels.cpp).
template <>
const Kernels& cpu_table<Kernels>();
/// The CUDA table (ops/src/cuda/device_kernels.cpp).
template <>
const Kernels* cuda_table<Kernels>();

/// Sets def's kernel for every device this build has, each made by
/// make(const Table&) from that device's table of the kind.
template <class Table = Kernels, class Make>
void bind_kernels(OpDef& def, Make make) {
  def.cpu_kernel = make(cpu_table<Table>());
  if (const Table* k = cuda_table<Table>()) def.cuda_kernel = make(*k);
}

}  // namespace dtensor::device
