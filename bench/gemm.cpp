// GEMM: the library's matmul/linear (call_op on plain Tensors, and the CPU
// backend's gemm alone) against every GEMM kernel this machine has, measured
// in the same run, single-threaded, printing GFLOP/s and the library's ratio
// to the best of them. Run with OPENBLAS_CORETYPE unset, as a user would:
//   build/bench/gemm [repetitions]
// The reference kernels run in child processes (gemm_candidates.h,
// bench/gemm_worker): OpenBLAS
// as it loads by default and under each core type it knows, BLIS as it
// loads and with its skx sub-configuration forced, both through their CBLAS
// layer, oneDNN's dnnl_sgemm (f32 only) and
// Eigen; then every GEMM shape of bench/train's GPT step in f32.
#include <dtensor/dtensor.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <filesystem>
#include <string>
#include <vector>

#include "gemm_candidates.h"
#include "dtensor/ops/detail/gemm.h"

using namespace dtensor;

namespace {

struct Row {
  // "matmul": A B (B is k x n); "linear": x W^T (B is n x k); "tn": A^T B
  // (A is k x m), the weight gradient dW = dY^T X, which call_op reaches
  // only inside autograd (so the row has no `lib` column).
  const char* op;
  std::int64_t m, n, k;
  const char* what = "";  // the GPT's use of the shape
};

// The squares, and the tensor-parallel MLP's two GEMMs on one of two ranks
// (x 64x1024, W1 4096x1024 column-parallel, W2 1024x4096 row-parallel).
const Row kRows[] = {{"matmul", 64, 64, 64},       {"matmul", 256, 256, 256},  {"matmul", 1024, 1024, 1024},
                     {"matmul", 2048, 2048, 2048}, {"linear", 64, 2048, 1024}, {"linear", 64, 1024, 2048}};

// Every GEMM of bench/train's 10.9M GPT step on one rank (512 tokens,
// d_model 384, MLP 1536, vocab 256) but attention's per-head products:
// forward, input gradient, weight gradient.
const Row kGptRows[] = {
    {"linear", 512, 384, 384, "q,k,v,proj"},  {"matmul", 512, 384, 384, "q,k,v,proj dX"},
    {"tn", 384, 384, 512, "q,k,v,proj dW"},   {"linear", 512, 1536, 384, "fc"},
    {"matmul", 512, 384, 1536, "fc dX"},      {"tn", 1536, 384, 512, "fc dW"},
    {"linear", 512, 384, 1536, "mlp proj"},   {"matmul", 512, 1536, 384, "mlp proj dX"},
    {"tn", 384, 1536, 512, "mlp proj dW"},    {"linear", 512, 256, 384, "lm_head"},
    {"matmul", 512, 384, 256, "lm_head dX"},  {"tn", 256, 384, 512, "lm_head dW"},
};

std::vector<gbench::Candidate> candidates() {
  // BLIS: whichever build Debian's alternatives point libblis.so.4 at
  // (libblis-dev brings the OpenMP one; libblis4-pthread, -serial the others).
  const std::string ob = "libopenblas.so.0", blis = "libblis.so.4";
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
      make("blis", "cblas", blis, ""),
      make("blis-skx", "cblas", blis, "BLIS_ARCH_TYPE=skx"),
      make("onednn", "dnnl", "libdnnl.so.2", "OMP_NUM_THREADS=1"),
      make("eigen", "eigen", "", ""),
  };
}

double gflops(const Row& r, double seconds) {
  return seconds > 0 ? 2e-9 * static_cast<double>(r.m) * static_cast<double>(r.n) * static_cast<double>(r.k) / seconds
                     : 0;
}

/// One row: the library (call_op, then its gemm alone) and each candidate,
/// one timing each per round, best of `reps` rounds. Returns gemm/best.
double row(const Row& r, DType dtype, int reps, std::vector<gbench::Candidate>& refs) {
  const std::string_view op = r.op;
  const bool linear = op == "linear", tn = op == "tn";
  Tensor a = tn ? Tensor::rand({r.k, r.m}, dtype, 1) : Tensor::rand({r.m, r.k}, dtype, 1);
  Tensor b = linear ? Tensor::rand({r.n, r.k}, dtype, 2) : Tensor::rand({r.k, r.n}, dtype, 2);
  Tensor c = Tensor::empty({r.m, r.n}, dtype);
  auto library = [&] { c = call_op(r.op, {a, b}); };
  Tensor out = Tensor::empty({r.m, r.n}, dtype);
  auto backend = [&] {
    cpu::gemm(dtype, tn, linear, r.m, r.n, r.k, a.data(), tn ? r.m : r.k, b.data(), linear ? r.k : r.n, out.data(),
              r.n);
  };
  const gbench::Shape shape{dtype == DType::Float32 ? 's' : 'd', r.m, r.n, r.k, tn, linear};
  if (!tn) library();  // warm up: registry, first-call setup, page faults
  backend();
  constexpr double kNone = std::numeric_limits<double>::infinity();
  double t_lib = kNone, t_gemm = kNone;
  std::vector<double> t_ref(refs.size(), kNone);
  for (int rep = 0; rep < reps; ++rep) {
    if (!tn) t_lib = std::min(t_lib, gbench::seconds_per_call(library));
    t_gemm = std::min(t_gemm, gbench::seconds_per_call(backend));
    for (std::size_t i = 0; i < refs.size(); ++i) t_ref[i] = std::min(t_ref[i], gbench::time_in_child(refs[i], shape));
  }
  auto cell = [&](double t) { return std::isfinite(t) ? fmt::format("{:.1f}", gflops(r, t)) : std::string("-"); };
  fmt::print("{:>6} {:>3} {:>4} {:>4} {:>4} {:>7} {:>7}", r.op, dtype == DType::Float32 ? "f32" : "f64", r.m, r.n, r.k,
             cell(t_lib), cell(t_gemm));
  std::size_t best = 0;
  for (std::size_t i = 0; i < refs.size(); ++i) {
    fmt::print(" {:>7}", cell(t_ref[i]));
    if (t_ref[i] < t_ref[best]) best = i;
  }
  if (refs.empty() || !std::isfinite(t_ref[best])) {
    fmt::print(" {}\n", r.what);
    return 1;
  }
  auto ratio = [&](double t) { return std::isfinite(t) ? fmt::format("{:.2f}", t_ref[best] / t) : std::string("-"); };
  fmt::print(" {:>7} {:>6} {:>6} {}\n", refs[best].name, ratio(t_lib), ratio(t_gemm), r.what);
  std::fflush(stdout);
  return t_ref[best] / t_gemm;
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
  fmt::print("the 10.9M GPT's GEMMs (bench/train), f32:\n");
  double worst = 1e30;
  for (const Row& r : kGptRows) worst = std::min(worst, row(r, DType::Float32, reps, refs));
  fmt::print("GPT shapes: the CPU backend's worst gemm/best is {:.2f} (goal: at least 0.95)\n", worst);
  for (auto& c : refs) gbench::stop(c);
  return 0;
}
