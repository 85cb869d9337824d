// A build without CUDA: no device table, so no op has a CUDA kernel and
// dispatch reports which op and device it lacks (device_kernels.h).
#include "device_kernels.h"

namespace dtensor::device {
const Kernels* cuda() { return nullptr; }
}  // namespace dtensor::device
