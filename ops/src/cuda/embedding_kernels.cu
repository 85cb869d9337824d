// The embedding family on CUDA: masked row lookups (embedding) and masked
// one-per-row picks (pick), as the CPU kernels in ops/src/embedding.cpp do.
// An index out of the global range is recorded on the device (the lowest
// position wins, so the message names the same index as the CPU's) and
// reported after one wait for the stream.
#include "nvcc_fmt.cuh"  // first: before any fmt header

#include <climits>
#include <memory>
#include <type_traits>

#include "bad_index_flag.cuh"
#include "device_types.cuh"
#include "dtensor/core/detail/cuda_check.h"
#include "gemm_shape_embedding.h"

namespace dtensor::cuda_kernels {
namespace {

/// One block per output row (grid-stride over rows); thread 0 checks the
/// index, all threads copy (or zero) the row's columns.
template <class T>
__global__ void embedding_kernel(const long long* __restrict__ indices, long long count, const T* __restrict__ table,
                                 long long row0, long long rows, long long cols, long long vocab, T* __restrict__ out,
                                 unsigned long long* first_bad) {
  for (long long n = blockIdx.x; n < count; n += gridDim.x) {
    const long long i = indices[n];
    const bool bad = i < 0 || i >= vocab;
    if (bad && threadIdx.x == 0) atomicMin(first_bad, static_cast<unsigned long long>(n));
    const bool mine = !bad && i >= row0 && i < row0 + rows;
    T* o = out + n * cols;
    if (mine) {
      const T* r = table + (i - row0) * cols;
      for (long long c = threadIdx.x; c < cols; c += blockDim.x) o[c] = r[c];
    } else {
      for (long long c = threadIdx.x; c < cols; c += blockDim.x) o[c] = T(0);
    }
  }
}

template <class T>
__global__ void pick_kernel(const T* __restrict__ logits, const long long* __restrict__ targets, long long n,
                            long long cols, long long col0, long long classes, T* __restrict__ out,
                            unsigned long long* first_bad) {
  for (long long r = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; r < n;
       r += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long t = targets[r];
    if (t < 0 || t >= classes) {
      atomicMin(first_bad, static_cast<unsigned long long>(r));
      out[r] = T(0);
    } else {
      out[r] = t >= col0 && t < col0 + cols ? logits[r * cols + (t - col0)] : T(0);
    }
  }
}

}  // namespace

void embedding(const std::int64_t* indices, std::int64_t count, const void* table, std::int64_t row0, std::int64_t rows,
               std::int64_t cols, std::int64_t vocab, std::size_t itemsize, void* out) {
  if (count == 0) return;
  BadIndexFlag flag;
  const auto* idx = reinterpret_cast<const long long*>(indices);
  // A warp per 32 columns, up to 256 threads: wide rows get whole blocks.
  const unsigned block = cols >= 256 ? 256u : static_cast<unsigned>(cols <= 32 ? 32 : (cols + 31) / 32 * 32);
  const unsigned grid = dtensor::cuda::blocks_for(count);
  device::visit_bits(itemsize, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    embedding_kernel<T><<<grid, block, 0, dtensor::cuda::stream()>>>(idx, count, static_cast<const T*>(table), row0,
                                                                     rows, cols, vocab, static_cast<T*>(out),
                                                                     flag.get());
    DTENSOR_CUDA_CHECK(cudaGetLastError());
  });
  long long bad = 0;
  if (flag.first_bad(idx, bad))
    throw ValueError(fmt::format("[embedding] index {} out of range for a table of {} rows; expected 0 <= index < {}",
                                 bad, vocab, vocab));
}

void pick(const void* logits, const std::int64_t* targets, std::int64_t n, std::int64_t cols, std::int64_t col0,
          std::int64_t classes, std::size_t itemsize, void* out) {
  if (n == 0) return;
  BadIndexFlag flag;
  const auto* tp = reinterpret_cast<const long long*>(targets);
  device::visit_bits(itemsize, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    pick_kernel<T><<<dtensor::cuda::grid_for(n), 256, 0, dtensor::cuda::stream()>>>(static_cast<const T*>(logits), tp,
                                                                                    n, cols, col0, classes,
                                                                                    static_cast<T*>(out), flag.get());
    DTENSOR_CUDA_CHECK(cudaGetLastError());
  });
  long long bad = 0;
  if (flag.first_bad(tp, bad))
    throw ValueError(
        fmt::format("[pick] target {} out of range for {} classes; expected 0 <= target < {}", bad, classes, classes));
}

}  // namespace dtensor::cuda_kernels
