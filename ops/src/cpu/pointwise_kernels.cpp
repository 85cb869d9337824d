#include "pointwise_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <type_traits>

#include <Eigen/Core>

#include "dtensor/core/error.h"
#include "dtensor/core/detail/combine.h"
#include "pointwise_loop.h"
#include "dtensor/ops/detail/vector_math.h"

namespace dtensor::pointwise {
namespace {

namespace vmath = cpu::vmath;

// Calls row(n, input pointers, inner strides, output pointer) once per row.
template <class T, std::size_t N, class Row>
void run_loop(const Loop<N>& loop, const std::array<const T*, N>& in, T* out, Row&& row) {
  if (loop.empty) return;
  if (loop.size.empty()) {
    row(std::int64_t{1}, in, std::array<std::int64_t, N>{}, out);
    return;
  }
  const int nd = static_cast<int>(loop.size.size());
  const std::int64_t inner = loop.size.back();
  const auto& istride = loop.stride.back();
  std::vector<std::int64_t> idx(static_cast<std::size_t>(nd), 0);
  std::array<std::int64_t, N> off{};
  std::int64_t out_off = 0;
  while (true) {
    std::array<const T*, N> p;
    for (std::size_t k = 0; k < N; ++k) p[k] = in[k] + off[k];
    row(inner, p, istride, out + out_off);
    out_off += inner;
    int d = nd - 2;
    for (; d >= 0; --d) {
      ++idx[d];
      for (std::size_t k = 0; k < N; ++k) off[k] += loop.stride[d][k];
      if (idx[d] < loop.size[d]) break;
      for (std::size_t k = 0; k < N; ++k) off[k] -= loop.stride[d][k] * loop.size[d];
      idx[d] = 0;
    }
    if (d < 0) break;
  }
}

// One row of a binary op; the four stride cases are separate loops so that
// the compiler vectorises each.
template <class T, class F>
void binary_rows(const Loop<2>& loop, const T* a, const T* b, T* y, F f) {
  run_loop<T, 2>(loop, {a, b}, y,
                 [&](std::int64_t n, const std::array<const T*, 2>& p, const std::array<std::int64_t, 2>& s, T* out) {
                   const T* x0 = p[0];
                   const T* x1 = p[1];
                   if (s[0] && s[1]) {
                     for (std::int64_t j = 0; j < n; ++j) out[j] = f(x0[j], x1[j]);
                   } else if (s[0]) {
                     const T v = *x1;
                     for (std::int64_t j = 0; j < n; ++j) out[j] = f(x0[j], v);
                   } else if (s[1]) {
                     const T v = *x0;
                     for (std::int64_t j = 0; j < n; ++j) out[j] = f(v, x1[j]);
                   } else {
                     const T v = f(*x0, *x1);
                     for (std::int64_t j = 0; j < n; ++j) out[j] = v;
                   }
                 });
}

// The ops' metas accept only floating dtypes for these functions (the one
// dtype check, ops/src/pointwise.cpp); an integer tensor here is a bug.
template <class T>
[[noreturn]] void float_only(const char* op) {
  throw Error(
      fmt::format("[{}] internal: a floating-only function reached the kernel with a {} tensor", op, dtype_of<T>()));
}

// NaN propagates, as in torch.maximum / torch.minimum: the rule of every
// max/min reduction and collective too.
using combine::max_nan;
using combine::min_nan;

// The unary functions vector_math.h computes.
std::optional<vmath::Fn> vector_fn(Unary fn) {
  switch (fn) {
    case Unary::Exp: return vmath::Fn::Exp;
    case Unary::Log: return vmath::Fn::Log;
    case Unary::Tanh: return vmath::Fn::Tanh;
    case Unary::Sigmoid: return vmath::Fn::Sigmoid;
    case Unary::Silu: return vmath::Fn::Silu;
    case Unary::Gelu: return vmath::Fn::Gelu;
    case Unary::Sqrt: return vmath::Fn::Sqrt;
    case Unary::Rsqrt: return vmath::Fn::Rsqrt;
    default: return std::nullopt;
  }
}

// Same-shape add/sub/mul/div of floating tensors: one contiguous row, to
// vector_math's loops (at the dispatched SIMD width, streaming big outputs).
template <class T>
bool contiguous_binary(Binary fn, const Loop<2>& loop, const T* a, const T* b, T* y) {
  if constexpr (!std::is_floating_point_v<T>) {
    return false;
  } else {
    if (loop.empty || loop.size.size() != 1 || loop.stride[0][0] != 1 || loop.stride[0][1] != 1) return false;
    vmath::BinFn f;
    switch (fn) {
      case Binary::Add: f = vmath::BinFn::Add; break;
      case Binary::Sub: f = vmath::BinFn::Sub; break;
      case Binary::Mul: f = vmath::BinFn::Mul; break;
      case Binary::Div: f = vmath::BinFn::Div; break;
      default: return false;
    }
    vmath::binary(f, a, b, y, loop.size[0]);
    return true;
  }
}

// y = fn(x) over n contiguous elements of a computed dtype (y may be x).
template <class T>
void unary_rows(Unary fn, const T* x, T* y, std::int64_t n, double scalar) {
  using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
  Eigen::Map<const Array> X(x, static_cast<Eigen::Index>(n));
  Eigen::Map<Array> Y(y, static_cast<Eigen::Index>(n));
  const T s = static_cast<T>(scalar);
  switch (fn) {
    case Unary::Neg: Y = -X; return;
    case Unary::Abs: Y = X.abs(); return;
    case Unary::Relu:
      if constexpr (std::is_floating_point_v<T>) {
        vmath::apply(vmath::Fn::Relu, x, y, n);
        return;
      }
      Y = X.max(T(0));
      return;
    case Unary::AddScalar: Y = X + s; return;
    case Unary::MulScalar: Y = X * s; return;
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (const auto f = vector_fn(fn)) {
      vmath::apply(*f, x, y, n);
      return;
    }
    switch (fn) {
      case Unary::DivScalar: Y = X / s; return;
      case Unary::PowScalar: Y = X.pow(s); return;
      default: throw Error("[pointwise] internal: unknown unary op");
    }
  } else {
    float_only<T>("pointwise");
  }
}

// bf16 and f16 compute in f32 a block at a time, through a buffer that stays
// in L1 (4 KiB a block), instead of widening and rounding whole tensors: the
// same values (widening is exact, the f32 result rounds once to nearest
// even) with a third of the memory traffic.
constexpr std::int64_t kHalfBlock = 1024;

template <class H>
void widen_block(const H* x, float* y, std::int64_t n) {
  const auto* bits = reinterpret_cast<const std::uint16_t*>(x);
  if constexpr (std::is_same_v<H, bfloat16>)
    vmath::bf16_to_f32(bits, y, n);
  else
    vmath::f16_to_f32(bits, y, n);
}
template <class H>
void round_block(const float* x, H* y, std::int64_t n) {
  auto* bits = reinterpret_cast<std::uint16_t*>(y);
  if constexpr (std::is_same_v<H, bfloat16>)
    vmath::f32_to_bf16(x, bits, n);
  else
    vmath::f32_to_f16(x, bits, n);
}

// Calls f(i, m) for each block [i, i + m) of n elements.
template <class F>
void for_each_block(std::int64_t n, F&& f) {
  for (std::int64_t i = 0; i < n; i += kHalfBlock) f(i, std::min(kHalfBlock, n - i));
}

template <class H>
void unary_half(Unary fn, const H* x, H* y, std::int64_t n, double scalar) {
  if constexpr (std::is_same_v<H, bfloat16>) {
    // vector_math's functions convert bf16 in registers: no buffer.
    const auto f = fn == Unary::Relu ? std::optional(vmath::Fn::Relu) : vector_fn(fn);
    if (f) {
      vmath::apply_bf16(*f, reinterpret_cast<const std::uint16_t*>(x), reinterpret_cast<std::uint16_t*>(y), n);
      return;
    }
  }
  alignas(64) float buf[kHalfBlock];
  for_each_block(n, [&](std::int64_t i, std::int64_t m) {
    widen_block(x + i, buf, m);
    unary_rows<float>(fn, buf, buf, m, scalar);
    round_block(buf, y + i, m);
  });
}

// The whole of binary for a computed dtype.
template <class T>
void binary_loop(Binary fn, const Loop<2>& loop, const T* x, const T* y, T* o) {
  if (contiguous_binary(fn, loop, x, y, o)) return;
  switch (fn) {
    case Binary::Add: return binary_rows(loop, x, y, o, [](T u, T v) { return u + v; });
    case Binary::Sub: return binary_rows(loop, x, y, o, [](T u, T v) { return u - v; });
    case Binary::Mul: return binary_rows(loop, x, y, o, [](T u, T v) { return u * v; });
    case Binary::Maximum: return binary_rows(loop, x, y, o, [](T u, T v) { return max_nan(u, v); });
    case Binary::Minimum: return binary_rows(loop, x, y, o, [](T u, T v) { return min_nan(u, v); });
    case Binary::Eq: return binary_rows(loop, x, y, o, [](T u, T v) { return T(u == v); });
    case Binary::Ne: return binary_rows(loop, x, y, o, [](T u, T v) { return T(u != v); });
    case Binary::Lt: return binary_rows(loop, x, y, o, [](T u, T v) { return T(u < v); });
    case Binary::Le: return binary_rows(loop, x, y, o, [](T u, T v) { return T(u <= v); });
    case Binary::Gt: return binary_rows(loop, x, y, o, [](T u, T v) { return T(u > v); });
    case Binary::Ge: return binary_rows(loop, x, y, o, [](T u, T v) { return T(u >= v); });
    default: break;
  }
  if constexpr (std::is_floating_point_v<T>) {
    switch (fn) {
      case Binary::Div: return binary_rows(loop, x, y, o, [](T u, T v) { return u / v; });
      case Binary::Pow: return binary_rows(loop, x, y, o, [](T u, T v) { return std::pow(u, v); });
      default: throw Error("[pointwise] internal: unknown binary op");
    }
  } else {
    float_only<T>("pointwise");
  }
}

// Same-shape bf16/f16 operands in blocks; broadcasting ones (rarer) widen
// whole, as the other half-precision CPU kernels do.
template <class H>
void binary_half(Binary fn, const Loop<2>& loop, const Tensor& a, const Tensor& b, Tensor& out) {
  const bool same_shape = !loop.empty && loop.size.size() == 1 && loop.stride[0][0] == 1 && loop.stride[0][1] == 1;
  if (!same_shape) {
    const Tensor wa = a.to(DType::Float32), wb = b.to(DType::Float32);
    Tensor wide = Tensor::empty(out.shape(), DType::Float32);
    binary_loop<float>(fn, loop, wa.data_as<float>(), wb.data_as<float>(), wide.data_as<float>());
    round_block(wide.data_as<float>(), out.data_as<H>(), out.numel());
    return;
  }
  alignas(64) float u[kHalfBlock], v[kHalfBlock];
  const H* x = a.data_as<H>();
  const H* y = b.data_as<H>();
  H* o = out.data_as<H>();
  for_each_block(loop.size[0], [&](std::int64_t i, std::int64_t m) {
    widen_block(x + i, u, m);
    widen_block(y + i, v, m);
    Loop<2> block;
    block.size = {m};
    block.stride = {std::array<std::int64_t, 2>{1, 1}};
    binary_loop<float>(fn, block, u, v, u);
    round_block(u, o + i, m);
  });
}

}  // namespace

Tensor unary(Unary fn, const Tensor& x, double scalar) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  visit_any_dtype(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
      unary_half(fn, x.data_as<T>(), out.data_as<T>(), x.numel(), scalar);
    else
      unary_rows(fn, x.data_as<T>(), out.data_as<T>(), x.numel(), scalar);
  });
  return out;
}

Tensor binary(Binary fn, const Tensor& a, const Tensor& b, const Shape& out_shape) {
  Tensor out = Tensor::empty(out_shape, a.dtype());
  const Loop<2> loop = make_loop<2>(out_shape, {&a.shape(), &b.shape()});
  visit_any_dtype(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
      binary_half<T>(fn, loop, a, b, out);
    else
      binary_loop(fn, loop, a.data_as<T>(), b.data_as<T>(), out.data_as<T>());
  });
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, const Shape& out_shape) {
  Tensor out = Tensor::empty(out_shape, a.dtype());
  const Loop<3> loop = make_loop<3>(out_shape, {&cond.shape(), &a.shape(), &b.shape()});
  visit_dtype(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    run_loop<T, 3>(loop, {cond.data_as<T>(), a.data_as<T>(), b.data_as<T>()}, out.data_as<T>(),
                   [](std::int64_t n, const std::array<const T*, 3>& p, const std::array<std::int64_t, 3>& s, T* o) {
                     if (s[0] == 1 && s[1] == 1 && s[2] == 1) {  // same shapes: a plain select
                       for (std::int64_t j = 0; j < n; ++j) o[j] = p[0][j] != T(0) ? p[1][j] : p[2][j];
                       return;
                     }
                     for (std::int64_t j = 0; j < n; ++j)
                       o[j] = p[0][j * s[0]] != T(0) ? p[1][j * s[1]] : p[2][j * s[2]];
                   });
  });
  return out;
}

}  // namespace dtensor::pointwise
