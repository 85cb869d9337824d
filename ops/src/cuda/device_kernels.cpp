// The CUDA table of kernels for the op families (ops/src/device_kernels.h),
// on the kernels of this directory: every tensor on the current device,
// every kernel in stream order on the calling thread's stream.
#include "device_kernels.h"
#include "dtensor/core/cuda.h"
#include "gemm_shape_embedding.h"
#include "pointwise_reduction.h"

namespace dtensor::device {
namespace {

void gather_strided(const Tensor& src, Tensor& dst, std::span<const std::int64_t> strides) {
  if (dst.numel() == 0) return;
  cuda_kernels::gather_strided(src.data(), dst.data(), dst.shape(), strides, itemsize(dst.dtype()));
}

void cast(const Tensor& src, Tensor& dst) { cuda::cast(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel()); }

void sum_last(const Tensor& src, Tensor& dst, std::int64_t rows, std::int64_t cols) {
  cuda_kernels::sum_last(src.dtype(), src.data(), dst.data(), rows, cols);
}

void add_bias(Tensor& y, const Tensor& bias, std::int64_t rows, std::int64_t cols) {
  cuda_kernels::add_bias(y.dtype(), y.data(), bias.data(), rows, cols);
}

Tensor embedding(const Tensor& idx, const Tensor& table, std::int64_t row0, std::int64_t vocab) {
  const std::int64_t rows = table.shape()[0];
  const std::int64_t cols = table.shape()[1];
  Shape out_shape = idx.shape();
  out_shape.push_back(cols);
  Tensor out = Tensor::empty(out_shape, table.dtype(), Device::CUDA);
  cuda_kernels::embedding(idx.data_as<std::int64_t>(), idx.numel(), table.data(), row0, rows, cols, vocab,
                          itemsize(table.dtype()), out.data());
  return out;
}

Tensor pick(const Tensor& logits, const Tensor& targets, std::int64_t col0, std::int64_t classes) {
  const std::int64_t n = logits.shape()[0];
  const std::int64_t cols = logits.shape()[1];
  Tensor out = Tensor::empty({n}, logits.dtype(), Device::CUDA);
  cuda_kernels::pick(logits.data(), targets.data_as<std::int64_t>(), n, cols, col0, classes, itemsize(logits.dtype()),
                     out.data());
  return out;
}

const Kernels kCuda{
    .unary = cuda_kernels::unary,
    .binary = cuda_kernels::binary,
    .where = cuda_kernels::where,
    .reduce_dims = cuda_kernels::reduce_dims,
    .argmax = cuda_kernels::argmax,
    .softmax = cuda_kernels::softmax,
    .normalize = cuda_kernels::normalize,
    .gather_strided = gather_strided,
    .cast = cast,
    .sum_last = sum_last,
    .add_bias = add_bias,
    .gemm_batched = cuda_kernels::gemm_batched,
    .gemm_accumulates = [](DType) { return true; },
    .embedding = embedding,
    .pick = pick,
};

}  // namespace

template <>
const Kernels* cuda_table<Kernels>() {
  return &kCuda;
}

}  // namespace dtensor::device
