// int64 GEMM on CUDA (cuBLAS has none): 16 x 16 output tiles, the operands
// staged through shared memory one 16-wide slice of k at a time. Integer
// products are exact, so any summation order gives the CPU's result
// (wrapping on overflow as the CPU's two's complement arithmetic does).
#include "nvcc_fmt.cuh"  // first: before any fmt header

#include "dtensor/core/detail/cuda_check.h"
#include "dtensor/core/error.h"
#include "gemm_kernels.h"

namespace dtensor::cuda_kernels::detail {
namespace {

constexpr int kTile = 16;

/// Element (row, col) of the logical operand op(X), X row-major with leading
/// dimension ld.
__device__ __forceinline__ std::int64_t at(const std::int64_t* x, bool trans, std::int64_t ld, std::int64_t row,
                                           std::int64_t col) {
  return trans ? x[col * ld + row] : x[row * ld + col];
}

__global__ void gemm_i64_kernel(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                                const std::int64_t* a, std::int64_t lda, std::int64_t stride_a, const std::int64_t* b,
                                std::int64_t ldb, std::int64_t stride_b, std::int64_t* c, std::int64_t ldc,
                                std::int64_t stride_c, std::int64_t batch, bool accumulate) {
  __shared__ std::int64_t tile_a[kTile][kTile];
  __shared__ std::int64_t tile_b[kTile][kTile + 1];
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  const std::int64_t row_tiles = (m + kTile - 1) / kTile;
  const std::int64_t col = static_cast<std::int64_t>(blockIdx.x) * kTile + tx;
  for (std::int64_t z = blockIdx.z; z < batch; z += gridDim.z) {
    const std::int64_t* az = a + z * stride_a;
    const std::int64_t* bz = b + z * stride_b;
    std::int64_t* cz = c + z * stride_c;
    for (std::int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
      const std::int64_t row = rt * kTile + ty;
      std::int64_t acc = 0;
      for (std::int64_t k0 = 0; k0 < k; k0 += kTile) {
        const std::int64_t ka = k0 + tx, kb = k0 + ty;
        tile_a[ty][tx] = row < m && ka < k ? at(az, trans_a, lda, row, ka) : 0;
        tile_b[ty][tx] = kb < k && col < n ? at(bz, trans_b, ldb, kb, col) : 0;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kTile; ++i) acc += tile_a[ty][i] * tile_b[i][tx];
        __syncthreads();
      }
      if (row < m && col < n) cz[row * ldc + col] = accumulate ? cz[row * ldc + col] + acc : acc;
    }
  }
}

}  // namespace

void gemm_i64(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const std::int64_t* a,
              std::int64_t lda, std::int64_t stride_a, const std::int64_t* b, std::int64_t ldb, std::int64_t stride_b,
              std::int64_t* c, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch, bool accumulate) {
  const std::int64_t col_tiles = (n + kTile - 1) / kTile;
  const std::int64_t row_tiles = (m + kTile - 1) / kTile;
  if (col_tiles > 0x7fffffff) throw UnsupportedError("[cuda] gemm: an int64 product with more than 2^35 columns");
  // Rows and batches beyond the grid's limits are looped over in the kernel.
  const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles < 65535 ? row_tiles : 65535),
                  static_cast<unsigned>(batch < 65535 ? batch : 65535));
  const dim3 block(kTile, kTile);
  gemm_i64_kernel<<<grid, block, 0, dtensor::cuda::stream()>>>(trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb,
                                                               stride_b, c, ldc, stride_c, batch, accumulate);
  DTENSOR_CUDA_CHECK(cudaGetLastError());
}

}  // namespace dtensor::cuda_kernels::detail
