#pragma once
// Internal to the CUDA build: the GEMM that cuBLAS lacks (int64), defined in
// gemm_kernels.cu and called by gemm_cublas.cpp with the same row-major
// contract as cuda_kernels::gemm_batched.
#include <cstdint>

namespace dtensor::cuda_kernels::detail {

/// Row-major int64 batched GEMM on the calling thread's stream; m, n, k >= 1.
/// With `accumulate`, C += op(A) op(B).
void gemm_i64(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const std::int64_t* a,
              std::int64_t lda, std::int64_t stride_a, const std::int64_t* b, std::int64_t ldb, std::int64_t stride_b,
              std::int64_t* c, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch, bool accumulate);

}  // namespace dtensor::cuda_kernels::detail
