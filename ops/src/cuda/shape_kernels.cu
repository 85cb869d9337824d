// Shape kernels on CUDA: the strided gather behind permute, transpose,
// expand and einsum's operand layouts, and the two small loops einsum needs
// beside its GEMMs (summing out a label, adding a bias).
#include "nvcc_fmt.cuh"  // first: before any fmt header

#include <span>
#include <type_traits>
#include <vector>

#include "device_types.cuh"
#include "dtensor/core/detail/cuda_check.h"
#include "gemm_shape_embedding.h"

namespace dtensor::cuda_kernels {
namespace {

using device::Compute;

constexpr int kMaxDims = 24;

/// The gather's index map after merging dims, passed by value.
struct Strided {
  int nd = 0;
  long long shape[kMaxDims];
  long long stride[kMaxDims];
};

template <class T>
__global__ void gather_kernel(const T* __restrict__ src, T* __restrict__ dst, Strided map, long long count) {
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    long long rest = i, at = 0;
    for (int d = map.nd - 1; d >= 0; --d) {
      const long long q = rest / map.shape[d];
      at += (rest - q * map.shape[d]) * map.stride[d];
      rest = q;
    }
    dst[i] = src[at];
  }
}

constexpr int kTile = 32;
constexpr int kTileRows = 8;

/// dst[z, p, q] = src[z * batch_stride + q * ld + p] for p < rows, q < cols:
/// a (batched) transpose through a shared tile, so that both the reads
/// (along p) and the writes (along q) are coalesced.
template <class T>
__global__ void transpose_kernel(const T* __restrict__ src, T* __restrict__ dst, long long batch,
                                 long long batch_stride, long long rows, long long cols, long long ld) {
  __shared__ T tile[kTile][kTile + 1];
  const long long row_tiles = (rows + kTile - 1) / kTile;
  const long long q0 = static_cast<long long>(blockIdx.x) * kTile;
  const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
  for (long long z = blockIdx.z; z < batch; z += gridDim.z) {
    const T* s = src + z * batch_stride;
    T* o = dst + z * rows * cols;
    for (long long rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
      const long long p0 = rt * kTile;
      for (int j = ty; j < kTile; j += kTileRows) {
        const long long p = p0 + tx, q = q0 + j;
        if (p < rows && q < cols) tile[j][tx] = s[q * ld + p];
      }
      __syncthreads();
      for (int j = ty; j < kTile; j += kTileRows) {
        const long long p = p0 + j, q = q0 + tx;
        if (p < rows && q < cols) o[p * cols + q] = tile[tx][j];
      }
      __syncthreads();
    }
  }
}

template <class T>
__global__ void sum_last_kernel(const T* __restrict__ src, T* __restrict__ dst, long long rows, long long cols) {
  using Acc = typename Compute<T>::type;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const long long warps = static_cast<long long>(gridDim.x) * (blockDim.x / 32);
  for (long long r = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    Acc acc = Acc(0);
    for (long long c = lane; c < cols; c += 32) acc += Compute<T>::load(src[r * cols + c]);
    for (int off = 16; off > 0; off /= 2) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if (lane == 0) dst[r] = Compute<T>::store(acc);
  }
}

template <class T>
__global__ void add_bias_kernel(T* __restrict__ y, const T* __restrict__ bias, long long count, long long cols) {
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    y[i] = Compute<T>::store(Compute<T>::load(y[i]) + Compute<T>::load(bias[i % cols]));
}

/// Drops size-1 dims and merges neighbours whose source strides chain (the
/// output is contiguous, so they always chain there).
Strided merge_dims(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides) {
  std::vector<long long> s, t;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (!s.empty() && t.back() == strides[d] * shape[d]) {
      s.back() *= shape[d];
      t.back() = strides[d];
      continue;
    }
    s.push_back(shape[d]);
    t.push_back(strides[d]);
  }
  if (s.size() > static_cast<std::size_t>(kMaxDims))
    throw UnsupportedError(
        fmt::format("[cuda] a strided copy over {} dims that do not merge; at most {}", s.size(), kMaxDims));
  Strided map;
  map.nd = static_cast<int>(s.size());
  for (int d = 0; d < map.nd; ++d) {
    map.shape[d] = s[static_cast<std::size_t>(d)];
    map.stride[d] = t[static_cast<std::size_t>(d)];
  }
  return map;
}

}  // namespace

void gather_strided(const void* src, void* dst, std::span<const std::int64_t> out_shape,
                    std::span<const std::int64_t> src_strides, std::size_t itemsize) {
  std::int64_t count = 1;
  for (std::int64_t s : out_shape) count *= s;
  if (count == 0) return;
  const Strided map = merge_dims(out_shape, src_strides);
  cudaStream_t stream = dtensor::cuda::stream();
  if (map.nd == 0 || (map.nd == 1 && map.stride[0] == 1)) {
    DTENSOR_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, static_cast<std::size_t>(count) * itemsize, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const int nd = map.nd;
  const bool transpose = (nd == 2 || nd == 3) && map.stride[nd - 2] == 1 && map.stride[nd - 1] != 1;
  device::visit_bits(itemsize, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* s = static_cast<const T*>(src);
    T* o = static_cast<T*>(dst);
    if (transpose) {
      const long long batch = nd == 3 ? map.shape[0] : 1, batch_stride = nd == 3 ? map.stride[0] : 0;
      const long long rows = map.shape[nd - 2], cols = map.shape[nd - 1], ld = map.stride[nd - 1];
      const long long row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
      const dim3 grid(static_cast<unsigned>(col_tiles), static_cast<unsigned>(row_tiles < 65535 ? row_tiles : 65535),
                      static_cast<unsigned>(batch < 65535 ? batch : 65535));
      transpose_kernel<T><<<grid, dim3(kTile, kTileRows), 0, stream>>>(s, o, batch, batch_stride, rows, cols, ld);
    } else {
      gather_kernel<T><<<dtensor::cuda::grid_for(count), 256, 0, stream>>>(s, o, map, count);
    }
    DTENSOR_CUDA_CHECK(cudaGetLastError());
  });
}

void sum_last(DType dtype, const void* src, void* dst, std::int64_t rows, std::int64_t cols) {
  if (rows == 0) return;
  device::visit(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr unsigned kBlock = 256;
    const std::int64_t threads = rows * 32;
    sum_last_kernel<T>
        <<<dtensor::cuda::grid_for(threads, kBlock), kBlock, 0, dtensor::cuda::stream()>>>(static_cast<const T*>(src),
                                                                                           static_cast<T*>(dst), rows,
                                                                                           cols);
    DTENSOR_CUDA_CHECK(cudaGetLastError());
  });
}

void add_bias(DType dtype, void* y, const void* bias, std::int64_t rows, std::int64_t cols) {
  const std::int64_t count = rows * cols;
  if (count == 0) return;
  device::visit(dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    add_bias_kernel<T><<<dtensor::cuda::grid_for(count), 256, 0, dtensor::cuda::stream()>>>(static_cast<T*>(y),
                                                                                            static_cast<const T*>(bias),
                                                                                            count, cols);
    DTENSOR_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace dtensor::cuda_kernels
