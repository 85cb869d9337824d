// The GEMM backend with BLIS (Debian's libblis-dev, its pthread build): f32
// and f64 through BLIS's typed API, whose general strides take our row-major
// buffers and transposition flags as they are; int64 through Eigen.
//
// BLIS is linked statically and its symbols are kept out of libdtensor.so's
// exports (ops/meson.build), so that a program that also loads OpenBLAS or
// another BLIS (numpy, ScaLAPACK, bench/matmul) keeps its own sgemm_ and
// cblas_sgemm, and the library does not depend on which libblis.so.4 the
// system's alternatives point at.
//
// The sub-configuration (kernel set) is chosen from the CPU's features here
// rather than left to BLIS: BLIS 0.9.0 takes skx only when it can read the
// number of AVX-512 FMA units from the CPU's brand string, and a Xeon that
// reports itself as plain "Intel(R) Xeon(R) Processor" (as cloud machines
// do) gets haswell's AVX2 kernels, at about half the f32/f64 rate for large
// products. No environment variable is needed or read for this; the thread
// count is BLIS's own: BLIS_NUM_THREADS or OMP_NUM_THREADS when the user set
// them, one thread per caller otherwise.
#include <blis.h>

#include <string>

#include "gemm.h"
#include "gemm_eigen_impl.h"

namespace dtensor::cpu {
namespace {

bool has_avx512_for_skx() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

bool has_avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

/// The kernel set for this CPU: BLIS's own choice, raised to skx (AVX-512)
/// or haswell (AVX2 + FMA) where the features allow and BLIS chose a
/// narrower one. AMD's zen sets are kept as BLIS chose them.
arch_t choose_arch() {
  const arch_t own = bli_arch_query_id();
  const bool narrower_than_avx2 = own == BLIS_ARCH_SANDYBRIDGE || own == BLIS_ARCH_PENRYN || own == BLIS_ARCH_GENERIC;
  if ((own == BLIS_ARCH_HASWELL || narrower_than_avx2) && has_avx512_for_skx()) return BLIS_ARCH_SKX;
  if (narrower_than_avx2 && has_avx2_fma()) return BLIS_ARCH_HASWELL;
  return own;
}

struct Choice {
  cntx_t* context = nullptr;  // the chosen sub-configuration's native context
  std::string kernels;        // its name
  std::string description;
};

const Choice& choice() {
  static const Choice c = [] {
    bli_init();
    const arch_t own = bli_arch_query_id();
    const arch_t arch = choose_arch();
    Choice r;
    r.context = bli_gks_lookup_id(arch)[BLIS_NAT];
    r.kernels = bli_arch_string(arch);
    r.description = std::string("blis ") + bli_info_get_version_str() + " (" + bli_arch_string(arch) +
                    (arch == own ? ", BLIS's choice" : std::string(", chosen from CPU features; BLIS chose ") +
                                                           bli_arch_string(own)) +
                    ")";
    return r;
  }();
  return c;
}

trans_t trans(bool t) { return t ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE; }

}  // namespace

void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
          std::int64_t lda, const void* b, std::int64_t ldb, void* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (dtype == DType::Int64) {
    eigen_gemm<std::int64_t>(trans_a, trans_b, m, n, k, static_cast<const std::int64_t*>(a), lda,
                             static_cast<const std::int64_t*>(b), ldb, static_cast<std::int64_t*>(c), ldc);
    return;
  }
  // Row-major: row stride ld, column stride 1; BLIS takes op(A) as m x k.
  // k = 0 gives beta C = 0, which BLIS computes as a scaling of C.
  cntx_t* context = choice().context;
  if (dtype == DType::Float32) {
    float one = 1.0f, zero = 0.0f;
    bli_sgemm_ex(trans(trans_a), trans(trans_b), m, n, k, &one, const_cast<float*>(static_cast<const float*>(a)), lda, 1,
                 const_cast<float*>(static_cast<const float*>(b)), ldb, 1, &zero, static_cast<float*>(c), ldc, 1,
                 context, nullptr);
  } else if (dtype == DType::Float64) {
    double one = 1.0, zero = 0.0;
    bli_dgemm_ex(trans(trans_a), trans(trans_b), m, n, k, &one, const_cast<double*>(static_cast<const double*>(a)),
                 lda, 1, const_cast<double*>(static_cast<const double*>(b)), ldb, 1, &zero, static_cast<double*>(c), ldc,
                 1, context, nullptr);
  } else {
    visit_dtype(dtype, [](auto) {});  // throws the DTypeError naming the dtype
  }
}

std::string_view gemm_backend() { return choice().description; }

std::string_view gemm_kernels() { return choice().kernels; }

}  // namespace dtensor::cpu
