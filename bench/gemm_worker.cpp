// bench/gemm's child: one reference GEMM kernel (gemm_candidates.h), timed
// on request. A program of its own, without libdtensor, so that nothing but
// the environment bench/gemm gives it decides how the BLAS it opens loads.
//   gemm_worker cblas LIBRARY | gemm_worker dnnl LIBRARY | gemm_worker eigen
// reads "dtype m n k trans_a trans_b" lines, answers seconds per call ("inf"
// for a GEMM the library does not have: oneDNN has no f64).
#include <dlfcn.h>

#include <cstdint>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "gemm_candidates.h"
#include "dtensor/ops/detail/gemm_eigen_impl.h"
#include "dtensor/ops/detail/onednn_abi.h"

using gbench::Shape;

namespace {

// CBLAS ABI (LP64 OpenBLAS and BLIS alike): enums and int are int.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
using DgemmFn = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int, double, double*,
                         int);
using DnnlSgemmFn = dtensor::cpu::onednn_abi::SgemmFn;

/// What a loaded BLAS says about itself (its core type or sub-configuration).
std::string describe(void* handle) {
  using NameFn = char* (*)();
  if (auto core = reinterpret_cast<NameFn>(dlsym(handle, "openblas_get_corename"))) {
    auto config = reinterpret_cast<NameFn>(dlsym(handle, "openblas_get_config"));
    return std::string("OpenBLAS ") + (config ? config() : "") + ", core " + core();
  }
  using ArchFn = int (*)();
  using ArchNameFn = char* (*)(int);
  auto arch = reinterpret_cast<ArchFn>(dlsym(handle, "bli_arch_query_id"));
  auto arch_name = reinterpret_cast<ArchNameFn>(dlsym(handle, "bli_arch_string"));
  auto version = reinterpret_cast<NameFn>(dlsym(handle, "bli_info_get_version_str"));
  if (arch && arch_name) return std::string("BLIS ") + (version ? version() : "") + ", config " + arch_name(arch());
  return "?";
}

/// One thread, whatever the environment says: the library's default.
void single_thread(void* handle) {
  using SetFn = void (*)(int);
  if (auto f = reinterpret_cast<SetFn>(dlsym(handle, "openblas_set_num_threads"))) f(1);
  using BliSetFn = void (*)(std::int64_t);
  if (auto f = reinterpret_cast<BliSetFn>(dlsym(handle, "bli_thread_set_num_threads"))) f(1);
}

template <class T>
struct Buffers {
  std::vector<T> a, b, c;
  void fill(const Shape& s) {
    std::mt19937 gen(1);
    std::uniform_real_distribution<T> u(-1, 1);
    a.resize(static_cast<std::size_t>(s.m * s.k));
    b.resize(static_cast<std::size_t>(s.k * s.n));
    c.assign(static_cast<std::size_t>(s.m * s.n), T{});
    for (auto& x : a) x = u(gen);
    for (auto& x : b) x = u(gen);
  }
};

int worker_main(const std::string& kind, const std::string& library) {
  SgemmFn sgemm = nullptr;
  DgemmFn dgemm = nullptr;
  DnnlSgemmFn dnnl_sgemm = nullptr;
  if (kind == "dnnl") {
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      std::cout << "not loaded: " << dlerror() << std::endl;
      return 0;
    }
    dnnl_sgemm = reinterpret_cast<DnnlSgemmFn>(dlsym(handle, "dnnl_sgemm"));
    auto version = reinterpret_cast<dtensor::cpu::onednn_abi::VersionFn>(dlsym(handle, "dnnl_version"));
    if (!dnnl_sgemm || !version) {
      std::cout << "no dnnl_sgemm/dnnl_version in " << library << std::endl;
      return 0;
    }
    const auto* v = version();
    std::cout << "ok oneDNN " << v->major << '.' << v->minor << '.' << v->patch << " (f32 only)" << std::endl;
  } else if (kind == "cblas") {
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      std::cout << "not loaded: " << dlerror() << std::endl;
      return 0;
    }
    sgemm = reinterpret_cast<SgemmFn>(dlsym(handle, "cblas_sgemm"));
    dgemm = reinterpret_cast<DgemmFn>(dlsym(handle, "cblas_dgemm"));
    if (!sgemm || !dgemm) {
      std::cout << "no cblas_sgemm/dgemm in " << library << std::endl;
      return 0;
    }
    single_thread(handle);
    std::cout << "ok " << describe(handle) << std::endl;
  } else {
    std::cout << "ok Eigen " << EIGEN_WORLD_VERSION << '.' << EIGEN_MAJOR_VERSION << '.' << EIGEN_MINOR_VERSION
              << std::endl;
  }
  Buffers<float> fb;
  Buffers<double> db;
  Shape last{0, 0, 0, 0, false, false};
  Shape s{};
  int ta = 0, tb = 0;
  while (std::cin >> s.dtype >> s.m >> s.n >> s.k >> ta >> tb) {
    s.trans_a = ta != 0, s.trans_b = tb != 0;
    if (s.dtype == 'd' && dnnl_sgemm) {
      std::cout << "inf" << std::endl;
      continue;
    }
    const bool fresh = s.dtype != last.dtype || s.m != last.m || s.n != last.n || s.k != last.k ||
                       s.trans_a != last.trans_a || s.trans_b != last.trans_b;
    if (fresh && s.dtype == 's') fb.fill(s);
    if (fresh && s.dtype == 'd') db.fill(s);
    last = s;
    const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
    const int lda = s.trans_a ? m : k, ldb = s.trans_b ? k : n;
    const int op_a = s.trans_a ? kTrans : kNoTrans, op_b = s.trans_b ? kTrans : kNoTrans;
    auto call = [&] {
      if (s.dtype == 's') {
        if (dnnl_sgemm)
          dnnl_sgemm(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', m, n, k, 1.0f, fb.a.data(), lda, fb.b.data(), ldb,
                     0.0f, fb.c.data(), n);
        else if (sgemm)
          sgemm(kRowMajor, op_a, op_b, m, n, k, 1.0f, fb.a.data(), lda, fb.b.data(), ldb, 0.0f, fb.c.data(), n);
        else
          dtensor::cpu::eigen_gemm<float>(s.trans_a, s.trans_b, m, n, k, fb.a.data(), lda, fb.b.data(), ldb,
                                          fb.c.data(), n);
      } else {
        if (dgemm)
          dgemm(kRowMajor, op_a, op_b, m, n, k, 1.0, db.a.data(), lda, db.b.data(), ldb, 0.0, db.c.data(), n);
        else
          dtensor::cpu::eigen_gemm<double>(s.trans_a, s.trans_b, m, n, k, db.a.data(), lda, db.b.data(), ldb,
                                           db.c.data(), n);
      }
    };
    if (fresh) call();  // page faults, packing buffers, first-call setup
    std::cout << gbench::seconds_per_call(call) << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: gemm_worker cblas LIBRARY | gemm_worker eigen\n";
    return 2;
  }
  return worker_main(argv[1], argc > 2 ? argv[2] : "");
}
