#pragma once
// Internal: Eigen's GEMM on row-major buffers, shared by both backends.
#include <Eigen/Core>

#include <cstdint>

namespace dtensor::cpu {

template <class T>
void eigen_gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a,
                std::int64_t lda, const T* b, std::int64_t ldb, T* c, std::int64_t ldc, bool accumulate = false) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using CMap = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
  using OMap = Eigen::Map<Mat, 0, Eigen::OuterStride<>>;
  OMap out(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0) {
    if (!accumulate) out.setZero();
    return;
  }
  // A stored as (rows x cols) row-major; transposition is a view.
  CMap am(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  CMap bm(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  auto store = [&](const auto& product) {
    if (accumulate)
      out.noalias() += product;
    else
      out.noalias() = product;
  };
  if (!trans_a && !trans_b)
    store(am * bm);
  else if (trans_a && !trans_b)
    store(am.transpose() * bm);
  else if (!trans_a && trans_b)
    store(am * bm.transpose());
  else
    store(am.transpose() * bm.transpose());
}

}  // namespace dtensor::cpu
