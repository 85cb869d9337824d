// Distributed matmul C = A @ B of two NxN f64 matrices on the processes of an
// MPI job: dtensor's matmul on DTensors, next to ScaLAPACK's pdgemm on the
// same processes and a single-process OpenBLAS dgemm, all in the same run.
//
//   mpirun -np 2 build/bench/matmul [--n=2048,4096] [--quick] [--reps=R] [--block=NB]
//   --quick: N = 1024 and 2048.
//
// Without an MPI launcher it says how to start it and exits 0: pdgemm, the
// point of comparison, needs MPI processes.
//
// The DTensor rows, written as a user would on a 1-D mesh of all processes:
//   S(0) @ S(0)  both operands row-sharded, the way pdgemm holds them: no
//                process has more than its share of A or B. The op's
//                propagation picks the strategy (printed) and the timed call
//                includes the redistribution it needs, plus bringing C to
//                S(0) if the chosen strategy leaves it elsewhere, so that
//                every row ends with the complete C distributed.
//   S(0) @ R     the Megatron-style layout: B already replicated, C = S(0)
//                with no communication; the local GEMM alone.
//   S(0) @ S(0).redistribute(R)
//                the same operands as the first row, with the user asking
//                for B whole first (one all_gather) instead of leaving the
//                choice to propagation.
// The local kernel is OpenBLAS pinned to one thread, so each process uses
// one core, as each pdgemm process does.
//
// Each repetition runs every variant once, in an order that rotates from one
// repetition to the next, so that all see the same machine load. A time is
// the slowest process's, from leaving a barrier to the return of its call;
// the table shows the median over the repetitions after one warm-up. The
// single-process BLAS runs on rank 0 while the other ranks sleep in a
// barrier, so they leave the cores to it.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <cblas.h>
#include <dtensor/dtensor.h>
#include <mpi.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace dtensor;

// ScaLAPACK and BLACS C entry points (the Debian package ships no header).
extern "C" {
void Cblacs_get(int context, int what, int* value);
void Cblacs_gridinit(int* context, const char* order, int nprow, int npcol);
void Cblacs_gridinfo(int context, int* nprow, int* npcol, int* myrow, int* mycol);
void Cblacs_gridexit(int context);
int numroc_(const int* n, const int* nb, const int* iproc, const int* isrcproc, const int* nprocs);
void descinit_(int* desc, const int* m, const int* n, const int* mb, const int* nb, const int* irsrc, const int* icsrc,
               const int* ictxt, const int* lld, int* info);
void pdgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const double* alpha,
             const double* a, const int* ia, const int* ja, const int* desca, const double* b, const int* ib,
             const int* jb, const int* descb, const double* beta, double* c, const int* ic, const int* jc,
             const int* descc);
}

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<std::int64_t> sizes{2048, 4096};
  int reps = 3;
  int block = 128;
};

std::int64_t parse_positive(std::string_view flag, std::string_view text) {
  std::int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 1)
    throw ValueError(fmt::format("[matmul] {}'{}': expected a whole number >= 1", flag, text));
  return value;
}

Options parse_options(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--quick") {
      opt.sizes = {1024, 2048};
    } else if (arg.starts_with("--n=")) {
      opt.sizes.clear();
      std::string_view list = arg.substr(4);
      while (!list.empty()) {
        const auto comma = list.find(',');
        opt.sizes.push_back(parse_positive("--n=", list.substr(0, comma)));
        list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
      }
      if (opt.sizes.empty()) throw ValueError("[matmul] --n=: expected one or more sizes, e.g. --n=2048,4096");
    } else if (arg.starts_with("--reps=")) {
      opt.reps = static_cast<int>(parse_positive("--reps=", arg.substr(7)));
    } else if (arg.starts_with("--block=")) {
      opt.block = static_cast<int>(parse_positive("--block=", arg.substr(8)));
    } else if (arg == "--ranks" || arg.starts_with("--ranks=")) {
      if (arg == "--ranks") ++i;  // launch() checks it against the job's size
    } else {
      throw ValueError(
          fmt::format("[matmul] unknown argument '{}': expected --n=N[,N...], --quick, --reps=R, --block=NB", arg));
    }
  }
  return opt;
}

void check_mpi(int rc, std::string_view call) {
  if (rc != MPI_SUCCESS) throw CommError(fmt::format("[matmul] {} failed with MPI error {}", call, rc));
}

// A barrier that sleeps instead of spinning: ranks waiting out rank 0's
// single-process BLAS must not take cores from its threads.
void sleeping_barrier() {
  MPI_Request req;
  check_mpi(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Ibarrier");
  for (int flag = 0;;) {
    check_mpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// The pdgemm operands' values, a function of the global index that every
// process evaluates for its own elements and the check recomputes.
double element(std::uint64_t seed, std::int64_t i, std::int64_t j, std::int64_t n) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(i * n + j);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

// pdgemm on a process grid as close to square as the job allows, block size
// NB in both dims, operands in ScaLAPACK's block-cyclic column-major layout.
class Pdgemm {
 public:
  Pdgemm(int world_size, std::int64_t n, int block) : n_(static_cast<int>(n)), nb_(block) {
    nprow_ = static_cast<int>(std::sqrt(static_cast<double>(world_size)));
    while (world_size % nprow_ != 0) --nprow_;
    npcol_ = world_size / nprow_;
    Cblacs_get(-1, 0, &context_);
    Cblacs_gridinit(&context_, "Row", nprow_, npcol_);
    Cblacs_gridinfo(context_, &nprow_, &npcol_, &myrow_, &mycol_);
    const int zero = 0;
    rows_ = numroc_(&n_, &nb_, &myrow_, &zero, &nprow_);
    cols_ = numroc_(&n_, &nb_, &mycol_, &zero, &npcol_);
    const int lld = std::max(1, rows_);
    int info = 0;
    descinit_(desc_, &n_, &n_, &nb_, &nb_, &zero, &zero, &context_, &lld, &info);
    if (info != 0) throw ValueError(fmt::format("[matmul] descinit_ rejected N={} NB={}: info {}", n_, nb_, info));
    const auto local = static_cast<std::size_t>(rows_) * static_cast<std::size_t>(cols_);
    a_.resize(local);
    b_.resize(local);
    c_.resize(local);
    for (int lj = 0; lj < cols_; ++lj)
      for (int li = 0; li < rows_; ++li) {
        const std::size_t at =
            static_cast<std::size_t>(lj) * static_cast<std::size_t>(lld) + static_cast<std::size_t>(li);
        a_[at] = element(1, global_row(li), global_col(lj), n_);
        b_[at] = element(2, global_row(li), global_col(lj), n_);
      }
  }
  ~Pdgemm() { Cblacs_gridexit(context_); }
  Pdgemm(const Pdgemm&) = delete;
  Pdgemm& operator=(const Pdgemm&) = delete;

  void run() {
    const int one = 1;
    const double alpha = 1.0, beta = 0.0;
    pdgemm_("N", "N", &n_, &n_, &n_, &alpha, a_.data(), &one, &one, desc_, b_.data(), &one, &one, desc_, &beta,
            c_.data(), &one, &one, desc_);
  }

  std::string grid() const { return fmt::format("{}x{}", nprow_, npcol_); }

  // Largest relative error over a few entries of C that this process holds,
  // against the sum recomputed from the element formula.
  double check() const {
    double worst = 0;
    const std::int64_t n = n_;
    const std::int64_t probes[][2] = {{0, 0},
                                      {n - 1, n - 1},
                                      {n / 2, 17 % n},
                                      {n / 3, n - 2 > 0 ? n - 2 : 0},
                                      {1 % n, n / 2}};
    for (const auto& p : probes) {
      const int li = local_index(p[0], myrow_, nprow_), lj = local_index(p[1], mycol_, npcol_);
      if (li < 0 || lj < 0) continue;
      double expect = 0;
      for (std::int64_t k = 0; k < n; ++k) expect += element(1, p[0], k, n) * element(2, k, p[1], n);
      const double got = c_[static_cast<std::size_t>(lj) * static_cast<std::size_t>(std::max(1, rows_)) +
                            static_cast<std::size_t>(li)];
      worst = std::max(worst, std::abs(got - expect) / std::abs(expect));
    }
    return worst;
  }

 private:
  std::int64_t global_row(int li) const {
    return (static_cast<std::int64_t>(li / nb_) * nprow_ + myrow_) * nb_ + li % nb_;
  }
  std::int64_t global_col(int lj) const {
    return (static_cast<std::int64_t>(lj / nb_) * npcol_ + mycol_) * nb_ + lj % nb_;
  }
  // The local index of global index g on process coordinate `me`, or -1.
  int local_index(std::int64_t g, int me, int procs) const {
    const std::int64_t block = g / nb_;
    if (block % procs != me) return -1;
    return static_cast<int>((block / procs) * nb_ + g % nb_);
  }

  int n_, nb_;
  int context_ = 0, nprow_ = 1, npcol_ = 1, myrow_ = 0, mycol_ = 0, rows_ = 0, cols_ = 0;
  int desc_[9] = {};
  std::vector<double> a_, b_, c_;
};

constexpr std::uint64_t kSeedA = 11, kSeedB = 12;

// Freivalds' check of the whole product: C x against A (B x) for a fixed x,
// on this rank's rows of C, with B streamed from its generator in row chunks
// so that no rank builds the full matrix. Returns the largest relative error.
double check_dtensor(const DTensor& c, std::int64_t n) {
  std::vector<double> x(static_cast<std::size_t>(n)), bx(static_cast<std::size_t>(n), 0.0);
  for (std::int64_t j = 0; j < n; ++j) x[static_cast<std::size_t>(j)] = 1.0 + static_cast<double>(j % 7) * 0.25;
  const Shape global{n, n};
  constexpr std::int64_t kChunk = 128;
  for (std::int64_t r0 = 0; r0 < n; r0 += kChunk) {
    Tensor rows = Tensor::empty({std::min(kChunk, n - r0), n}, DType::Float64);
    fill_random(rows, kSeedB, global, Shape{r0, 0});
    const double* p = rows.data_as<double>();
    for (std::int64_t r = 0; r < rows.shape()[0]; ++r)
      bx[static_cast<std::size_t>(r0 + r)] = cblas_ddot(static_cast<int>(n), p + r * n, 1, x.data(), 1);
  }
  const Box box = c.local_box();
  if (box.empty()) return 0;
  Tensor a_rows = Tensor::empty(box.size, DType::Float64);
  fill_random(a_rows, kSeedA, global, box.offset);
  const Tensor& c_local = c.to_local();
  double worst = 0;
  for (std::int64_t r = 0; r < box.size[0]; ++r) {
    const double expect = cblas_ddot(static_cast<int>(n), a_rows.data_as<double>() + r * n, 1, bx.data(), 1);
    const double got = cblas_ddot(static_cast<int>(n), c_local.data_as<double>() + r * n, 1, x.data(), 1);
    worst = std::max(worst, std::abs(got - expect) / std::abs(expect));
  }
  return worst;
}

struct Variant {
  std::string label;
  std::function<void()> run;
  bool all_ranks = true;  // false: rank 0 alone, the others sleep
};

// Runs every variant 1 + reps times (the first a warm-up), in an order that
// rotates from one repetition to the next: one on all ranks after a
// barrier, one on rank 0 alone while the others sleep. Returns the slowest
// rank's seconds of each timed repetition r and variant v at r * nv + v.
std::vector<double> time_variants(const std::vector<Variant>& variants, int reps, bool root) {
  const std::size_t nv = variants.size();
  const int warmup = 1;
  std::vector<double> times(static_cast<std::size_t>(reps) * nv);
  for (int i = 0; i < warmup + reps; ++i) {
    for (std::size_t j = 0; j < nv; ++j) {
      const std::size_t v = (j + static_cast<std::size_t>(i)) % nv;
      const Variant& var = variants[v];
      double t = 0;
      if (var.all_ranks) {
        check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
        const auto t0 = Clock::now();
        var.run();
        t = std::chrono::duration<double>(Clock::now() - t0).count();
      } else {
        sleeping_barrier();
        if (root) {
          const auto t0 = Clock::now();
          var.run();
          t = std::chrono::duration<double>(Clock::now() - t0).count();
        }
        sleeping_barrier();
      }
      if (i >= warmup) times[static_cast<std::size_t>(i - warmup) * nv + v] = t;
    }
  }
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, times.data(), static_cast<int>(times.size()), MPI_DOUBLE, MPI_MAX,
                          MPI_COMM_WORLD),
            "MPI_Allreduce");
  return times;
}

void bench_size(Communicator& world, std::int64_t n, const Options& opt) {
  const int p = world.size();
  const bool root = world.rank() == 0;
  DeviceMesh mesh(world, {p});
  const Layout rows = Layout::parse("S(0)"), replicated = Layout::parse("R");

  DTensor a = rand({n, n}, kSeedA, mesh, rows, DType::Float64);
  DTensor b_rows = rand({n, n}, kSeedB, mesh, rows, DType::Float64);
  DTensor b_full = rand({n, n}, kSeedB, mesh, replicated, DType::Float64);
  DTensor c_sharded = a, c_replicated_b = a, c_gathered_b = a;

  // What propagation decides for S(0) @ S(0), and the plan that brings its
  // output to S(0), once, before timing.
  std::string decided;
  {
    ExplainScope explain([&](const std::string& line) { decided += "  " + line + "\n"; });
    DTensor c = matmul(a, b_rows);
    if (c.placements() != rows) decided += fmt::format("  then C to S(0): {}\n", c.plan_to(rows));
  }

  Pdgemm pdgemm(p, n, opt.block);

  // Rank 0's operands for the single-process GEMM.
  Tensor a_full, b_whole, c_full;
  if (root) {
    a_full = Tensor::rand({n, n}, DType::Float64, kSeedA);
    b_whole = Tensor::rand({n, n}, DType::Float64, kSeedB);
    c_full = Tensor::empty({n, n}, DType::Float64);
  }
  auto blas = [&](int threads) {
    openblas_set_num_threads(threads);
    const int ni = static_cast<int>(n);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0, a_full.data_as<double>(), ni,
                b_whole.data_as<double>(), ni, 0.0, c_full.data_as<double>(), ni);
    openblas_set_num_threads(1);
  };

  std::vector<Variant> variants = {
      {"DTensor S(0) @ S(0) -> S(0)",
       [&] {
         c_sharded = matmul(a, b_rows);
         if (c_sharded.placements() != rows) c_sharded = c_sharded.redistribute(rows);
       }},
      {"DTensor S(0) @ R -> S(0)", [&] { c_replicated_b = matmul(a, b_full); }},
      {"DTensor S(0) @ S(0).redistribute(R)", [&] { c_gathered_b = matmul(a, b_rows.redistribute(replicated)); }},
      {fmt::format("ScaLAPACK pdgemm, grid {}, NB {}", pdgemm.grid(), opt.block), [&] { pdgemm.run(); }},
      {"OpenBLAS dgemm, 1 process, 1 thread", [&] { blas(1); }, false},
      {fmt::format("OpenBLAS dgemm, 1 process, {} threads", p), [&] { blas(p); }, false},
  };
  constexpr std::size_t kPdgemm = 3;  // its index in `variants`; the BLAS rows follow it
  const std::size_t nv = variants.size();
  const std::vector<double> times = time_variants(variants, opt.reps, root);

  // Correctness of each distributed result, worst over the ranks.
  double errors[4] = {check_dtensor(c_sharded, n), check_dtensor(c_replicated_b, n), check_dtensor(c_gathered_b, n),
                      pdgemm.check()};
  world.all_reduce(errors, errors, 4, DType::Float64, ReduceOp::Max);
  constexpr double kTolerance = 1e-10;
  for (int e = 0; e < 4; ++e)
    if (!(errors[e] <= kTolerance))
      throw ValueError(fmt::format("[matmul] N={} on {} processes: {} is wrong: relative error {:.3g} > {:.0g}", n, p,
                                   variants[static_cast<std::size_t>(e)].label, errors[e], kTolerance));

  if (!root) return;
  std::vector<double> gflops(nv);
  for (std::size_t v = 0; v < nv; ++v) {
    std::vector<double> per;
    for (int r = 0; r < opt.reps; ++r) per.push_back(times[static_cast<std::size_t>(r) * nv + v]);
    std::sort(per.begin(), per.end());
    gflops[v] = 2.0 * std::pow(static_cast<double>(n), 3) / per[per.size() / 2] / 1e9;
  }
  fmt::print("N={}, {} processes; S(0) @ S(0) as propagation decided it:\n{}", n, p, decided);
  fmt::print("{:<42} {:>9} {:>9} {:>9} {:>9}\n", "variant", "GFLOP/s", "/pdgemm", "/BLAS 1t",
             fmt::format("/BLAS {}t", p));
  for (std::size_t v = 0; v < nv; ++v)
    fmt::print("{:<42} {:>9.1f} {:>9.3f} {:>9.3f} {:>9.3f}\n", variants[v].label, gflops[v],
               gflops[v] / gflops[kPdgemm], gflops[v] / gflops[kPdgemm + 1], gflops[v] / gflops[kPdgemm + 2]);
  fmt::print(
      "goal DTensor S(0) @ S(0) >= pdgemm: {}; largest relative errors (Freivalds / sampled entries): {:.1e}, "
      "{:.1e}, {:.1e}, {:.1e}\n\n",
      gflops[0] >= gflops[kPdgemm] ? "yes" : "MISS", errors[0], errors[1], errors[2], errors[3]);
}

}  // namespace

int main(int argc, char** argv) {
  if (launch_backend() != "mpi") {
    fmt::print(
        "matmul compares DTensor with ScaLAPACK's pdgemm on the processes of an MPI job; run it with\n"
        "  mpirun -np 2 {}\n",
        argv[0]);
    return 0;
  }
  Options opt;
  try {
    opt = parse_options(argc, argv);
  } catch (const ValueError& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  }
  return launch(argc, argv, [&](Communicator& world) {
    // Every GEMM here runs on one thread unless a row says otherwise
    // (pdgemm's local dgemm_ comes from the same OpenBLAS).
    openblas_set_num_threads(1);
    if (world.rank() == 0) {
      char name[MPI_MAX_PROCESSOR_NAME];
      int len = 0;
      MPI_Get_processor_name(name, &len);
      fmt::print("matmul C = A @ B, f64 NxN, {} MPI processes on {} ({} hardware threads); GFLOP/s = 2N^3/t\n",
                 world.size(), std::string_view(name, static_cast<std::size_t>(len)),
                 std::thread::hardware_concurrency());
      fmt::print("times: median of {} repetitions after 1 warm-up, slowest process, variants alternating\n\n",
                 opt.reps);
    }
    for (std::int64_t n : opt.sizes) bench_size(world, n, opt);
  });
}
