// The GEMM backend where OpenBLAS is absent: Eigen for every dtype, but
// large f32 products, which go to oneDNN where it is there (onednn_sgemm.h).
#include <string>

#include "dtensor/ops/detail/gemm.h"
#include "dtensor/ops/detail/gemm_eigen_impl.h"
#include "onednn_sgemm.h"

namespace dtensor::cpu {

void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
          std::int64_t lda, const void* b, std::int64_t ldb, void* c, std::int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (dtype == DType::Float32 && onednn::takes(m, n, k) &&
      onednn::sgemm(trans_a, trans_b, m, n, k, static_cast<const float*>(a), lda, static_cast<const float*>(b), ldb,
                    static_cast<float*>(c), ldc, accumulate))
    return;
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    eigen_gemm<T>(trans_a, trans_b, m, n, k, static_cast<const T*>(a), lda, static_cast<const T*>(b), ldb,
                  static_cast<T*>(c), ldc, accumulate);
  });
}

std::string_view gemm_backend() {
  static const std::string both = "eigen; " + std::string(onednn::description());
  return both;
}

bool gemm_uses_onednn(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k) {
  return dtype == DType::Float32 && onednn::takes(m, n, k);
}

std::string_view gemm_kernels() { return "eigen"; }

}  // namespace dtensor::cpu
