// The registry of generated op samples (op_cases.h), shared by the sharded
// op suite (test_ops) and the CUDA op suite (test_cuda_ops).
#include "op_cases.h"

namespace dtensor::testing {

std::map<std::string, SampleGenerator>& op_samples() {
  static std::map<std::string, SampleGenerator> samples;
  return samples;
}

Tensor uniform(const Shape& shape, DType dtype, std::uint64_t seed, double lo, double hi) {
  Tensor u = Tensor::rand(shape, DType::Float64, seed);
  Tensor t = Tensor::empty(shape, dtype);
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    const double* p = u.data_as<double>();
    T* q = t.data_as<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) q[i] = static_cast<T>(lo + (hi - lo) * p[i]);
  });
  return t;
}

}  // namespace dtensor::testing
