#pragma once
// Internal to the CUDA build: the CUDA kernels behind the einsum, shape and
// embedding families, defined in gemm_cublas.cpp, gemm_kernels.cu,
// shape_kernels.cu and embedding_kernels.cu and reached through the CUDA
// table (device_kernels.cpp, see ops/src/device_kernels.h).
//
// Every pointer is device memory on the calling thread's current device, and
// everything runs in stream order on dtensor::cuda::stream() (the calling
// thread's stream); nothing here synchronises unless it says so.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <fmt/format.h>

#include "dtensor/core/dtype.h"
#include "dtensor/core/error.h"
#include "dtensor/core/tensor.h"

namespace dtensor::cuda_kernels {

// ---- GEMM (gemm_cublas.cpp) ---------------------------------------------------

/// C[m,n] = op(A) op(B), all row-major, as cpu::gemm (ops/include/dtensor/ops/detail/gemm.h): A is
/// m x k (k x m when trans_a) with leading dimension lda, B is k x n (n x k
/// when trans_b) with ldb; C is overwritten. k = 0 gives zeros; m = 0 or
/// n = 0 does nothing. f32, f64, bf16 and f16 through cuBLAS (bf16/f16 in
/// and out, accumulated in f32), i64 by a plain CUDA kernel. DeviceError
/// naming the cuBLAS call on failure.
void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
          std::int64_t lda, const void* b, std::int64_t ldb, void* c, std::int64_t ldc);

/// `batch` products as gemm, the i-th on a + i*stride_a, b + i*stride_b and
/// c + i*stride_c (strides in elements): one cuBLAS call. With
/// `accumulate`, C += op(A) op(B) instead (cuBLAS beta = 1: the sum is
/// formed in the compute type and C rounded once; k = 0 leaves C as is).
void gemm_batched(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                  const void* a, std::int64_t lda, std::int64_t stride_a, const void* b, std::int64_t ldb,
                  std::int64_t stride_b, void* c, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch,
                  bool accumulate = false);

/// Whether f32 GEMMs may use TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32).
/// Off by default, so that f32 results agree with the CPU to f32 rounding;
/// TF32 keeps a 10-bit mantissa and is several times faster on Hopper.
/// Process-wide; read at each call.
void set_allow_tf32(bool allow);
bool allow_tf32();

// ---- Shape kernels (shape_kernels.cu) -----------------------------------------

/// dst[idx] = src[sum idx[d] * src_strides[d]] for every index of the
/// row-major `out_shape` (strides in elements; a stride 0 broadcasts, a
/// repeated stride takes a diagonal). Elements of `itemsize` bytes (1, 2, 4
/// or 8). Dims are merged where the strides allow; a transpose of the last
/// two dims (batched or not) takes a tiled shared-memory path, a plain copy
/// is a cudaMemcpyAsync.
void gather_strided(const void* src, void* dst, std::span<const std::int64_t> out_shape,
                    std::span<const std::int64_t> src_strides, std::size_t itemsize);

/// dst[r] = sum over c of src[r * cols + c], for r < rows (bf16/f16
/// accumulate in f32 and round once). Any dtype.
void sum_last(DType dtype, const void* src, void* dst, std::int64_t rows, std::int64_t cols);

/// y[r * cols + c] += bias[c] for r < rows (bf16/f16 add in f32, round once).
void add_bias(DType dtype, void* y, const void* bias, std::int64_t rows, std::int64_t cols);

// ---- Embedding kernels (embedding_kernels.cu) -----------------------------------

/// out[n, :] = table[indices[n] - row0, :] where row0 <= indices[n] <
/// row0 + rows, zeros elsewhere (another shard's row), for n < count; the
/// table shard is [rows, cols] of `itemsize`-byte elements. An index outside
/// [0, vocab) throws ValueError naming the first such index, as the CPU
/// kernel does: the check waits for the stream once.
void embedding(const std::int64_t* indices, std::int64_t count, const void* table, std::int64_t row0, std::int64_t rows,
               std::int64_t cols, std::int64_t vocab, std::size_t itemsize, void* out);

/// out[r] = logits[r, targets[r] - col0] where col0 <= targets[r] < col0 +
/// cols, zero elsewhere, for r < n; logits is an [n, cols] shard of
/// `itemsize`-byte elements. A target outside [0, classes) throws ValueError
/// naming the first such target (the check waits for the stream once).
void pick(const void* logits, const std::int64_t* targets, std::int64_t n, std::int64_t cols, std::int64_t col0,
          std::int64_t classes, std::size_t itemsize, void* out);

}  // namespace dtensor::cuda_kernels
