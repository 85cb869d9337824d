#include "pointwise_kernels.h"

#include <array>
#include <cmath>
#include <optional>
#include <type_traits>

#include <Eigen/Core>

#include "dtensor/core/error.h"
#include "pointwise_loop.h"
#include "vector_math.h"

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

// NaN propagates, as in torch.maximum / torch.minimum.
template <class T>
T max_nan(T x, T y) {
  if constexpr (std::is_floating_point_v<T>)
    if (x != x || y != y) return x != x ? x : y;
  return x > y ? x : y;
}
template <class T>
T min_nan(T x, T y) {
  if constexpr (std::is_floating_point_v<T>)
    if (x != x || y != y) return x != x ? x : y;
  return x < y ? x : y;
}

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

}  // namespace

Tensor unary(Unary fn, const Tensor& x, double scalar) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  visit_dtype(x.dtype(), [&](auto zero) {
    using T = decltype(zero);
    using Array = Eigen::Array<T, Eigen::Dynamic, 1>;
    Eigen::Map<const Array> X(x.data_as<T>(), static_cast<Eigen::Index>(x.numel()));
    Eigen::Map<Array> Y(out.data_as<T>(), static_cast<Eigen::Index>(out.numel()));
    const T s = static_cast<T>(scalar);
    switch (fn) {
      case Unary::Neg: Y = -X; return;
      case Unary::Abs: Y = X.abs(); return;
      case Unary::Relu:
        if constexpr (std::is_floating_point_v<T>) {
          vmath::apply(vmath::Fn::Relu, x.data_as<T>(), out.data_as<T>(), x.numel());
          return;
        }
        Y = X.max(T(0));
        return;
      case Unary::AddScalar: Y = X + s; return;
      case Unary::MulScalar: Y = X * s; return;
      default: break;
    }
    if constexpr (std::is_floating_point_v<T>) {
      if (const auto f = vector_fn(fn); f && !(fn == Unary::Gelu && std::is_same_v<T, double>)) {
        vmath::apply(*f, x.data_as<T>(), out.data_as<T>(), x.numel());
        return;
      }
      switch (fn) {
        case Unary::Gelu:  // f64: exact (erf) form, PyTorch's approximate='none'
          Y = X.unaryExpr([](T v) { return T(0.5) * v * (T(1) + std::erf(v * T(M_SQRT1_2))); });
          return;
        case Unary::DivScalar: Y = X / s; return;
        case Unary::PowScalar: Y = X.pow(s); return;
        default: throw Error("[pointwise] internal: unknown unary op");
      }
    } else {
      float_only<T>("pointwise");
    }
  });
  return out;
}

Tensor binary(Binary fn, const Tensor& a, const Tensor& b, const Shape& out_shape) {
  Tensor out = Tensor::empty(out_shape, a.dtype());
  const Loop<2> loop = make_loop<2>(out_shape, {&a.shape(), &b.shape()});
  visit_dtype(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* x = a.data_as<T>();
    const T* y = b.data_as<T>();
    T* o = out.data_as<T>();
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
