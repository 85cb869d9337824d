// The CPU's table of kernels for the op families (ops/src/device_kernels.h):
// the pointwise and reduction primitives of this directory, plus the loops
// behind views, einsum and the embedding family. f32, f64 and i64 only
// (dispatch widens bf16/f16 around a CPU kernel).
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "device_kernels.h"
#include "dtensor/core/error.h"
#include "dtensor/core/detail/strided_copy.h"
#include "dtensor/ops/detail/gemm.h"
#include "pointwise_kernels.h"
#include "reduction_kernels.h"

namespace dtensor::device {
namespace {

Tensor reduce_dims(const Tensor& x, std::span<const bool> reduced, const Shape& out_shape, cpu::ReduceKind kind,
                   double p, std::int64_t mean_count) {
  Tensor out = cpu::reduce_dims(x, reduced, out_shape, kind, p);
  if (mean_count < 0) return out;
  visit_dtype(out.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* o = out.data_as<T>();
    const T scale = T(1) / static_cast<T>(mean_count);
    for (std::int64_t i = 0; i < out.numel(); ++i) o[i] = mean_count ? o[i] * scale : o[i] / T(0);
  });
  return out;
}

void gather_strided(const Tensor& src, Tensor& dst, std::span<const std::int64_t> strides) {
  const Shape& shape = dst.shape();
  cpu::copy_strided(src.bytes(), strides, dst.bytes(), row_major_strides(shape), shape, itemsize(dst.dtype()));
}

void cast(const Tensor& src, Tensor& dst) {
  visit_dtype(src.dtype(), [&](auto zx) {
    using X = decltype(zx);
    visit_dtype(dst.dtype(), [&](auto zy) {
      using Y = decltype(zy);
      const X* p = src.data_as<X>();
      Y* q = dst.data_as<Y>();
      for (std::int64_t i = 0; i < src.numel(); ++i) q[i] = static_cast<Y>(p[i]);
    });
  });
}

void sum_last(const Tensor& src, Tensor& dst, std::int64_t rows, std::int64_t cols) {
  visit_dtype(src.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* s = src.data_as<T>();
    T* o = dst.data_as<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      T acc{};
      for (std::int64_t c = 0; c < cols; ++c) acc += s[r * cols + c];
      o[r] = acc;
    }
  });
}

void add_bias(Tensor& y, const Tensor& bias, std::int64_t rows, std::int64_t cols) {
  visit_dtype(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* p = y.data_as<T>();
    const T* b = bias.data_as<T>();
    for (std::int64_t i = 0; i < rows * cols; ++i) p[i] += b[i % cols];
  });
}

}  // namespace

thread_local double gemm_seconds = 0;  // cpu::gemm_seconds_this_thread

namespace {

// Adds the time from construction to destruction to this thread's GEMM clock.
struct GemmTimer {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~GemmTimer() { gemm_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
};

void gemm_batched(DType dtype, bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
                  std::int64_t lda, std::int64_t stride_a, const void* b, std::int64_t ldb, std::int64_t stride_b,
                  void* c, std::int64_t ldc, std::int64_t stride_c, std::int64_t batch, bool accumulate) {
  if (accumulate && dtype != DType::Float32 && dtype != DType::Float64)
    throw Error(fmt::format("[cpu] internal: gemm_batched accumulates f32 and f64, not {}", dtype));
  const GemmTimer timer;
  const std::size_t item = itemsize(dtype);
  const auto* pa = static_cast<const std::byte*>(a);
  const auto* pb = static_cast<const std::byte*>(b);
  auto* pc = static_cast<std::byte*>(c);
  for (std::int64_t i = 0; i < batch; ++i)
    cpu::gemm(dtype, ta, tb, m, n, k, pa + static_cast<std::size_t>(i * stride_a) * item, lda,
              pb + static_cast<std::size_t>(i * stride_b) * item, ldb,
              pc + static_cast<std::size_t>(i * stride_c) * item, ldc, accumulate);
}

Tensor embedding(const Tensor& idx, const Tensor& table, std::int64_t row0, std::int64_t vocab) {
  const std::int64_t rows = table.shape()[0];
  const std::int64_t cols = table.shape()[1];
  Shape out_shape = idx.shape();
  out_shape.push_back(cols);
  Tensor out = Tensor::zeros(out_shape, table.dtype());
  const std::int64_t* ip = idx.data_as<std::int64_t>();
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * itemsize(table.dtype());
  for (std::int64_t n = 0; n < idx.numel(); ++n) {
    const std::int64_t i = ip[n];
    if (i < 0 || i >= vocab)
      throw ValueError(fmt::format("[embedding] index {} out of range for a table of {} rows; expected 0 <= index < {}",
                                   i, vocab, vocab));
    if (i < row0 || i >= row0 + rows) continue;  // another rank's row: zeros (Partial sum)
    std::memcpy(out.bytes() + static_cast<std::size_t>(n) * row_bytes,
                table.bytes() + static_cast<std::size_t>(i - row0) * row_bytes, row_bytes);
  }
  return out;
}

Tensor pick(const Tensor& logits, const Tensor& targets, std::int64_t col0, std::int64_t classes) {
  const std::int64_t n = logits.shape()[0];
  const std::int64_t cols = logits.shape()[1];
  Tensor out = Tensor::zeros({n}, logits.dtype());
  const std::int64_t* tp = targets.data_as<std::int64_t>();
  visit_dtype(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* x = logits.data_as<T>();
    T* y = out.data_as<T>();
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t t = tp[r];
      if (t < 0 || t >= classes)
        throw ValueError(fmt::format("[pick] target {} out of range for {} classes; expected 0 <= target < {}", t,
                                     classes, classes));
      if (t >= col0 && t < col0 + cols) y[r] = x[r * cols + (t - col0)];
    }
  });
  return out;
}

constexpr Kernels kCpu{
    .unary = pointwise::unary,
    .binary = pointwise::binary,
    .where = pointwise::where,
    .reduce_dims = reduce_dims,
    .argmax = cpu::argmax,
    .softmax = cpu::softmax,
    .normalize = cpu::normalize,
    .gather_strided = gather_strided,
    .cast = cast,
    .sum_last = sum_last,
    .add_bias = add_bias,
    .gemm_batched = gemm_batched,
    .gemm_accumulates = [](DType d) { return d == DType::Float32 || d == DType::Float64; },
    .embedding = embedding,
    .pick = pick,
};

}  // namespace

template <>
const Kernels& cpu_table<Kernels>() {
  return kCpu;
}

}  // namespace dtensor::device

namespace dtensor::cpu {

double gemm_seconds_this_thread() { return device::gemm_seconds; }

}  // namespace dtensor::cpu
