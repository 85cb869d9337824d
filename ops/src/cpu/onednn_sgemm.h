#pragma once
// Internal: f32 GEMMs through oneDNN's dnnl_sgemm, where the machine has
// oneDNN (Debian's libdnnl2), opened at run time like OpenBLAS; the GEMM
// backends (gemm_openblas.cpp, gemm_eigen.cpp) ask it first for f32.
#include <cstdint>
#include <string_view>

namespace dtensor::cpu::onednn {

/// Whether oneDNN computes this f32 product: it is loaded, and the product
/// has at least kMinMultiplyAdds multiply-adds (below, OpenBLAS is faster).
bool takes(std::int64_t m, std::int64_t n, std::int64_t k);

/// C = op(A) op(B), or C += with `accumulate`; row-major, as cpu::gemm.
/// False where oneDNN returned an error: the caller computes it.
bool sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate);

/// "onednn 2.6.3 for f32 from 2^20 multiply-adds", or why oneDNN is not used.
std::string_view description();

}  // namespace dtensor::cpu::onednn
