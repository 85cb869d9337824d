#pragma once
// For sources compiled only in a CUDA build (core/src/cuda/,
// ops/src/cuda/, mesh/src/nccl/): turns a failed runtime call into a DeviceError
// that names the call and the runtime's message. Never include it from a
// header that a CPU build compiles.
#include <cuda_runtime.h>

#include "dtensor/core/cuda.h"

namespace dtensor::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call);

inline void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw_cuda_error(status, call);
}

/// The calling thread's stream, typed.
inline cudaStream_t stream() { return static_cast<cudaStream_t>(current_stream()); }

/// The most blocks a grid-stride loop is launched with: enough to fill any
/// GPU many times over; the loop takes what lies beyond.
inline constexpr std::int64_t kMaxGridBlocks = 65535 * 8;

/// n blocks (one per row, say), at least 1 and at most kMaxGridBlocks.
inline unsigned blocks_for(std::int64_t n) {
  return static_cast<unsigned>(n < 1 ? 1 : (n > kMaxGridBlocks ? kMaxGridBlocks : n));
}

/// Blocks for a grid-stride loop over n elements: enough to fill the GPU,
/// never more than n needs.
inline unsigned grid_for(std::int64_t n, unsigned block = 256) { return blocks_for((n + block - 1) / block); }

}  // namespace dtensor::cuda

/// DTENSOR_CUDA_CHECK(cudaMemcpyAsync(...)): throws DeviceError on failure.
#define DTENSOR_CUDA_CHECK(call) ::dtensor::cuda::check((call), #call)
