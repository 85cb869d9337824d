// bench/kernels: the pointwise rows. Each op runs through call_op on plain
// Tensors, as a user would call it (the output is a fresh tensor per call);
// bytes counts what the kernel must read plus write at least.
#include <dtensor/dtensor.h>

#include "kernels.h"

namespace kbench {
namespace {

using dtensor::DType;
using dtensor::OpAttrs;
using dtensor::Shape;
using dtensor::Tensor;

// One row of op(inputs...) on `shape`: every input and the output have it.
// Inputs are normal samples, or uniform on [0, 1) where the op wants
// positive ones (log: a NaN result is a slow path in some libraries).
void add_row(std::vector<Row>& rows, int reps, const std::string& name, const std::string& op, const Shape& shape,
             DType dtype, int n_inputs, bool positive = false) {
  std::vector<Tensor> inputs;
  for (int i = 0; i < n_inputs; ++i) {
    const auto seed = 1234 + static_cast<std::uint64_t>(i);
    inputs.push_back(positive ? Tensor::rand(shape, dtype, seed) : Tensor::randn(shape, dtype, seed));
  }
  const Tensor probe = inputs[0];
  const double bytes = static_cast<double>(probe.nbytes()) * (n_inputs + 1);
  rows.push_back(measure("pointwise", name, shape, dtype, bytes, reps, [&] {
    Tensor y = dtensor::call_op(op, std::span<const Tensor>(inputs));
    (void)y;
  }));
}

}  // namespace

void pointwise_rows(std::vector<Row>& rows, int reps) {
  const Shape act{64, 4096};    // an MLP's activations (the tensor-parallel example's hidden size)
  const Shape big{2048, 2048};  // 16 MiB of f32: beyond the caches, so bandwidth-bound
  add_row(rows, reps, "exp", "exp", act, DType::Float32, 1);
  add_row(rows, reps, "log", "log", act, DType::Float32, 1, /*positive=*/true);
  for (const char* op : {"tanh", "sigmoid", "gelu", "silu"}) add_row(rows, reps, op, op, act, DType::Float32, 1);
  // softmax and layer_norm take attributes: rows of their own.
  {
    std::vector<Tensor> x{Tensor::randn(act, DType::Float32, 99)};
    const OpAttrs attrs{dtensor::DimAttrs{.dim = -1}};
    rows.push_back(measure("pointwise", "softmax(-1)", act, DType::Float32, 2.0 * x[0].nbytes(), reps,
                           [&] { (void)dtensor::call_op("softmax", std::span<const Tensor>(x), attrs); }));
  }
  {
    std::vector<Tensor> x{Tensor::randn(act, DType::Float32, 98)};
    const OpAttrs attrs{dtensor::NormAttrs{.normalized_ndim = 1}};
    rows.push_back(measure("pointwise", "layer_norm", act, DType::Float32, 2.0 * x[0].nbytes(), reps,
                           [&] { (void)dtensor::call_op("layer_norm", std::span<const Tensor>(x), attrs); }));
  }
  add_row(rows, reps, "add", "add", big, DType::Float32, 2);
  add_row(rows, reps, "mul", "mul", big, DType::Float32, 2);
  add_row(rows, reps, "relu", "relu", big, DType::Float32, 1);
  add_row(rows, reps, "gelu", "gelu", act, DType::BFloat16, 1);
}

}  // namespace kbench
