// The GEMM backend with OpenBLAS: cblas_sgemm/dgemm for f32/f64; int64
// through Eigen.
//
// OpenBLAS picks its kernels once, when it is loaded, by CPU model, and
// Debian 12's 0.3.21 does not know recent Xeons that report themselves only
// as "Intel(R) Xeon(R) Processor" (as cloud machines do): it runs them on its
// SSE3 "Prescott" kernels, 4-8x slower, unless OPENBLAS_CORETYPE is set
// before it loads. So the library does not link OpenBLAS: it opens it with
// dlopen while it is itself being loaded, after choosing the core type from
// the CPU's features (__builtin_cpu_supports) when the user has not set one.
// Measured against BLIS 0.9.0 with its AVX-512 kernels forced (bench/gemm),
// OpenBLAS's SkylakeX kernels are as fast on large products and 1.5-3x
// faster on small and skinny ones (m = 64, a tensor-parallel MLP's).
//
// Where OpenBLAS was loaded before the library (a program linking it, numpy)
// its core is fixed: the library uses it as it is, names its core in
// gemm_backend(), and warns once on stderr when it is narrower than the CPU.
// Where OpenBLAS cannot be opened at all, f32/f64 fall back to Eigen.
// Large f32 products go to oneDNN where it is there (onednn_sgemm.h).
#include <cblas.h>
#include <dlfcn.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "dtensor/ops/detail/gemm.h"
#include "dtensor/ops/detail/gemm_eigen_impl.h"
#include "onednn_sgemm.h"

namespace dtensor::cpu {
namespace {

constexpr const char* kOpenBlas = "libopenblas.so.0";

bool has_avx512_for_skylakex() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

bool has_avx2_fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

/// OPENBLAS_CORETYPE for this CPU, from its features; null where OpenBLAS's
/// own choice by model is as good (CPUs without AVX2, which it knows).
/// Every AVX-512 CPU gets SkylakeX, never Cooperlake: the two share their
/// sgemm/dgemm kernels (Cooperlake adds only bf16 ones, which nothing here
/// calls), and 0.3.21 takes a forced Cooperlake only where its own bf16
/// check passes, falling back to Haswell's AVX2 kernels where it does not
/// (seen here: forced Cooperlake on an AVX2 CPU runs "Haswell").
const char* core_for_this_cpu() {
  __builtin_cpu_init();
  if (has_avx512_for_skylakex()) return "SkylakeX";
  if (has_avx2_fma()) return __builtin_cpu_is("amd") ? "Zen" : "Haswell";
  return nullptr;
}

/// Whether a core OpenBLAS runs uses narrower vectors than the CPU has. A
/// DYNAMIC_ARCH build names its core in mixed case ("SkylakeX"), a build for
/// one target in upper case ("SKYLAKEX"): compared without case.
bool narrower_than_cpu(std::string core) {
  __builtin_cpu_init();
  for (char& c : core) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool avx512 = core == "skylakex" || core == "cooperlake" || core == "sapphirerapids";
  const bool avx2 = avx512 || core == "haswell" || core == "zen";
  if (has_avx512_for_skylakex()) return !avx512;
  if (has_avx2_fma()) return !avx2;
  return false;
}

bool user_set_threads() {
  return std::getenv("OPENBLAS_NUM_THREADS") || std::getenv("GOTO_NUM_THREADS") || std::getenv("OMP_NUM_THREADS");
}

struct OpenBlas {
  decltype(&cblas_sgemm) sgemm = nullptr;  // null: OpenBLAS is not there, Eigen computes
  decltype(&cblas_dgemm) dgemm = nullptr;
  std::string kernels = "eigen";
  std::string description;
};

void* open_choosing_core(std::string& how) {
  // The variables go into the environment only for the duration of the
  // dlopen, which runs OpenBLAS's constructor (the one place it reads
  // them); this runs while the library itself is loaded, before the
  // program's threads exist.
  const char* user_core = std::getenv("OPENBLAS_CORETYPE");
  const char* core = user_core ? nullptr : core_for_this_cpu();
  // One thread per caller unless the user asked otherwise through the
  // environment. Parallelism here comes from ranks (a thread per rank under
  // run_threads, a process per rank under MPI): a BLAS that also spreads
  // every rank's GEMM over all cores oversubscribes them, and OpenBLAS's
  // pthread build runs concurrent threaded calls one at a time on its single
  // pool, so the ranks would wait on each other. Set at load, OpenBLAS also
  // starts no pool of idle threads.
  const bool one_thread = !user_set_threads();
  if (core) setenv("OPENBLAS_CORETYPE", core, 1);
  if (one_thread) setenv("OPENBLAS_NUM_THREADS", "1", 1);
  void* handle = dlopen(kOpenBlas, RTLD_NOW | RTLD_LOCAL);
  if (core) unsetenv("OPENBLAS_CORETYPE");
  if (one_thread) unsetenv("OPENBLAS_NUM_THREADS");
  how = user_core ? "OPENBLAS_CORETYPE set by the user" : core ? "chosen from CPU features" : "OpenBLAS's own choice";
  return handle;
}

OpenBlas load() {
  OpenBlas r;
  std::string how;
  void* handle = dlopen(kOpenBlas, RTLD_NOW | RTLD_NOLOAD);
  const bool loaded_before = handle != nullptr;
  if (loaded_before)
    how = "loaded before dtensor, which could not choose its core";
  else
    handle = open_choosing_core(how);
  if (!handle) {
    r.description = std::string("eigen (") + kOpenBlas + " could not be opened: " + dlerror() + ")";
    return r;
  }
  r.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(handle, "cblas_sgemm"));
  r.dgemm = reinterpret_cast<decltype(&cblas_dgemm)>(dlsym(handle, "cblas_dgemm"));
  using NameFn = char* (*)();
  auto corename = reinterpret_cast<NameFn>(dlsym(handle, "openblas_get_corename"));
  using SetFn = void (*)(int);
  auto set_threads = reinterpret_cast<SetFn>(dlsym(handle, "openblas_set_num_threads"));
  if (!r.sgemm || !r.dgemm || !corename) {
    r.sgemm = nullptr, r.dgemm = nullptr;
    r.description = std::string("eigen (") + kOpenBlas + " lacks cblas_sgemm/dgemm)";
    return r;
  }
  if (set_threads && !user_set_threads()) set_threads(1);
  r.kernels = corename();
  r.description = "openblas (" + r.kernels + ", " + how + ")";
  if (loaded_before && narrower_than_cpu(r.kernels)) {
    const char* core = core_for_this_cpu();
    r.description += "; slower than this CPU allows: set OPENBLAS_CORETYPE=" + std::string(core ? core : "") +
                     " before OpenBLAS loads";
    std::fprintf(stderr, "dtensor: GEMM runs %s\n", r.description.c_str());
  }
  return r;
}

const OpenBlas& openblas() {
  static const OpenBlas o = load();
  return o;
}

// Opens OpenBLAS while the library loads (see open_choosing_core).
[[maybe_unused]] const bool opened_at_load = (openblas(), true);

template <class T>
void zero_fill(T* c, std::int64_t m, std::int64_t n, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = T{};
}

}  // namespace

void gemm(DType dtype, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
          std::int64_t lda, const void* b, std::int64_t ldb, void* c, std::int64_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  if (dtype == DType::Float32 && onednn::takes(m, n, k) &&
      onednn::sgemm(trans_a, trans_b, m, n, k, static_cast<const float*>(a), lda, static_cast<const float*>(b), ldb,
                    static_cast<float*>(c), ldc, accumulate))
    return;
  const OpenBlas& blas = openblas();
  if (dtype == DType::Int64 || !blas.sgemm) {
    visit_dtype(dtype, [&](auto zero) {
      using T = decltype(zero);
      eigen_gemm<T>(trans_a, trans_b, m, n, k, static_cast<const T*>(a), lda, static_cast<const T*>(b), ldb,
                    static_cast<T*>(c), ldc, accumulate);
    });
    return;
  }
  if (k == 0) {
    if (!accumulate) visit_dtype(dtype, [&](auto zero) { zero_fill(static_cast<decltype(zero)*>(c), m, n, ldc); });
    return;
  }
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  const auto M = static_cast<blasint>(m), N = static_cast<blasint>(n), K = static_cast<blasint>(k);
  const int beta = accumulate ? 1 : 0;  // C += or C =
  if (dtype == DType::Float32) {
    blas.sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, static_cast<const float*>(a), static_cast<blasint>(lda),
               static_cast<const float*>(b), static_cast<blasint>(ldb), static_cast<float>(beta),
               static_cast<float*>(c), static_cast<blasint>(ldc));
  } else if (dtype == DType::Float64) {
    blas.dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, static_cast<const double*>(a), static_cast<blasint>(lda),
               static_cast<const double*>(b), static_cast<blasint>(ldb), static_cast<double>(beta),
               static_cast<double*>(c), static_cast<blasint>(ldc));
  } else {
    visit_dtype(dtype, [](auto) {});  // throws the DTypeError naming the dtype
  }
}

std::string_view gemm_backend() {
  static const std::string both = openblas().description + "; " + std::string(onednn::description());
  return both;
}

bool gemm_uses_onednn(DType dtype, std::int64_t m, std::int64_t n, std::int64_t k) {
  return dtype == DType::Float32 && onednn::takes(m, n, k);
}

std::string_view gemm_kernels() { return openblas().kernels; }

}  // namespace dtensor::cpu
