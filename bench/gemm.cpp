// GEMM: the library's matmul (call_op on plain Tensors) against bare
// OpenBLAS cblas_sgemm/dgemm on the same buffers, single-threaded, printing
// GFLOP/s and the ratio. Run: build/bench/gemm [repetitions]
//
// OpenBLAS is looked up at run time (the library links it when the build
// found it), so this program needs no BLAS headers or link flags of its own;
// without OpenBLAS it prints the library's figures alone.
#include <dtensor/dtensor.h>

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

using namespace dtensor;

namespace {

// CBLAS ABI (LP64 OpenBLAS): enums and blasint are int.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
using DgemmFn = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int, double, double*,
                         int);
using SetThreadsFn = void (*)(int);

void* blas_symbol(const char* name) {
  if (void* p = dlsym(RTLD_DEFAULT, name)) return p;
  static void* handle = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_GLOBAL);
  return handle ? dlsym(handle, name) : nullptr;
}

template <class Fn>
double best_seconds(int reps, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

/// One row: the library's op against the bare BLAS call it amounts to,
/// alternated so that load from other processes hits both alike.
void row(bool linear, DType dtype, std::int64_t n, int reps, SgemmFn sgemm, DgemmFn dgemm) {
  const char* op = linear ? "linear" : "matmul";
  Tensor a = Tensor::rand({n, n}, dtype, 1), b = Tensor::rand({n, n}, dtype, 2);
  Tensor c = Tensor::empty({n, n}, dtype);
  const int ni = static_cast<int>(n);
  const int tb = linear ? kTrans : kNoTrans;  // linear is x W^T
  auto bare = [&] {
    if (dtype == DType::Float32)
      sgemm(kRowMajor, kNoTrans, tb, ni, ni, ni, 1.0f, a.data_as<float>(), ni, b.data_as<float>(), ni, 0.0f,
            c.data_as<float>(), ni);
    else
      dgemm(kRowMajor, kNoTrans, tb, ni, ni, ni, 1.0, a.data_as<double>(), ni, b.data_as<double>(), ni, 0.0,
            c.data_as<double>(), ni);
  };
  auto library = [&] { c = call_op(op, {a, b}); };
  library();  // warm up: registry, first-call thread pinning, page faults
  if (sgemm) bare();
  double t_lib = 1e30, t_blas = 1e30;
  for (int r = 0; r < reps; ++r) {
    t_lib = std::min(t_lib, best_seconds(1, library));
    if (sgemm) t_blas = std::min(t_blas, best_seconds(1, bare));
  }
  const double gflop = 2e-9 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  if (sgemm)
    fmt::print("{:>6} {:>5} {:>5} {:>16.1f} {:>16.1f} {:>8.3f}\n", op, dtype, n, gflop / t_lib, gflop / t_blas,
               t_blas / t_lib);
  else
    fmt::print("{:>6} {:>5} {:>5} {:>16.1f} {:>16} {:>8}\n", op, dtype, n, gflop / t_lib, "-", "-");
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  auto sgemm = reinterpret_cast<SgemmFn>(blas_symbol("cblas_sgemm"));
  auto dgemm = reinterpret_cast<DgemmFn>(blas_symbol("cblas_dgemm"));
  if (auto set_threads = reinterpret_cast<SetThreadsFn>(blas_symbol("openblas_set_num_threads"))) set_threads(1);
  fmt::print("GEMM, one thread, best of {} (OPENBLAS_CORETYPE={}); OpenBLAS {}\n", reps,
             std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "unset",
             sgemm ? "found" : "not loaded");
  fmt::print("{:>6} {:>5} {:>5} {:>16} {:>16} {:>8}\n", "op", "dtype", "n", "library GFLOP/s", "OpenBLAS GFLOP/s",
             "ratio");
  for (DType dtype : {DType::Float32, DType::Float64})
    for (std::int64_t n : {1024, 2048}) row(false, dtype, n, reps, sgemm, dgemm);
  // linear hands W^T to the BLAS as a transposition flag, not a copy.
  for (DType dtype : {DType::Float32, DType::Float64}) row(true, dtype, 2048, reps, sgemm, dgemm);
  return 0;
}
