// A build without CUDA: no device tables, so no op has a CUDA kernel and
// dispatch reports which op and device it lacks (device_kernels.h), and no
// backward kernel runs on a device (backward_kernels.h).
#include "backward_kernels.h"
#include "device_kernels.h"

namespace dtensor::device {

template <>
const Kernels* cuda_table<Kernels>() {
  return nullptr;
}
template <>
const BackwardKernels* cuda_table<BackwardKernels>() {
  return nullptr;
}

}  // namespace dtensor::device
