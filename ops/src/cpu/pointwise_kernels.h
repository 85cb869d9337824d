#pragma once
// Internal: the CPU kernels of the pointwise family (ops/src/pointwise.cpp).
// Type-erased entry points over f32, f64 and i64; the op's meta function has
// already checked dtypes and shapes, so these only assert invariants.
#include "dtensor/core/shape.h"
#include "dtensor/core/tensor.h"

namespace dtensor::pointwise {

enum class Unary {
  Neg,
  Abs,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Tanh,
  Sigmoid,
  Relu,
  Gelu,
  Silu,
  AddScalar,
  MulScalar,
  DivScalar,
  PowScalar
};
enum class Binary { Add, Sub, Mul, Div, Pow, Maximum, Minimum, Eq, Ne, Lt, Le, Gt, Ge };

/// y = f(x) elementwise (x contiguous, same shape out); `scalar` for the
/// *_scalar ops, converted to the tensor's dtype.
Tensor unary(Unary fn, const Tensor& x, double scalar);
/// f(a, b) with numpy broadcasting of a's and b's (local) shapes to `out_shape`.
Tensor binary(Binary fn, const Tensor& a, const Tensor& b, const Shape& out_shape);
/// cond != 0 ? a : b, all three broadcast to `out_shape`; a and b share a dtype.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b, const Shape& out_shape);

}  // namespace dtensor::pointwise
