// A build without CUDA: no backward table on the device (backward_kernels.h).
#include "backward_kernels.h"

namespace dtensor::device {
const BackwardKernels* cuda_backward() { return nullptr; }
}  // namespace dtensor::device
