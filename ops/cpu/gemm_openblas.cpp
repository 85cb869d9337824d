// The GEMM backend with OpenBLAS, where BLIS is missing: cblas_sgemm/dgemm
// for f32/f64; int64 through Eigen. OpenBLAS picks its kernels for the CPU
// when it is loaded, by CPU model: Debian 12's 0.3.21 does not know recent
// Xeons and runs them on its SSE3 "Prescott" kernels (4-5x slower) unless
// OPENBLAS_CORETYPE is set, which it reads only then. gemm_backend() names
// the core it runs, so that this is never silent.
#include <cblas.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "gemm.h"
#include "gemm_eigen_impl.h"

namespace dtensor::cpu {
namespace {

// One OpenBLAS thread per caller unless the user asked otherwise through the
// environment. Parallelism here comes from ranks (a thread per rank under
// run_threads, a process per rank under MPI): a BLAS that also spreads every
// rank's GEMM over all cores oversubscribes them, and OpenBLAS's pthread
// build runs concurrent threaded calls one at a time on its single pool, so
// the ranks would wait on each other.
void pin_threads_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!std::getenv("OPENBLAS_NUM_THREADS") && !std::getenv("GOTO_NUM_THREADS") && !std::getenv("OMP_NUM_THREADS"))
      openblas_set_num_threads(1);
  });
}

}  // namespace

void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
          std::int64_t lda, const void* b, std::int64_t ldb, void* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (dtype == DType::Int64) {
    eigen_gemm<std::int64_t>(trans_a, trans_b, m, n, k, static_cast<const std::int64_t*>(a), lda,
                             static_cast<const std::int64_t*>(b), ldb, static_cast<std::int64_t*>(c), ldc);
    return;
  }
  if (k == 0) {
    visit_dtype(dtype, [&](auto zero) {
      using T = decltype(zero);
      T* out = static_cast<T*>(c);
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) out[i * ldc + j] = T{};
    });
    return;
  }
  pin_threads_once();
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const auto M = static_cast<blasint>(m), N = static_cast<blasint>(n), K = static_cast<blasint>(k);
  if (dtype == DType::Float32) {
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, static_cast<const float*>(a), static_cast<blasint>(lda),
                static_cast<const float*>(b), static_cast<blasint>(ldb), 0.0f, static_cast<float*>(c),
                static_cast<blasint>(ldc));
  } else if (dtype == DType::Float64) {
    cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, static_cast<const double*>(a), static_cast<blasint>(lda),
                static_cast<const double*>(b), static_cast<blasint>(ldb), 0.0, static_cast<double*>(c),
                static_cast<blasint>(ldc));
  } else {
    visit_dtype(dtype, [](auto) {});  // throws the DTypeError naming the dtype
  }
}

std::string_view gemm_kernels() {
  static const std::string core = openblas_get_corename();
  return core;
}

std::string_view gemm_backend() {
  static const std::string text = std::string("openblas (core ") + std::string(gemm_kernels()) + ")";
  return text;
}

}  // namespace dtensor::cpu
