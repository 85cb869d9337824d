// The CPU's table of the backward family's kernels (ops/src/backward_kernels.h).
// Plain loops over f32 and f64, accumulating in the tensor's own type (as
// the forward's CPU reductions do), except gelu's backward and the norms'
// rows in f32, which run vectorised (dtensor/ops/detail/vector_math.h);
// index tensors are i64.
#include <cmath>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "backward_kernels.h"
#include "dtensor/core/error.h"
#include "dtensor/ops/detail/vector_math.h"
#include "norm_rows.h"

namespace dtensor::device {
namespace {

// Calls fn(T{}) with T the tensor's floating type.
template <class Fn>
void visit_float(DType dtype, Fn&& fn) {
  if (dtype == DType::Float32) return fn(float{});
  if (dtype == DType::Float64) return fn(double{});
  throw Error(fmt::format("[cpu] internal: a backward kernel got a {} tensor; expected f32 or f64", dtype));
}

template <class T>
T gelu_grad(T x) {
  const T cdf = T(0.5) * (T(1) + std::erf(x * T(M_SQRT1_2)));
  const T pdf = std::exp(T(-0.5) * x * x) * T(0.5 * M_2_SQRTPI * M_SQRT1_2);  // 1/sqrt(2 pi)
  return cdf + x * pdf;
}
template <class T>
T silu_grad(T x) {
  const T s = T(1) / (T(1) + std::exp(-x));
  return s * (T(1) + x * (T(1) - s));
}

Tensor activation_backward(Activation fn, const Tensor& x, const Tensor& grad) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  visit_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data_as<T>();
    const T* pg = grad.data_as<T>();
    T* po = out.data_as<T>();
    if constexpr (std::is_same_v<T, float>) {
      if (fn == Activation::Gelu) return cpu::vmath::gelu_backward(px, pg, po, x.numel());  // vectorised
    }
    for (std::int64_t i = 0; i < x.numel(); ++i)
      po[i] = pg[i] * (fn == Activation::Gelu ? gelu_grad(px[i]) : silu_grad(px[i]));
  });
  return out;
}

Tensor softmax_backward(const Tensor& y, const Tensor& grad, int dim, bool log) {
  Tensor out = Tensor::empty(y.shape(), y.dtype());
  const Around r = around(y.shape(), dim);
  visit_float(y.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* py = y.data_as<T>();
    const T* pg = grad.data_as<T>();
    T* po = out.data_as<T>();
    for (std::int64_t o = 0; o < r.outer; ++o)
      for (std::int64_t i = 0; i < r.inner; ++i) {
        const std::int64_t base = o * r.n * r.inner + i;
        T acc{};
        for (std::int64_t k = 0; k < r.n; ++k) {
          const std::int64_t at = base + k * r.inner;
          acc += log ? pg[at] : pg[at] * py[at];
        }
        for (std::int64_t k = 0; k < r.n; ++k) {
          const std::int64_t at = base + k * r.inner;
          po[at] = log ? pg[at] - std::exp(py[at]) * acc : py[at] * (pg[at] - acc);
        }
      }
  });
  return out;
}

std::int64_t trailing_numel(const Shape& shape, int ndim) {
  std::int64_t n = 1;
  for (std::size_t d = shape.size() - static_cast<std::size_t>(ndim); d < shape.size(); ++d) n *= shape[d];
  return n;
}

Tensor norm_backward(const Tensor& x, const Tensor& grad, const Tensor& weight, int normalized_ndim, double eps,
                     bool rms) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  const std::int64_t cols = trailing_numel(x.shape(), normalized_ndim);
  const std::int64_t rows = cols ? x.numel() / cols : 0;
  visit_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pw = weight.defined() ? weight.data_as<T>() : nullptr;
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* px = x.data_as<T>() + r * cols;
      const T* pg = grad.data_as<T>() + r * cols;
      T* po = out.data_as<T>() + r * cols;
      if constexpr (std::is_same_v<T, float>)
        cpu::vmath::norm_backward_row(px, pg, pw, po, cols, static_cast<float>(eps), rms);  // vectorised
      else
        cpu::norm_rows::backward(px, pg, pw, po, cols, eps, rms);
    }
  });
  return out;
}

Tensor norm_weight_backward(const Tensor& x, const Tensor& grad, int normalized_ndim, double eps, bool rms) {
  const Shape trailing(x.shape().end() - normalized_ndim, x.shape().end());
  Tensor out = Tensor::zeros(trailing, x.dtype());
  const std::int64_t cols = out.numel();
  const std::int64_t rows = cols ? x.numel() / cols : 0;
  visit_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* po = out.data_as<T>();
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* px = x.data_as<T>() + r * cols;
      const T* pg = grad.data_as<T>() + r * cols;
      if constexpr (std::is_same_v<T, float>)
        cpu::vmath::norm_weight_backward_row(px, pg, po, cols, static_cast<float>(eps), rms);  // vectorised
      else
        cpu::norm_rows::weight_backward(px, pg, po, cols, eps, rms);
    }
  });
  return out;
}

Tensor embedding_backward(const Tensor& indices, const Tensor& grad, std::int64_t row0, std::int64_t rows,
                          std::int64_t vocab) {
  const std::int64_t cols = grad.shape().back();
  Tensor out = Tensor::zeros({rows, cols}, grad.dtype());
  const std::int64_t* ip = indices.data_as<std::int64_t>();
  visit_float(grad.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pg = grad.data_as<T>();
    T* po = out.data_as<T>();
    for (std::int64_t n = 0; n < indices.numel(); ++n) {
      const std::int64_t i = ip[n];
      if (i < 0 || i >= vocab)
        throw ValueError(
            fmt::format("[embedding_backward] index {} out of range for a table of {} rows; expected 0 <= index < {}",
                        i, vocab, vocab));
      if (i < row0 || i >= row0 + rows) continue;  // another rank's row
      for (std::int64_t c = 0; c < cols; ++c) po[(i - row0) * cols + c] += pg[n * cols + c];
    }
  });
  return out;
}

Tensor cross_entropy_backward(const Tensor& z, const Tensor& targets, const Tensor& lse, const Tensor& grad,
                              std::int64_t col0, std::int64_t classes) {
  Tensor out = Tensor::empty(z.shape(), z.dtype());
  const std::int64_t n = z.shape()[0];
  const std::int64_t cols = z.shape()[1];
  const std::int64_t* tp = targets.data_as<std::int64_t>();
  visit_float(z.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* pz = z.data_as<T>();
    const T* pl = lse.data_as<T>();
    const T* pg = grad.data_as<T>();
    T* po = out.data_as<T>();
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t t = tp[r];
      if (t < 0 || t >= classes)
        throw ValueError(
            fmt::format("[cross_entropy_backward] target {} out of range for {} classes; expected 0 <= target < {}", t,
                        classes, classes));
      for (std::int64_t c = 0; c < cols; ++c)
        po[r * cols + c] = pg[r] * (std::exp(pz[r * cols + c] - pl[r]) - T(col0 + c == t ? 1 : 0));
    }
  });
  return out;
}

Tensor extremum_backward(const Tensor& x, std::span<const bool> reduced, const Tensor& grad, bool max) {
  Tensor out = Tensor::zeros(x.shape(), x.dtype());
  const Shape& shape = x.shape();
  const Shape strides = row_major_strides(shape);
  std::vector<std::int64_t> kept_size, kept_stride, red_size, red_stride;
  std::int64_t groups = 1, per_group = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    (reduced[d] ? red_size : kept_size).push_back(shape[d]);
    (reduced[d] ? red_stride : kept_stride).push_back(strides[d]);
    (reduced[d] ? per_group : groups) *= shape[d];
  }
  // The element offset of the i-th index, row-major over (size, stride).
  auto offset = [](std::int64_t i, const std::vector<std::int64_t>& size, const std::vector<std::int64_t>& stride) {
    std::int64_t off = 0;
    for (std::size_t d = size.size(); d-- > 0;) {
      off += (i % size[d]) * stride[d];
      i /= size[d];
    }
    return off;
  };
  visit_float(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* px = x.data_as<T>();
    const T* pg = grad.data_as<T>();
    T* po = out.data_as<T>();
    for (std::int64_t g = 0; g < groups && per_group > 0; ++g) {
      const std::int64_t base = offset(g, kept_size, kept_stride);
      std::int64_t best = base;
      for (std::int64_t r = 1; r < per_group && !std::isnan(px[best]); ++r) {
        const std::int64_t at = base + offset(r, red_size, red_stride);
        if (std::isnan(px[at]) || (max ? px[at] > px[best] : px[at] < px[best])) best = at;
      }
      po[best] = pg[g];
    }
  });
  return out;
}

constexpr BackwardKernels kCpu{
    .activation_backward = activation_backward,
    .softmax_backward = softmax_backward,
    .norm_backward = norm_backward,
    .norm_weight_backward = norm_weight_backward,
    .embedding_backward = embedding_backward,
    .cross_entropy_backward = cross_entropy_backward,
    .extremum_backward = extremum_backward,
};

}  // namespace

template <>
const BackwardKernels& cpu_table<BackwardKernels>() {
  return kCpu;
}

}  // namespace dtensor::device
