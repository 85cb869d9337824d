#pragma once
// The one device-side record of a bad index, shared by the kernels that
// take indices or targets (embedding, pick, their backwards): a device word
// the kernels lower with atomicMin to the first bad position, so the
// message names the same value the CPU kernel names, read back after one
// wait for the stream.
#include <climits>
#include <memory>

#include "dtensor/core/cuda.h"
#include "dtensor/core/detail/cuda_check.h"

namespace dtensor::cuda_kernels {

class BadIndexFlag {
 public:
  static constexpr unsigned long long kNone = ULLONG_MAX;

  BadIndexFlag() : storage_(dtensor::cuda::allocate(sizeof(unsigned long long))) {
    DTENSOR_CUDA_CHECK(cudaMemsetAsync(storage_.get(), 0xff, sizeof(unsigned long long), dtensor::cuda::stream()));
  }
  /// The word the kernels lower (kNone while nothing was bad).
  unsigned long long* get() { return reinterpret_cast<unsigned long long*>(storage_.get()); }
  /// Waits for the stream; true with the value at the first bad position
  /// of `values`, false when none was bad.
  bool first_bad(const long long* values, long long& value) {
    unsigned long long at = kNone;
    cudaStream_t stream = dtensor::cuda::stream();
    DTENSOR_CUDA_CHECK(cudaMemcpyAsync(&at, get(), sizeof at, cudaMemcpyDeviceToHost, stream));
    DTENSOR_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (at == kNone) return false;
    DTENSOR_CUDA_CHECK(cudaMemcpyAsync(&value, values + at, sizeof value, cudaMemcpyDeviceToHost, stream));
    DTENSOR_CUDA_CHECK(cudaStreamSynchronize(stream));
    return true;
  }

 private:
  std::shared_ptr<std::byte[]> storage_;
};

}  // namespace dtensor::cuda_kernels
