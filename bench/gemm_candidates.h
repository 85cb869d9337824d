#pragma once
// bench/gemm's reference kernels: every CBLAS GEMM this machine has (OpenBLAS
// under each core type it knows, BLIS's serial and pthread builds) and
// Eigen, each in a child process of its own, so that OPENBLAS_CORETYPE
// (which OpenBLAS reads once when it is loaded) and BLIS_ARCH_TYPE can
// differ between them and no two BLAS libraries share a process. The parent asks a child for one
// timing at a time, alternating with the library's own, so that load from
// other processes hits all of them alike.
#include <cstdint>
#include <cstdio>
#include <string>
#include <sys/types.h>

namespace gbench {

/// One GEMM to time: C[m,n] = op(A) op(B); A is m x k (k x m when trans_a),
/// B is k x n (n x k when trans_b).
struct Shape {
  char dtype;  // 's' f32, 'd' f64
  std::int64_t m, n, k;
  bool trans_a, trans_b;
};

/// A reference kernel: how to load it, and the child that runs it.
struct Candidate {
  std::string name;     // column header, e.g. "ob-skx"
  std::string kind;     // "cblas", "dnnl" (oneDNN's dnnl_sgemm; no f64) or "eigen"
  std::string library;  // what dlopen opens (kinds "cblas" and "dnnl")
  std::string setting;  // "VAR=value" for the child (OPENBLAS_CORETYPE, BLIS_ARCH_TYPE); empty: none
  std::string info;     // what the child reports it loaded, e.g. "OpenBLAS ... SkylakeX"
  pid_t pid = -1;
  std::FILE* to = nullptr;
  std::FILE* from = nullptr;
};

/// Starts the child (the program `worker`, bench/gemm_worker); false, with
/// info saying why, when the library is not there.
bool start(Candidate& c, const std::string& worker);
/// The best time per call of one round of the shape in the child; infinity
/// where the child cannot run it (oneDNN has no f64 GEMM) or did not answer.
double time_in_child(Candidate& c, const Shape& s);
void stop(Candidate& c);

/// Seconds per call of fn: calls it until at least 2 ms have passed, so that
/// small shapes are not timed at the clock's resolution.
template <class Fn>
double seconds_per_call(Fn&& fn);

}  // namespace gbench

#include <chrono>

template <class Fn>
double gbench::seconds_per_call(Fn&& fn) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  std::int64_t calls = 0;
  double elapsed = 0;
  do {
    fn();
    ++calls;
    elapsed = std::chrono::duration<double>(clock::now() - t0).count();
  } while (elapsed < 2e-3);
  return elapsed / static_cast<double>(calls);
}
