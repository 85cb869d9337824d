#pragma once
// Internal: the dense matrix product behind the einsum family. One backend
// per build, chosen by meson (ops/meson.build): gemm_openblas.cpp where
// OpenBLAS is found, gemm_eigen.cpp otherwise. Both compute int64 with
// Eigen, and both send large f32 products to oneDNN where the machine has
// it (src/cpu/onednn_sgemm.cpp).
#include <cstdint>
#include <string_view>

#include "dtensor/core/dtype.h"

namespace dtensor::cpu {

/// C[m,n] = op(A) op(B), all row-major; op(X) is X or its transpose.
/// A is m x k (k x m when trans_a) with leading dimension lda, B is k x n
/// (n x k when trans_b) with ldb; C is overwritten, or added to with
/// `accumulate` (C += op(A) op(B)). Any of m, n, k may be 0 (k = 0 gives
/// zeros, or leaves C). f32, f64 and i64.
void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
          std::int64_t lda, const void* b, std::int64_t ldb, void* c, std::int64_t ldc, bool accumulate = false);

/// Seconds the calling thread has spent in the GEMMs of CPU kernels
/// (matmul, linear, einsum, bmm and their backward) since it started: the
/// clock behind bench/train's `gemm` share of a step. Two steady_clock reads
/// per batched GEMM call, about 40 ns against a GEMM's microseconds.
double gemm_seconds_this_thread();

/// The backend f32/f64 run on and the kernel set it chose for this CPU, then
/// oneDNN's part, for people: e.g. "openblas (SkylakeX, chosen from CPU
/// features); onednn 2.6.3 for f32 from 2^20 multiply-adds",
/// "openblas (Prescott, loaded before dtensor, ...; slower than this CPU
/// allows: ...)", "eigen".
std::string_view gemm_backend();

/// Whether this product runs on oneDNN (f32 from 2^20 multiply-adds, where
/// libdnnl.so.2 is there; src/cpu/onednn_sgemm.cpp says why), for tests and
/// benches that must know which library computed it.
bool gemm_uses_onednn(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k);

/// The kernel set alone: OpenBLAS's core name ("SkylakeX", "Haswell",
/// "Prescott", as openblas_get_corename says), or "eigen".
std::string_view gemm_kernels();

}  // namespace dtensor::cpu
