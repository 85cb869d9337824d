#pragma once
// Front-end functions of the pointwise ops, for DTensor and Tensor alike:
// thin templates over call_op (the op's meta function validates shapes and
// dtypes and names the bad value).
//
// Semantics, as in PyTorch unless noted:
// - Binary ops and where broadcast numpy style (trailing dims aligned, size 1
//   stretches). Inputs must share one dtype: there is no type promotion
//   (DTypeError naming both dtypes).
// - Comparisons (eq, ne, lt, le, gt, ge) return 1 where true and 0 where false
//   in the inputs' dtype (there is no bool dtype); where() takes such a
//   tensor as its condition (nonzero = true), in the same dtype as a and b.
// - exp, log, sqrt, rsqrt, tanh, sigmoid, gelu, silu, div, pow and the
//   scalar div/pow are f32/f64 only: on i64 they raise DTypeError naming the
//   op. Scalars on i64 tensors must be integers (ValueError otherwise).
// - gelu is the exact erf form (PyTorch's approximate='none').
// - maximum/minimum propagate NaN.
// - `a += b` rebinds a to the new result (a = a + b); other handles to the old
//   value are untouched. The in-place forms add_, sub_, mul_, div_ (tensor or
//   scalar operand) write into a's own storage, so every handle sharing it
//   sees the change; on a DTensor the result is first brought back to a's
//   layout (as PyTorch does), and a keeps its placements. ShapeError if
//   broadcasting would change a's shape.
// On DTensors, shardings propagate (see ops/src/pointwise.cpp): shards follow
// through broadcasting, and Partial survives only where the op's algebra
// allows it (neg, mul/div by a scalar or by a Replicate operand, add/sub of
// two Partials, where with a Replicate condition; max/min Partials through
// monotone ops and maximum/minimum). Anything else reduces its Partial inputs
// first.
// Inside namespace dtensor these names (exp, log, abs, pow, div, ...) hide the
// C library's for unqualified calls: library code writes std::exp.
#include <concepts>
#include <initializer_list>
#include <string_view>

#include "dtensor/api/functional.h"

namespace dtensor {

namespace pointwise_detail {
template <class X, std::same_as<X>... Xs>
X call(Op op, const X& x, const Xs&... xs) {
  return call_op_on<X>(op, {}, x, xs...);
}
template <class X>
X call(Op op, const X& x, double scalar) {
  return call_op_on<X>(op, ScalarAttrs{.value = scalar}, x);
}
}  // namespace pointwise_detail

// One line per op, read as a table: clang-format would break each after its
// template head.
// clang-format off
// ---- Unary ------------------------------------------------------------------
/// -x.
template <TensorOrDTensor X> X neg(const X& x) { return pointwise_detail::call<X>(registered_op<"neg">(), x); }
/// |x|.
template <TensorOrDTensor X> X abs(const X& x) { return pointwise_detail::call<X>(registered_op<"abs">(), x); }
/// e^x (floating dtypes: f32, f64, bf16, f16).
template <TensorOrDTensor X> X exp(const X& x) { return pointwise_detail::call<X>(registered_op<"exp">(), x); }
/// Natural log (floating dtypes: f32, f64, bf16, f16).
template <TensorOrDTensor X> X log(const X& x) { return pointwise_detail::call<X>(registered_op<"log">(), x); }
/// Square root (floating dtypes: f32, f64, bf16, f16).
template <TensorOrDTensor X> X sqrt(const X& x) { return pointwise_detail::call<X>(registered_op<"sqrt">(), x); }
/// 1/sqrt(x) (floating dtypes: f32, f64, bf16, f16).
template <TensorOrDTensor X> X rsqrt(const X& x) { return pointwise_detail::call<X>(registered_op<"rsqrt">(), x); }
/// tanh (floating dtypes: f32, f64, bf16, f16).
template <TensorOrDTensor X> X tanh(const X& x) { return pointwise_detail::call<X>(registered_op<"tanh">(), x); }
/// 1/(1+e^-x) (floating dtypes: f32, f64, bf16, f16).
template <TensorOrDTensor X> X sigmoid(const X& x) { return pointwise_detail::call<X>(registered_op<"sigmoid">(), x); }
/// max(x, 0).
template <TensorOrDTensor X> X relu(const X& x) { return pointwise_detail::call<X>(registered_op<"relu">(), x); }
/// x * Phi(x), the exact erf form (floating dtypes: f32, f64, bf16, f16).
template <TensorOrDTensor X> X gelu(const X& x) { return pointwise_detail::call<X>(registered_op<"gelu">(), x); }
/// x * sigmoid(x) (floating dtypes: f32, f64, bf16, f16).
template <TensorOrDTensor X> X silu(const X& x) { return pointwise_detail::call<X>(registered_op<"silu">(), x); }

// ---- With a scalar ------------------------------------------------------------
/// x + s.
template <TensorOrDTensor X> X add(const X& x, double s) { return pointwise_detail::call<X>(registered_op<"add_scalar">(), x, s); }
/// x * s.
template <TensorOrDTensor X> X mul(const X& x, double s) { return pointwise_detail::call<X>(registered_op<"mul_scalar">(), x, s); }
/// x / s (floating dtypes: f32, f64, bf16, f16).
template <TensorOrDTensor X> X div(const X& x, double s) { return pointwise_detail::call<X>(registered_op<"div_scalar">(), x, s); }
/// x ^ s (floating dtypes: f32, f64, bf16, f16).
template <TensorOrDTensor X> X pow(const X& x, double s) { return pointwise_detail::call<X>(registered_op<"pow_scalar">(), x, s); }

// ---- Binary, broadcasting -------------------------------------------------------
template <TensorOrDTensor X> X add(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"add">(), a, b); }
template <TensorOrDTensor X> X sub(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"sub">(), a, b); }
template <TensorOrDTensor X> X mul(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"mul">(), a, b); }
/// a / b (floating dtypes: f32, f64, bf16, f16).
template <TensorOrDTensor X> X div(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"div">(), a, b); }
/// a ^ b (floating dtypes: f32, f64, bf16, f16).
template <TensorOrDTensor X> X pow(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"pow">(), a, b); }
template <TensorOrDTensor X> X maximum(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"maximum">(), a, b); }
template <TensorOrDTensor X> X minimum(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"minimum">(), a, b); }

/// Comparisons: 1 where true, 0 where false, in the inputs' dtype.
template <TensorOrDTensor X> X eq(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"eq">(), a, b); }
template <TensorOrDTensor X> X ne(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"ne">(), a, b); }
template <TensorOrDTensor X> X lt(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"lt">(), a, b); }
template <TensorOrDTensor X> X le(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"le">(), a, b); }
template <TensorOrDTensor X> X gt(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"gt">(), a, b); }
template <TensorOrDTensor X> X ge(const X& a, const X& b) { return pointwise_detail::call<X>(registered_op<"ge">(), a, b); }

/// a where cond != 0, else b; all three broadcast together and share a dtype.
template <TensorOrDTensor X> X where(const X& cond, const X& a, const X& b) {
  return pointwise_detail::call<X>(registered_op<"where">(), cond, a, b);
}

// ---- Operators ----------------------------------------------------------------------
template <TensorOrDTensor X> X operator-(const X& x) { return neg(x); }
template <TensorOrDTensor X> X operator+(const X& a, const X& b) { return add(a, b); }
template <TensorOrDTensor X> X operator-(const X& a, const X& b) { return sub(a, b); }
template <TensorOrDTensor X> X operator*(const X& a, const X& b) { return mul(a, b); }
template <TensorOrDTensor X> X operator/(const X& a, const X& b) { return div(a, b); }
template <TensorOrDTensor X> X operator+(const X& x, double s) { return add(x, s); }
template <TensorOrDTensor X> X operator+(double s, const X& x) { return add(x, s); }
template <TensorOrDTensor X> X operator-(const X& x, double s) { return add(x, -s); }
/// s - x: two ops (neg, add_scalar).
template <TensorOrDTensor X> X operator-(double s, const X& x) { return add(neg(x), s); }
template <TensorOrDTensor X> X operator*(const X& x, double s) { return mul(x, s); }
template <TensorOrDTensor X> X operator*(double s, const X& x) { return mul(x, s); }
template <TensorOrDTensor X> X operator/(const X& x, double s) { return div(x, s); }
/// s / x: two ops (pow_scalar -1, mul_scalar); f32, f64, bf16, f16.
template <TensorOrDTensor X> X operator/(double s, const X& x) { return mul(pow(x, -1.0), s); }

/// Compound assignment rebinds the handle (no in-place write, see above).
template <TensorOrDTensor X> X& operator+=(X& a, const X& b) { return a = add(a, b); }
template <TensorOrDTensor X> X& operator-=(X& a, const X& b) { return a = sub(a, b); }
template <TensorOrDTensor X> X& operator*=(X& a, const X& b) { return a = mul(a, b); }
template <TensorOrDTensor X> X& operator/=(X& a, const X& b) { return a = div(a, b); }
template <TensorOrDTensor X> X& operator+=(X& a, double s) { return a = add(a, s); }
template <TensorOrDTensor X> X& operator-=(X& a, double s) { return a = add(a, -s); }
template <TensorOrDTensor X> X& operator*=(X& a, double s) { return a = mul(a, s); }
template <TensorOrDTensor X> X& operator/=(X& a, double s) { return a = div(a, s); }

// clang-format on

// ---- In place ---------------------------------------------------------------

namespace pointwise_detail {
template <TensorOrDTensor X>
X& assign_in_place(std::string_view op, X& a, const X& result) {
  if (result.shape() != a.shape())
    throw ShapeError(fmt::format("[{}] in place would change the shape {} to {}", op, fmt::join(a.shape(), "x"),
                                 fmt::join(result.shape(), "x")));
  Tensor dst, src;
  if constexpr (std::same_as<X, DTensor>) {
    dst = a.to_local();  // shares a's storage
    src = result.placements() == a.placements() ? result.to_local() : result.redistribute(a.placements()).to_local();
  } else {
    dst = a;
    src = result;
  }
  copy_into(src, dst);  // a device copy where the shards live on the GPU
  return a;
}
}  // namespace pointwise_detail

// clang-format off
template <TensorOrDTensor X> X& add_(X& a, const X& b) { return pointwise_detail::assign_in_place("add_", a, add(a, b)); }
template <TensorOrDTensor X> X& sub_(X& a, const X& b) { return pointwise_detail::assign_in_place("sub_", a, sub(a, b)); }
template <TensorOrDTensor X> X& mul_(X& a, const X& b) { return pointwise_detail::assign_in_place("mul_", a, mul(a, b)); }
template <TensorOrDTensor X> X& div_(X& a, const X& b) { return pointwise_detail::assign_in_place("div_", a, div(a, b)); }
template <TensorOrDTensor X> X& add_(X& a, double s) { return pointwise_detail::assign_in_place("add_", a, add(a, s)); }
template <TensorOrDTensor X> X& mul_(X& a, double s) { return pointwise_detail::assign_in_place("mul_", a, mul(a, s)); }
// clang-format on

}  // namespace dtensor
