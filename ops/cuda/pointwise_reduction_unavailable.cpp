// The pointwise and reduction CUDA kernels in a build without CUDA: every
// entry point says so. Unreachable through dispatch (the families register
// no CUDA kernel when cuda::built() is false); here so that the families
// link without an #ifdef.
#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "pointwise_reduction.h"

namespace dtensor::cuda_kernels {
namespace {

[[noreturn]] void unavailable(const char* what) {
  throw UnsupportedError(fmt::format("[cuda] {} needs CUDA, and this build has none", what));
}

}  // namespace

Tensor unary(pointwise::Unary, const Tensor&, double) { unavailable("unary"); }
Tensor binary(pointwise::Binary, const Tensor&, const Tensor&, const Shape&) { unavailable("binary"); }
Tensor where(const Tensor&, const Tensor&, const Tensor&, const Shape&) { unavailable("where"); }
Tensor reduce_dims(const Tensor&, std::span<const bool>, const Shape&, cpu::ReduceKind, double, std::int64_t) {
  unavailable("reduce_dims");
}
void scale_by_count(Tensor&, std::int64_t) { unavailable("scale_by_count"); }
Tensor argmax(const Tensor&, int, const Shape&) { unavailable("argmax"); }
Tensor softmax(const Tensor&, int, bool) { unavailable("softmax"); }
Tensor normalize(const Tensor&, int, const Tensor&, const Tensor&, double, bool) { unavailable("normalize"); }

}  // namespace dtensor::cuda_kernels
