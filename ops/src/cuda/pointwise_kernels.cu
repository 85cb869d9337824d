// CUDA kernels of the pointwise family: one grid-stride loop per dtype and
// arity, the op chosen by a uniform switch inside it. Broadcasting is
// coalesced on the host as the CPU does (size-1 output dims dropped,
// neighbours merged where every input steps through them as one), so
// same-shape and scalar operands take a flat path without index arithmetic.
#include <cmath>

#include "cpu/pointwise_loop.h"
#include "elementwise_common.cuh"
#include "dtensor/core/detail/combine.h"
#include "pointwise_reduction.h"

namespace dtensor::cuda_kernels {
namespace {

using detail::compute_t;
using detail::load;
using detail::store_as;
using pointwise::Binary;
using pointwise::Unary;

constexpr int kMaxDims = 16;
constexpr unsigned kBlock = 256;

// The broadcast geometry of N inputs, by value into the kernel: coalesced
// output sizes and each input's element strides (0 = broadcast).
template <int N>
struct Geometry {
  int nd = 0;
  std::int64_t size[kMaxDims] = {};
  std::int64_t stride[kMaxDims][N] = {};
};

template <int N>
Geometry<N> make_geometry(const char* op, const Shape& out, const Shape* const (&in)[N]) {
  std::array<const Shape*, N> shapes;
  for (int k = 0; k < N; ++k) shapes[k] = in[k];
  const pointwise::Loop<N> loop = pointwise::make_loop<N>(out, shapes);
  if (loop.size.size() > kMaxDims)
    throw UnsupportedError(
        fmt::format("[{}] broadcasting over {} dims that do not merge; the CUDA kernel takes up to {}", op,
                    loop.size.size(), kMaxDims));
  Geometry<N> g;
  g.nd = static_cast<int>(loop.size.size());
  for (int d = 0; d < g.nd; ++d) {
    g.size[d] = loop.size[d];
    for (int k = 0; k < N; ++k) g.stride[d][k] = loop.stride[d][k];
  }
  return g;
}

// Flat: at most one dim left, each input steps by 0 or 1 per element.
template <int N>
bool is_flat(const Geometry<N>& g) {
  return g.nd <= 1;
}

template <int N, bool Flat>
__device__ __forceinline__ void offsets_of(const Geometry<N>& g, std::int64_t i, std::int64_t (&off)[N]) {
  if constexpr (Flat) {
    for (int k = 0; k < N; ++k) off[k] = g.nd == 0 ? 0 : i * g.stride[0][k];
  } else {
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = g.nd - 1; d >= 0; --d) {
      const std::int64_t q = i / g.size[d];
      const std::int64_t r = i - q * g.size[d];
      i = q;
      for (int k = 0; k < N; ++k) off[k] += r * g.stride[d][k];
    }
  }
}

// ---- the ops, in the compute type -------------------------------------------

// NaN propagates, as in torch.maximum / torch.minimum (the reductions' rule).
using combine::max_nan;
using combine::min_nan;

template <class C>
__device__ __forceinline__ C apply_unary(Unary fn, C x, C s) {
  switch (fn) {
    case Unary::Neg: return -x;
    case Unary::Abs:
      if constexpr (std::is_floating_point_v<C>)
        return fabs(x);
      else
        return x < C(0) ? -x : x;
    case Unary::Relu: return x < C(0) ? C(0) : x;  // NaN stays NaN, as Eigen's max(x, 0)
    case Unary::AddScalar: return x + s;
    case Unary::MulScalar: return x * s;
    default: break;
  }
  if constexpr (std::is_floating_point_v<C>) {
    switch (fn) {
      case Unary::Exp: return exp(x);
      case Unary::Log: return log(x);
      case Unary::Sqrt: return sqrt(x);
      case Unary::Rsqrt: return C(1) / sqrt(x);
      case Unary::Tanh: return tanh(x);
      case Unary::Sigmoid: return C(1) / (C(1) + exp(-x));
      case Unary::Silu: return x / (C(1) + exp(-x));
      case Unary::Gelu: return C(0.5) * x * (C(1) + erf(x * C(M_SQRT1_2)));  // exact (erf) form
      case Unary::DivScalar: return x / s;
      case Unary::PowScalar: return pow(x, s);
      default: break;
    }
  }
  return x;  // unreachable: the host rejects integer inputs to float ops
}

template <class C>
__device__ __forceinline__ C apply_binary(Binary fn, C u, C v) {
  switch (fn) {
    case Binary::Add: return u + v;
    case Binary::Sub: return u - v;
    case Binary::Mul: return u * v;
    case Binary::Maximum: return max_nan(u, v);
    case Binary::Minimum: return min_nan(u, v);
    case Binary::Eq: return C(u == v);
    case Binary::Ne: return C(u != v);
    case Binary::Lt: return C(u < v);
    case Binary::Le: return C(u <= v);
    case Binary::Gt: return C(u > v);
    case Binary::Ge: return C(u >= v);
    default: break;
  }
  if constexpr (std::is_floating_point_v<C>) {
    switch (fn) {
      case Binary::Div: return u / v;
      case Binary::Pow: return pow(u, v);
      default: break;
    }
  }
  return u;  // unreachable: the host rejects integer inputs to float ops
}

// ---- kernels ----------------------------------------------------------------

template <class T>
__global__ void unary_kernel(Unary fn, const T* __restrict__ x, T* __restrict__ y, std::int64_t n, compute_t<T> s) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    y[i] = store_as<T>(apply_unary<compute_t<T>>(fn, load(x, i), s));
}

template <class T, bool Flat>
__global__ void binary_kernel(Binary fn, Geometry<2> g, const T* __restrict__ a, const T* __restrict__ b,
                              T* __restrict__ y, std::int64_t n) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    std::int64_t off[2];
    offsets_of<2, Flat>(g, i, off);
    y[i] = store_as<T>(apply_binary<compute_t<T>>(fn, load(a, off[0]), load(b, off[1])));
  }
}

template <class T, bool Flat>
__global__ void where_kernel(Geometry<3> g, const T* __restrict__ cond, const T* __restrict__ a,
                             const T* __restrict__ b, T* __restrict__ y, std::int64_t n) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    std::int64_t off[3];
    offsets_of<3, Flat>(g, i, off);
    y[i] = load(cond, off[0]) != compute_t<T>(0) ? a[off[1]] : b[off[2]];
  }
}

// Floating-only functions (exp, div, ...) are checked once, by the ops'
// metas (ops/src/pointwise.cpp), before any kernel runs.

}  // namespace

Tensor unary(Unary fn, const Tensor& x, double scalar) {
  detail::require_cuda("pointwise", {&x});
  Tensor out = Tensor::empty(x.shape(), x.dtype(), Device::CUDA);
  const std::int64_t n = x.numel();
  if (n == 0) return out;
  detail::visit_device_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    unary_kernel<T><<<cuda::grid_for(n, kBlock), kBlock, 0, cuda::stream()>>>(fn, static_cast<const T*>(x.data()),
                                                                              static_cast<T*>(out.data()), n,
                                                                              static_cast<C>(scalar));
  });
  detail::check_launch();
  return out;
}

Tensor binary(Binary fn, const Tensor& a, const Tensor& b, const Shape& out_shape) {
  detail::require_cuda("pointwise", {&a, &b});
  Tensor out = Tensor::empty(out_shape, a.dtype(), Device::CUDA);
  const std::int64_t n = out.numel();
  if (n == 0) return out;
  const Shape* const shapes[2] = {&a.shape(), &b.shape()};
  const Geometry<2> g = make_geometry<2>("pointwise", out_shape, shapes);
  detail::visit_device_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* pa = static_cast<const T*>(a.data());
    const auto* pb = static_cast<const T*>(b.data());
    auto* py = static_cast<T*>(out.data());
    if (is_flat(g))
      binary_kernel<T, true><<<cuda::grid_for(n, kBlock), kBlock, 0, cuda::stream()>>>(fn, g, pa, pb, py, n);
    else
      binary_kernel<T, false><<<cuda::grid_for(n, kBlock), kBlock, 0, cuda::stream()>>>(fn, g, pa, pb, py, n);
  });
  detail::check_launch();
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, const Shape& out_shape) {
  detail::require_cuda("where", {&cond, &a, &b});
  Tensor out = Tensor::empty(out_shape, a.dtype(), Device::CUDA);
  const std::int64_t n = out.numel();
  if (n == 0) return out;
  const Shape* const shapes[3] = {&cond.shape(), &a.shape(), &b.shape()};
  const Geometry<3> g = make_geometry<3>("where", out_shape, shapes);
  detail::visit_device_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto* pc = static_cast<const T*>(cond.data());
    const auto* pa = static_cast<const T*>(a.data());
    const auto* pb = static_cast<const T*>(b.data());
    auto* py = static_cast<T*>(out.data());
    if (is_flat(g))
      where_kernel<T, true><<<cuda::grid_for(n, kBlock), kBlock, 0, cuda::stream()>>>(g, pc, pa, pb, py, n);
    else
      where_kernel<T, false><<<cuda::grid_for(n, kBlock), kBlock, 0, cuda::stream()>>>(g, pc, pa, pb, py, n);
  });
  detail::check_launch();
  return out;
}

}  // namespace dtensor::cuda_kernels
