// GEMM: the library's matmul/linear (call_op on plain Tensors, and the CPU
// backend's gemm alone) against every GEMM kernel this machine has, measured
// in the same run, single-threaded, printing GFLOP/s and the library's ratio
// to the best of them. Run with OPENBLAS_CORETYPE unset, as a user would:
//   build/bench/gemm [repetitions]
// The reference kernels run in child processes (gemm_candidates.h,
// bench/gemm_worker): OpenBLAS
// as it loads by default and under each core type it knows, BLIS's pthread
// build as it loads and with its skx sub-configuration forced, BLIS's serial
// build, all through their CBLAS layer, and Eigen.
#include <dtensor/dtensor.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gemm_candidates.h"
#include "dtensor/ops/detail/gemm.h"

using namespace dtensor;

namespace {

struct Row {
  const char* op;  // "matmul" (B is k x n) or "linear" (x W^T: B is n x k)
  std::int64_t m, n, k;
};

// The squares, and the tensor-parallel MLP's two GEMMs on one of two ranks
// (x 64x1024, W1 4096x1024 column-parallel, W2 1024x4096 row-parallel).
const Row kRows[] = {{"matmul", 64, 64, 64},       {"matmul", 256, 256, 256},  {"matmul", 1024, 1024, 1024},
                     {"matmul", 2048, 2048, 2048}, {"linear", 64, 2048, 1024}, {"linear", 64, 1024, 2048}};

std::vector<gbench::Candidate> candidates() {
  const std::string ob = "libopenblas.so.0", blis = "/usr/lib/x86_64-linux-gnu/blis-";
  auto make = [](std::string name, std::string kind, std::string library, std::string setting) {
    gbench::Candidate c;
    c.name = std::move(name), c.kind = std::move(kind), c.library = std::move(library), c.setting = std::move(setting);
    return c;
  };
  return {
      make("ob", "cblas", ob, ""),
      make("ob-skx", "cblas", ob, "OPENBLAS_CORETYPE=SkylakeX"),
      make("ob-cpl", "cblas", ob, "OPENBLAS_CORETYPE=Cooperlake"),
      make("ob-hsw", "cblas", ob, "OPENBLAS_CORETYPE=Haswell"),
      make("blis", "cblas", blis + "pthread/libblis.so.4", ""),
      make("blis-skx", "cblas", blis + "pthread/libblis.so.4", "BLIS_ARCH_TYPE=skx"),
      make("blis-ser", "cblas", blis + "serial/libblis.so.4", ""),
      make("eigen", "eigen", "", ""),
  };
}

double gflops(const Row& r, double seconds) {
  return seconds > 0 ? 2e-9 * static_cast<double>(r.m) * static_cast<double>(r.n) * static_cast<double>(r.k) / seconds
                     : 0;
}

/// One row: the library (call_op, then its gemm alone) and each candidate,
/// one timing each per round, best of `reps` rounds.
void row(const Row& r, DType dtype, int reps, std::vector<gbench::Candidate>& refs) {
  const bool linear = std::string_view(r.op) == "linear";
  Tensor a = Tensor::rand({r.m, r.k}, dtype, 1);
  Tensor b = linear ? Tensor::rand({r.n, r.k}, dtype, 2) : Tensor::rand({r.k, r.n}, dtype, 2);
  Tensor c = Tensor::empty({r.m, r.n}, dtype);
  auto library = [&] { c = call_op(r.op, {a, b}); };
  Tensor out = Tensor::empty({r.m, r.n}, dtype);
  auto backend = [&] {
    cpu::gemm(dtype, false, linear, r.m, r.n, r.k, a.data(), r.k, b.data(), linear ? r.k : r.n, out.data(), r.n);
  };
  const gbench::Shape shape{dtype == DType::Float32 ? 's' : 'd', r.m, r.n, r.k, linear};
  library();  // warm up: registry, first-call setup, page faults
  backend();
  double t_lib = 1e30, t_gemm = 1e30;
  std::vector<double> t_ref(refs.size(), 1e30);
  for (int rep = 0; rep < reps; ++rep) {
    t_lib = std::min(t_lib, gbench::seconds_per_call(library));
    t_gemm = std::min(t_gemm, gbench::seconds_per_call(backend));
    for (std::size_t i = 0; i < refs.size(); ++i) t_ref[i] = std::min(t_ref[i], gbench::time_in_child(refs[i], shape));
  }
  fmt::print("{:>6} {:>3} {:>4} {:>4} {:>4} {:>7.1f} {:>7.1f}", r.op, dtype == DType::Float32 ? "f32" : "f64", r.m, r.n,
             r.k, gflops(r, t_lib), gflops(r, t_gemm));
  std::size_t best = 0;
  for (std::size_t i = 0; i < refs.size(); ++i) {
    fmt::print(" {:>7.1f}", gflops(r, t_ref[i]));
    if (t_ref[i] < t_ref[best]) best = i;
  }
  if (refs.empty()) {
    fmt::print("\n");
    return;
  }
  fmt::print(" {:>7} {:>6.2f} {:>6.2f}\n", refs[best].name, t_ref[best] / t_lib, t_ref[best] / t_gemm);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  fmt::print("GEMM, one thread, GFLOP/s, best of {} rounds (OPENBLAS_CORETYPE={})\n", reps,
             coretype ? coretype : "unset");
  fmt::print("  lib: call_op (matmul or linear) on plain Tensors; gemm: the CPU backend alone, {}\n",
             cpu::gemm_backend());
  // The children's program sits next to this one.
  std::string worker = std::filesystem::read_symlink("/proc/self/exe").parent_path() / "gemm_worker";
  std::vector<gbench::Candidate> refs;
  for (auto& c : candidates()) {
    if (gbench::start(c, worker)) {
      fmt::print("  {}: {}{}\n", c.name, c.info, c.setting.empty() ? "" : " (" + c.setting + ")");
      refs.push_back(std::move(c));
    } else {
      fmt::print("  {}: not measured ({})\n", c.name, c.info);
    }
  }
  fmt::print("  best: the fastest of those; ratios: its time over the library's (lib/best, gemm/best)\n");
  fmt::print("{:>6} {:>3} {:>4} {:>4} {:>4} {:>7} {:>7}", "op", "dt", "m", "n", "k", "lib", "gemm");
  for (auto& c : refs) fmt::print(" {:>7}", c.name);
  fmt::print(" {:>7} {:>6} {:>6}\n", "best", "lib/b", "gemm/b");
  for (DType dtype : {DType::Float32, DType::Float64})
    for (const Row& r : kRows) row(r, dtype, reps, refs);
  for (auto& c : refs) gbench::stop(c);
  return 0;
}
