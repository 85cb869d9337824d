// f32 GEMMs through oneDNN (onednn_sgemm.h).
//
// Measured with bench/gemm on one core of an AMD EPYC (2026-12-04), oneDNN
// 2.6.3's dnnl_sgemm was 2-14% faster than OpenBLAS 0.3.21's best core on
// 10 of the 12 GEMMs of the 10.9M GPT's step (512 tokens, d_model 384:
// forward, input and weight gradients) and on the large squares, and slower on the
// smallest products (64^3: 94 against 108 GFLOP/s). So f32 products from
// kMinMultiplyAdds go to oneDNN; f64 (which oneDNN lacks), int64 and the
// small ones stay with the build's backend. The choice is a function of the
// shape alone, so a product's bits never depend on timing.
//
// oneDNN runs on OpenMP (libgomp). Parallelism here comes from ranks, one
// thread each, like OpenBLAS's (gemm_openblas.cpp), so oneDNN must use one
// thread per call: where libgomp is not yet in the process, it is loaded
// with OMP_NUM_THREADS=1 in the environment for the duration of the dlopen
// (its constructor reads it once), unless the user set OMP_NUM_THREADS.
// Where the program already runs OpenMP (libgomp loaded before us), setting
// its thread count would change the user's own parallel regions, so oneDNN
// is not used at all and description() says why. The one side effect left:
// a program that loads OpenMP code only after the library (a plugin opened
// later) finds libgomp already loaded with one thread as its default, so
// its parallel regions need OMP_NUM_THREADS or num_threads to widen.
#include "onednn_sgemm.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include "dtensor/ops/detail/onednn_abi.h"

namespace dtensor::cpu::onednn {
namespace {

constexpr const char* kLibrary = "libdnnl.so.2";
constexpr const char* kGomp = "libgomp.so.1";
constexpr std::int64_t kMinMultiplyAdds = std::int64_t{1} << 20;

using onednn_abi::SgemmFn;
using onednn_abi::Version;
using onednn_abi::VersionFn;

struct OneDnn {
  SgemmFn sgemm = nullptr;  // null: not used
  std::string description;
};

OneDnn load() {
  OneDnn r;
  if (void* gomp = dlopen(kGomp, RTLD_NOW | RTLD_NOLOAD)) {
    dlclose(gomp);
    r.description = "onednn not used: the program already runs OpenMP, whose thread count it would change";
    return r;
  }
  const bool one_thread = std::getenv("OMP_NUM_THREADS") == nullptr;
  if (one_thread) setenv("OMP_NUM_THREADS", "1", 1);
  void* handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (one_thread) unsetenv("OMP_NUM_THREADS");
  if (!handle) {
    r.description = std::string("onednn not used: ") + kLibrary + " could not be opened (Debian: libdnnl2)";
    return r;
  }
  auto sgemm = reinterpret_cast<SgemmFn>(dlsym(handle, "dnnl_sgemm"));
  auto version = reinterpret_cast<VersionFn>(dlsym(handle, "dnnl_version"));
  if (!sgemm || !version) {
    r.description = std::string("onednn not used: ") + kLibrary + " lacks dnnl_sgemm or dnnl_version";
    return r;
  }
  const Version* v = version();
  r.sgemm = sgemm;
  r.description = "onednn " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
                  std::to_string(v->patch) + " for f32 from 2^20 multiply-adds";
  return r;
}

const OneDnn& onednn() {
  static const OneDnn o = load();
  return o;
}

// Opens oneDNN while the library loads, before the program's threads exist
// (the environment is changed only then).
[[maybe_unused]] const bool opened_at_load = (onednn(), true);

}  // namespace

bool takes(std::int64_t m, std::int64_t n, std::int64_t k) {
  // m, n, k are at most 2^31 each in practice; compare without overflow.
  if (!onednn().sgemm || m <= 0 || n <= 0 || k <= 0) return false;
  return static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) >=
         static_cast<double>(kMinMultiplyAdds);
}

bool sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate) {
  return onednn().sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb,
                        accumulate ? 1.0f : 0.0f, c, ldc) == 0;
}

std::string_view description() { return onednn().description; }

}  // namespace dtensor::cpu::onednn
