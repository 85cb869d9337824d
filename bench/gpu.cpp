// The GPU figures of the README, all measured in one run on one device:
//   1. matmul at N = 8192 in bf16 and f32: bare cuBLAS (cublasGemmEx, f32
//      accumulation, no TF32, as the library calls it) against dtensor's
//      matmul on DTensors (one rank, and 4 simulated ranks S(0) @ R sharing
//      the GPU), in TFLOP/s;
//   2. dispatch overhead of one op on a propagation-cache hit: DTensor add
//      against Tensor add (the op without sharding) and a bare kernel launch;
//   3. simulated collectives (4 thread ranks on one GPU) against a plain
//      cudaMemcpyAsync of the same size, as bus bandwidth in GB/s.
// Every time is the median of several repetitions after a warm-up, taken
// around a stream synchronisation. Run: build/bench/gpu [--quick]
// (tools/gpu-check builds and runs it.)
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dtensor/dtensor.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "dtensor/core/detail/cuda_check.h"

using namespace dtensor;
using Clock = std::chrono::steady_clock;

void bare_add(const float* a, const float* b, float* c, std::int64_t n, cudaStream_t stream);

namespace {

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw DeviceError(fmt::format("[bench] {}: {}", what, cublasGetStatusString(s)));
}

// Median seconds of `reps` runs of fn (after one warm-up), each ended by a
// synchronisation of this thread's stream.
template <class Fn>
double median_seconds(int reps, Fn&& fn) {
  fn();
  cuda::synchronize();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    cuda::synchronize();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

cudaDataType_t cuda_type(DType d) { return d == DType::BFloat16 ? CUDA_R_16BF : CUDA_R_32F; }

struct MatmulRow {
  DType dtype;
  double cublas_tflops = 0, dtensor_tflops = 0, sharded_tflops = 0;
};

MatmulRow time_matmul(DType dtype, std::int64_t n, int reps) {
  MatmulRow row{dtype};
  const double flops = 2.0 * static_cast<double>(n) * n * n;
  ThreadsOptions one;
  one.device = Device::CUDA;
  run_threads(
      1,
      [&](Communicator& comm) {
        const Tensor a = Tensor::randn({n, n}, dtype, 1, Device::CUDA);
        const Tensor b = Tensor::randn({n, n}, dtype, 2, Device::CUDA);
        Tensor c = Tensor::empty({n, n}, dtype, Device::CUDA);
        cublasHandle_t handle;
        check_cublas(cublasCreate(&handle), "cublasCreate");
        check_cublas(cublasSetStream(handle, cuda::stream()), "cublasSetStream");
        // The library's handle settings (ops/src/cuda/gemm_cublas.cpp): 16-bit
        // inputs reduce in f32 all the way, so both sides run the same math.
        check_cublas(cublasSetMathMode(handle,
                                       static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                                 CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                     "cublasSetMathMode");
        const float one_f = 1, zero_f = 0;
        const int ni = static_cast<int>(n);
        const double t_cublas = median_seconds(reps, [&] {
          // Row-major C = A B is column-major C^T = B^T A^T: swap operands.
          check_cublas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &one_f, b.data(), cuda_type(dtype),
                                    ni, a.data(), cuda_type(dtype), ni, &zero_f, c.data(), cuda_type(dtype), ni,
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx");
        });
        cublasDestroy(handle);
        DeviceMesh mesh(comm, {1});
        const DTensor da = DTensor::from_local(a, mesh, Layout::replicated(1));
        const DTensor db = DTensor::from_local(b, mesh, Layout::replicated(1));
        const double t_dtensor = median_seconds(reps, [&] { (void)matmul(da, db); });
        row.cublas_tflops = flops / t_cublas * 1e-12;
        row.dtensor_tflops = flops / t_dtensor * 1e-12;
      },
      one);
  // Four simulated ranks, S(0) @ R: each multiplies its quarter of the rows.
  ThreadsOptions four = one;
  std::vector<double> per_rank(4);
  run_threads(
      4,
      [&](Communicator& comm) {
        DeviceMesh mesh(comm, {4});
        const DTensor da = DTensor::from_local(Tensor::randn({n / 4, n}, dtype, 3, Device::CUDA), mesh,
                                               Layout::parse("S(0)"), Shape{n, n});
        const DTensor db =
            DTensor::from_local(Tensor::randn({n, n}, dtype, 4, Device::CUDA), mesh, Layout::replicated(1));
        per_rank[comm.rank()] = median_seconds(reps, [&] {
          comm.barrier();
          (void)matmul(da, db);
        });
      },
      four);
  row.sharded_tflops = flops / *std::max_element(per_rank.begin(), per_rank.end()) * 1e-12;
  return row;
}

struct DispatchRow {
  double dtensor_us = 0, tensor_us = 0, bare_us = 0;
};

DispatchRow time_dispatch(int calls) {
  DispatchRow row;
  ThreadsOptions one;
  one.device = Device::CUDA;
  run_threads(
      1,
      [&](Communicator& comm) {
        DeviceMesh mesh(comm, {1});
        const std::int64_t n = 1024;
        const Tensor x = Tensor::rand({n}, DType::Float32, 1, Device::CUDA);
        const Tensor y = Tensor::rand({n}, DType::Float32, 2, Device::CUDA);
        Tensor z = Tensor::empty({n}, DType::Float32, Device::CUDA);
        const DTensor dx = DTensor::from_local(x, mesh, Layout::replicated(1));
        const DTensor dy = DTensor::from_local(y, mesh, Layout::replicated(1));
        auto per_call = [&](auto&& fn) {
          return median_seconds(5,
                                [&] {
                                  for (int i = 0; i < calls; ++i) fn();
                                }) /
                 calls * 1e6;
        };
        (void)add(dx, dy);  // fills the propagation cache: every timed call hits
        row.dtensor_us = per_call([&] { (void)add(dx, dy); });
        row.tensor_us = per_call([&] { (void)add(x, y); });
        row.bare_us =
            per_call([&] { bare_add(x.data_as<float>(), y.data_as<float>(), z.data_as<float>(), n, cuda::stream()); });
      },
      one);
  return row;
}

// Simulated GPU ranks sharing the one GPU in the collectives' rows.
constexpr int kSimulatedRanks = 4;

struct CollectiveRow {
  std::string name;
  double busbw = 0;  // GB/s, nccl-tests' convention
};

std::vector<CollectiveRow> time_collectives(std::size_t bytes_per_rank, int reps, double& memcpy_gbs) {
  const int n = kSimulatedRanks;
  std::vector<CollectiveRow> rows = {{"all_gather"}, {"reduce_scatter"}, {"all_reduce"}, {"all_to_all"}};
  std::vector<std::vector<double>> secs(rows.size(), std::vector<double>(n));
  ThreadsOptions opts;
  opts.device = Device::CUDA;
  run_threads(
      n,
      [&](Communicator& comm) {
        const std::int64_t elems = static_cast<std::int64_t>(bytes_per_rank / 4);
        Tensor send = Tensor::rand({elems * n}, DType::Float32, 1 + comm.rank(), Device::CUDA);
        Tensor recv = Tensor::empty({elems * n}, DType::Float32, Device::CUDA);
        const int r = comm.rank();
        if (r == 0) {
          // A plain device-to-device copy of one rank's buffer, alone.
          const double t = median_seconds(reps, [&] {
            DTENSOR_CUDA_CHECK(
                cudaMemcpyAsync(recv.data(), send.data(), bytes_per_rank, cudaMemcpyDeviceToDevice, cuda::stream()));
          });
          memcpy_gbs = static_cast<double>(bytes_per_rank) / t * 1e-9;
        }
        comm.barrier();
        std::vector<std::size_t> counts(n, static_cast<std::size_t>(elems)), blocks(n, bytes_per_rank), offs(n);
        for (int p = 0; p < n; ++p) offs[p] = p * bytes_per_rank;
        auto timed = [&](int row, auto&& fn) {
          secs[row][r] = median_seconds(reps, [&] {
            comm.barrier();
            fn();
          });
        };
        timed(0, [&] { comm.all_gather(send.data(), recv.data(), bytes_per_rank); });
        timed(1, [&] { comm.reduce_scatter(send.data(), recv.data(), counts, DType::Float32, ReduceOp::Sum); });
        timed(2, [&] {
          comm.all_reduce(send.data(), recv.data(), static_cast<std::size_t>(elems), DType::Float32, ReduceOp::Sum);
        });
        timed(3, [&] { comm.all_to_all(send.data(), blocks, offs, recv.data(), blocks, offs); });
      },
      opts);
  // Bus bandwidth: data size S (all_gather/reduce_scatter/all_to_all: the
  // n blocks of one rank's full buffer; all_reduce: one buffer) times the
  // algorithm's factor ((n-1)/n, or 2(n-1)/n for all_reduce), over the
  // slowest rank's time.
  const double s_full = static_cast<double>(bytes_per_rank) * n, s_one = static_cast<double>(bytes_per_rank);
  const double f = static_cast<double>(n - 1) / n;
  const double sizes[4] = {s_full * f, s_full * f, s_one * 2 * f, s_full * f};
  for (std::size_t i = 0; i < rows.size(); ++i)
    rows[i].busbw = sizes[i] / *std::max_element(secs[i].begin(), secs[i].end()) * 1e-9;
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (cuda::device_count() == 0) {
    fmt::print("bench/gpu: {}; nothing to measure\n", cuda::describe_device());
    return 0;
  }
  fmt::print("device: {}\n\n", cuda::describe_device());
  const std::int64_t n = quick ? 2048 : 8192;
  const int reps = quick ? 3 : 10;
  fmt::print("matmul N={} (TFLOP/s, median of {})\n", n, reps);
  fmt::print("  {:<6} {:>12} {:>14} {:>10} {:>22}\n", "dtype", "cuBLAS", "DTensor R@R", "ratio", "4 sim. ranks S(0)@R");
  for (DType d : {DType::BFloat16, DType::Float32}) {
    const MatmulRow r = time_matmul(d, n, reps);
    fmt::print("  {:<6} {:>12.1f} {:>14.1f} {:>10.3f} {:>22.1f}\n", dtype_name(d), r.cublas_tflops, r.dtensor_tflops,
               r.dtensor_tflops / r.cublas_tflops, r.sharded_tflops);
  }
  const DispatchRow d = time_dispatch(quick ? 200 : 2000);
  fmt::print("\ndispatch, add of 1024 f32 on the GPU (us per call, host side, cache hit)\n");
  fmt::print("  DTensor add {:.2f}   Tensor add {:.2f}   bare kernel launch {:.2f}   overhead over the launch {:.2f}\n",
             d.dtensor_us, d.tensor_us, d.bare_us, d.dtensor_us - d.bare_us);
  double memcpy_gbs = 0;
  const std::size_t bytes = quick ? (16u << 20) : (64u << 20);
  const auto rows = time_collectives(bytes, reps, memcpy_gbs);
  fmt::print("\nsimulated collectives, 4 thread ranks on one GPU, {} MiB per rank (bus GB/s)\n", bytes >> 20);
  fmt::print("  cudaMemcpyAsync D2D of {} MiB: {:.0f} GB/s\n", bytes >> 20, memcpy_gbs);
  // The 4 ranks share one GPU's memory bandwidth, so the most each can reach
  // is a quarter of one copy's: that is the ratio's denominator.
  fmt::print("  ratio: bus GB/s over memcpy's / {}, the share of one GPU each rank can have\n", kSimulatedRanks);
  for (const auto& r : rows)
    fmt::print("  {:<15} {:>8.0f} GB/s   {:.2f}\n", r.name, r.busbw, r.busbw / (memcpy_gbs / kSimulatedRanks));
  return 0;
}
