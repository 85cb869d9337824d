// The CUDA table of the backward family's kernels (ops/src/backward_kernels.h),
// as the CPU ones in ops/src/cpu/backward_kernels.cpp compute them: bf16 and f16
// in f32, rounded once. Plain kernels, one thread per element, row, column or
// reduced group: the backward ops are here to be right on every layout;
// their speed is the forward kernels' business first. An index or target
// out of range is recorded on the device (the lowest position wins, so the
// message names the same value as the CPU's) and reported after one wait.
#include "nvcc_fmt.cuh"  // first: before any fmt header

#include <climits>
#include <memory>
#include <type_traits>

#include "backward_kernels.h"
#include "bad_index_flag.cuh"
#include "device_types.cuh"
#include "dtensor/core/cuda.h"
#include "dtensor/core/detail/cuda_check.h"

namespace dtensor::cuda_kernels {
namespace {

using device::Compute;
constexpr unsigned kBlock = 256;
constexpr int kMaxDims = 16;

#define DTENSOR_GRID_STRIDE(i, n)                                                            \
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<long long>(gridDim.x) * blockDim.x)

/// Calls fn(static_cast<T*>(nullptr)) with T the device type of a floating dtype.
template <class Fn>
void visit_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float32: fn(static_cast<float*>(nullptr)); return;
    case DType::Float64: fn(static_cast<double*>(nullptr)); return;
    case DType::BFloat16: fn(static_cast<__nv_bfloat16*>(nullptr)); return;
    case DType::Float16: fn(static_cast<__half*>(nullptr)); return;
    default: break;
  }
  throw Error(fmt::format("[cuda] internal: a backward kernel got a {} tensor; expected a floating dtype", dtype));
}

/// The dtype a tensor of `dtype` is accumulated in.
DType compute_dtype(DType dtype) { return dtype == DType::Float64 ? DType::Float64 : DType::Float32; }

unsigned grid(long long n) { return dtensor::cuda::grid_for(n > 0 ? n : 1, kBlock); }

// ---- activations ----------------------------------------------------------

template <class T>
__global__ void activation_kernel(bool gelu, const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ out,
                                  long long n) {
  using C = typename Compute<T>::type;
  DTENSOR_GRID_STRIDE(i, n) {
    const C v = Compute<T>::load(x[i]);
    C d;
    if (gelu) {
      const C cdf = C(0.5) * (C(1) + erf(v * C(0.70710678118654752440)));
      d = cdf + v * exp(C(-0.5) * v * v) * C(0.39894228040143267794);  // x * phi(x)
    } else {
      const C s = C(1) / (C(1) + exp(-v));
      d = s * (C(1) + v * (C(1) - s));
    }
    out[i] = Compute<T>::store(Compute<T>::load(g[i]) * d);
  }
}

// ---- softmax --------------------------------------------------------------

template <class T>
__global__ void softmax_backward_kernel(const T* __restrict__ y, const T* __restrict__ g, T* __restrict__ out,
                                        long long outer, long long n, long long inner, bool log) {
  using C = typename Compute<T>::type;
  DTENSOR_GRID_STRIDE(r, outer * inner) {
    const long long base = (r / inner) * n * inner + r % inner;
    C acc = 0;
    for (long long k = 0; k < n; ++k) {
      const long long at = base + k * inner;
      acc += log ? Compute<T>::load(g[at]) : Compute<T>::load(g[at]) * Compute<T>::load(y[at]);
    }
    for (long long k = 0; k < n; ++k) {
      const long long at = base + k * inner;
      const C gy = Compute<T>::load(g[at]), yy = Compute<T>::load(y[at]);
      out[at] = Compute<T>::store(log ? gy - exp(yy) * acc : yy * (gy - acc));
    }
  }
}

// ---- layer_norm, rms_norm -------------------------------------------------

template <class T, class C>
__device__ void row_stats(const T* x, long long cols, double eps, bool rms, C& mean, C& rstd) {
  mean = 0;
  if (!rms) {
    for (long long c = 0; c < cols; ++c) mean += Compute<T>::load(x[c]);
    mean /= static_cast<C>(cols);
  }
  C var = 0;
  for (long long c = 0; c < cols; ++c) {
    const C d = Compute<T>::load(x[c]) - mean;
    var += d * d;
  }
  var /= static_cast<C>(cols);
  rstd = C(1) / sqrt(var + static_cast<C>(eps));
}

template <class T>
__global__ void norm_backward_kernel(const T* __restrict__ x, const T* __restrict__ g, const T* __restrict__ w,
                                     T* __restrict__ out, long long rows, long long cols, double eps, bool rms) {
  using C = typename Compute<T>::type;
  DTENSOR_GRID_STRIDE(r, rows) {
    const T* px = x + r * cols;
    const T* pg = g + r * cols;
    C mean, rstd;
    row_stats(px, cols, eps, rms, mean, rstd);
    C sum_g = 0, sum_gx = 0;
    for (long long c = 0; c < cols; ++c) {
      const C gw = Compute<T>::load(pg[c]) * (w ? Compute<T>::load(w[c]) : C(1));
      sum_g += gw;
      sum_gx += gw * (Compute<T>::load(px[c]) - mean) * rstd;
    }
    const C mean_g = rms ? C(0) : sum_g / static_cast<C>(cols);
    const C mean_gx = sum_gx / static_cast<C>(cols);
    for (long long c = 0; c < cols; ++c) {
      const C gw = Compute<T>::load(pg[c]) * (w ? Compute<T>::load(w[c]) : C(1));
      out[r * cols + c] = Compute<T>::store(rstd * (gw - mean_g - (Compute<T>::load(px[c]) - mean) * rstd * mean_gx));
    }
  }
}

template <class T, class C>
__global__ void norm_stats_kernel(const T* __restrict__ x, C* __restrict__ stats, long long rows, long long cols,
                                  double eps, bool rms) {
  DTENSOR_GRID_STRIDE(r, rows) { row_stats(x + r * cols, cols, eps, rms, stats[2 * r], stats[2 * r + 1]); }
}

template <class T, class C>
__global__ void norm_weight_kernel(const T* __restrict__ x, const T* __restrict__ g, const C* __restrict__ stats,
                                   T* __restrict__ out, long long rows, long long cols) {
  DTENSOR_GRID_STRIDE(c, cols) {
    C acc = 0;
    for (long long r = 0; r < rows; ++r)
      acc += Compute<T>::load(g[r * cols + c]) * (Compute<T>::load(x[r * cols + c]) - stats[2 * r]) * stats[2 * r + 1];
    out[c] = Compute<T>::store(acc);
  }
}

// ---- embedding, cross entropy ----------------------------------------------

__global__ void check_range_kernel(const long long* __restrict__ values, long long n, long long bound,
                                   unsigned long long* first_bad) {
  DTENSOR_GRID_STRIDE(i, n) {
    if (values[i] < 0 || values[i] >= bound) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

/// One thread per column adds the rows in the order of the indices, so the
/// sums are the CPU's, deterministically.
template <class T, class C>
__global__ void embedding_backward_kernel(const long long* __restrict__ idx, long long count, const T* __restrict__ g,
                                          long long row0, long long rows, long long cols, C* __restrict__ acc) {
  DTENSOR_GRID_STRIDE(c, cols) {
    for (long long n = 0; n < count; ++n) {
      const long long i = idx[n];
      if (i >= row0 && i < row0 + rows) acc[(i - row0) * cols + c] += Compute<T>::load(g[n * cols + c]);
    }
  }
}

template <class T, class C>
__global__ void store_kernel(const C* __restrict__ acc, T* __restrict__ out, long long n) {
  DTENSOR_GRID_STRIDE(i, n) { out[i] = Compute<T>::store(acc[i]); }
}

template <class T>
__global__ void cross_entropy_backward_kernel(const T* __restrict__ z, const long long* __restrict__ t,
                                              const T* __restrict__ lse, const T* __restrict__ g, T* __restrict__ out,
                                              long long n, long long cols, long long col0, long long classes) {
  using C = typename Compute<T>::type;
  DTENSOR_GRID_STRIDE(i, n * cols) {
    const long long r = i / cols, c = i % cols;
    const C p = exp(Compute<T>::load(z[i]) - Compute<T>::load(lse[r]));
    out[i] = Compute<T>::store(Compute<T>::load(g[r]) * (p - (col0 + c == t[r] ? C(1) : C(0))));
  }
}

/// Checks values[0, n) against [0, bound); true with the first bad value.
bool first_out_of_range(const long long* values, long long n, long long bound, long long& value) {
  if (n == 0) return false;
  BadIndexFlag flag;
  check_range_kernel<<<grid(n), kBlock, 0, dtensor::cuda::stream()>>>(values, n, bound, flag.get());
  DTENSOR_CUDA_CHECK(cudaGetLastError());
  return flag.first_bad(values, value);
}

// ---- max, min --------------------------------------------------------------

struct GroupGeometry {
  int kept = 0, red = 0;
  long long kept_size[kMaxDims] = {}, kept_stride[kMaxDims] = {};
  long long red_size[kMaxDims] = {}, red_stride[kMaxDims] = {};
};

__device__ long long offset_of(long long i, int nd, const long long* size, const long long* stride) {
  long long off = 0;
  for (int d = nd - 1; d >= 0; --d) {
    off += (i % size[d]) * stride[d];
    i /= size[d];
  }
  return off;
}

template <class T>
__global__ void extremum_backward_kernel(const T* __restrict__ x, const T* __restrict__ g, T* __restrict__ out,
                                         GroupGeometry geo, long long groups, long long per_group, bool max) {
  using C = typename Compute<T>::type;
  DTENSOR_GRID_STRIDE(k, groups) {
    const long long base = offset_of(k, geo.kept, geo.kept_size, geo.kept_stride);
    long long best = base;
    C best_v = Compute<T>::load(x[base]);
    for (long long r = 1; r < per_group && !isnan(best_v); ++r) {
      const long long at = base + offset_of(r, geo.red, geo.red_size, geo.red_stride);
      const C v = Compute<T>::load(x[at]);
      if (isnan(v) || (max ? v > best_v : v < best_v)) {
        best = at;
        best_v = v;
      }
    }
    out[best] = g[k];
  }
}

}  // namespace

// ---- the table's entries -----------------------------------------------------

namespace {

Tensor activation_backward(dtensor::device::Activation fn, const Tensor& x, const Tensor& grad) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), Device::CUDA);
  if (x.numel() == 0) return out;
  visit_float(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    activation_kernel<T>
        <<<grid(x.numel()), kBlock, 0, dtensor::cuda::stream()>>>(fn == dtensor::device::Activation::Gelu,
                                                                  static_cast<const T*>(x.data()),
                                                                  static_cast<const T*>(grad.data()),
                                                                  static_cast<T*>(out.data()), x.numel());
    DTENSOR_CUDA_CHECK(cudaGetLastError());
  });
  return out;
}

Tensor softmax_backward(const Tensor& y, const Tensor& grad, int dim, bool log) {
  Tensor out = Tensor::empty(y.shape(), y.dtype(), Device::CUDA);
  const Around a = around(y.shape(), dim);
  if (y.numel() == 0) return out;
  visit_float(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    softmax_backward_kernel<T>
        <<<grid(a.outer * a.inner), kBlock, 0, dtensor::cuda::stream()>>>(static_cast<const T*>(y.data()),
                                                                          static_cast<const T*>(grad.data()),
                                                                          static_cast<T*>(out.data()), a.outer, a.n,
                                                                          a.inner, log);
    DTENSOR_CUDA_CHECK(cudaGetLastError());
  });
  return out;
}

long long trailing_numel(const Shape& shape, int ndim) {
  long long n = 1;
  for (std::size_t d = shape.size() - static_cast<std::size_t>(ndim); d < shape.size(); ++d) n *= shape[d];
  return n;
}

Tensor norm_backward(const Tensor& x, const Tensor& grad, const Tensor& weight, int normalized_ndim, double eps,
                     bool rms) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), Device::CUDA);
  const long long cols = trailing_numel(x.shape(), normalized_ndim);
  const long long rows = cols ? x.numel() / cols : 0;
  if (rows == 0) return out;
  visit_float(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    norm_backward_kernel<T>
        <<<grid(rows), kBlock, 0, dtensor::cuda::stream()>>>(static_cast<const T*>(x.data()),
                                                             static_cast<const T*>(grad.data()),
                                                             weight.defined() ? static_cast<const T*>(weight.data())
                                                                              : nullptr,
                                                             static_cast<T*>(out.data()), rows, cols, eps, rms);
    DTENSOR_CUDA_CHECK(cudaGetLastError());
  });
  return out;
}

Tensor norm_weight_backward(const Tensor& x, const Tensor& grad, int normalized_ndim, double eps, bool rms) {
  const Shape trailing(x.shape().end() - normalized_ndim, x.shape().end());
  Tensor out = Tensor::zeros(trailing, x.dtype(), Device::CUDA);
  const long long cols = out.numel();
  const long long rows = cols ? x.numel() / cols : 0;
  if (rows == 0 || cols == 0) return out;
  const DType acc = compute_dtype(x.dtype());
  Tensor stats = Tensor::empty({2 * rows}, acc, Device::CUDA);
  visit_float(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = typename Compute<T>::type;
    cudaStream_t stream = dtensor::cuda::stream();
    norm_stats_kernel<T, C><<<grid(rows), kBlock, 0, stream>>>(static_cast<const T*>(x.data()),
                                                               static_cast<C*>(stats.data()), rows, cols, eps, rms);
    DTENSOR_CUDA_CHECK(cudaGetLastError());
    norm_weight_kernel<T, C><<<grid(cols), kBlock, 0, stream>>>(static_cast<const T*>(x.data()),
                                                                static_cast<const T*>(grad.data()),
                                                                static_cast<const C*>(stats.data()),
                                                                static_cast<T*>(out.data()), rows, cols);
    DTENSOR_CUDA_CHECK(cudaGetLastError());
  });
  return out;
}

Tensor embedding_backward(const Tensor& indices, const Tensor& grad, std::int64_t row0, std::int64_t rows,
                          std::int64_t vocab) {
  const long long cols = grad.shape().back();
  const auto* idx = reinterpret_cast<const long long*>(indices.data_as<std::int64_t>());
  long long bad = 0;
  if (first_out_of_range(idx, indices.numel(), vocab, bad))
    throw ValueError(
        fmt::format("[embedding_backward] index {} out of range for a table of {} rows; expected 0 <= index < {}", bad,
                    vocab, vocab));
  Tensor out = Tensor::empty({rows, cols}, grad.dtype(), Device::CUDA);
  if (out.numel() == 0) return out;
  Tensor acc = Tensor::zeros({rows, cols}, compute_dtype(grad.dtype()), Device::CUDA);
  visit_float(grad.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    using C = typename Compute<T>::type;
    cudaStream_t stream = dtensor::cuda::stream();
    embedding_backward_kernel<T, C><<<grid(cols), kBlock, 0, stream>>>(idx, indices.numel(),
                                                                       static_cast<const T*>(grad.data()), row0, rows,
                                                                       cols, static_cast<C*>(acc.data()));
    DTENSOR_CUDA_CHECK(cudaGetLastError());
    store_kernel<T, C><<<grid(out.numel()), kBlock, 0, stream>>>(static_cast<const C*>(acc.data()),
                                                                 static_cast<T*>(out.data()), out.numel());
    DTENSOR_CUDA_CHECK(cudaGetLastError());
  });
  return out;
}

Tensor cross_entropy_backward(const Tensor& z, const Tensor& targets, const Tensor& lse, const Tensor& grad,
                              std::int64_t col0, std::int64_t classes) {
  const long long n = z.shape()[0], cols = z.shape()[1];
  const auto* tp = reinterpret_cast<const long long*>(targets.data_as<std::int64_t>());
  long long bad = 0;
  if (first_out_of_range(tp, n, classes, bad))
    throw ValueError(
        fmt::format("[cross_entropy_backward] target {} out of range for {} classes; expected 0 <= target < {}", bad,
                    classes, classes));
  Tensor out = Tensor::empty(z.shape(), z.dtype(), Device::CUDA);
  if (out.numel() == 0) return out;
  visit_float(z.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    cross_entropy_backward_kernel<T>
        <<<grid(n * cols), kBlock, 0, dtensor::cuda::stream()>>>(static_cast<const T*>(z.data()), tp,
                                                                 static_cast<const T*>(lse.data()),
                                                                 static_cast<const T*>(grad.data()),
                                                                 static_cast<T*>(out.data()), n, cols, col0, classes);
    DTENSOR_CUDA_CHECK(cudaGetLastError());
  });
  return out;
}

Tensor extremum_backward(const Tensor& x, std::span<const bool> reduced, const Tensor& grad, bool max) {
  Tensor out = Tensor::zeros(x.shape(), x.dtype(), Device::CUDA);
  if (x.dim() > kMaxDims)
    throw UnsupportedError(
        fmt::format("[{}_backward] a tensor of {} dims on CUDA; at most {}", max ? "max" : "min", x.dim(), kMaxDims));
  const Shape strides = row_major_strides(x.shape());
  GroupGeometry geo;
  long long groups = 1, per_group = 1;
  for (std::size_t d = 0; d < x.shape().size(); ++d) {
    if (reduced[d]) {
      geo.red_size[geo.red] = x.shape()[d];
      geo.red_stride[geo.red++] = strides[d];
      per_group *= x.shape()[d];
    } else {
      geo.kept_size[geo.kept] = x.shape()[d];
      geo.kept_stride[geo.kept++] = strides[d];
      groups *= x.shape()[d];
    }
  }
  if (groups == 0 || per_group == 0) return out;
  visit_float(x.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    extremum_backward_kernel<T>
        <<<grid(groups), kBlock, 0, dtensor::cuda::stream()>>>(static_cast<const T*>(x.data()),
                                                               static_cast<const T*>(grad.data()),
                                                               static_cast<T*>(out.data()), geo, groups, per_group,
                                                               max);
    DTENSOR_CUDA_CHECK(cudaGetLastError());
  });
  return out;
}

}  // namespace
}  // namespace dtensor::cuda_kernels

namespace dtensor::device {
namespace {

const BackwardKernels kCuda{
    .activation_backward = cuda_kernels::activation_backward,
    .softmax_backward = cuda_kernels::softmax_backward,
    .norm_backward = cuda_kernels::norm_backward,
    .norm_weight_backward = cuda_kernels::norm_weight_backward,
    .embedding_backward = cuda_kernels::embedding_backward,
    .cross_entropy_backward = cuda_kernels::cross_entropy_backward,
    .extremum_backward = cuda_kernels::extremum_backward,
};

}  // namespace

template <>
const BackwardKernels* cuda_table<BackwardKernels>() {
  return &kCuda;
}

}  // namespace dtensor::device
