// vector_math.h without Google Highway (libhwy-dev not found at configure
// time): the functions of vector_math.cpp (f32, f64) and vector_math_half.cpp
// (bf16, f16) in one file, as plain loops over the std:: functions, which
// the compiler vectorises only for the cheap ones.
#include <cmath>
#include <cstring>
#include <cstdint>

#include "dtensor/core/half.h"
#include "dtensor/ops/detail/vector_math.h"
#include "norm_rows.h"

namespace dtensor::cpu::vmath {
namespace {

template <class T>
T eval(Fn fn, T x) {
  switch (fn) {
    case Fn::Exp: return std::exp(x);
    case Fn::Log: return std::log(x);
    case Fn::Tanh: return std::tanh(x);
    case Fn::Sigmoid: return T(1) / (T(1) + std::exp(-x));
    case Fn::Silu: return x / (T(1) + std::exp(-x));
    case Fn::Gelu: return T(0.5) * x * (T(1) + std::erf(x * T(M_SQRT1_2)));
    case Fn::Sqrt: return std::sqrt(x);
    case Fn::Rsqrt: return T(1) / std::sqrt(x);
    case Fn::Relu: return x < T(0) ? T(0) : x;
  }
  return x;
}

template <class T>
void binary_t(BinFn fn, const T* a, const T* b, T* y, std::int64_t n) {
  switch (fn) {
    case BinFn::Add:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
      return;
    case BinFn::Sub:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] - b[i];
      return;
    case BinFn::Mul:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
      return;
    case BinFn::Div:
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] / b[i];
      return;
  }
}

template <class T>
T exp_sub_sum_t(const T* x, T m, T* y, std::int64_t n) {
  T sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += y[i] = std::exp(x[i] - m);
  return sum;
}

template <class T>
void exp_sub_accumulate_t(const T* x, const T* m, T* y, T* s, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) s[i] += y[i] = std::exp(x[i] - m[i]);
}

}  // namespace

void apply(Fn fn, const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = eval(fn, x[i]);
}
void apply(Fn fn, const double* x, double* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = eval(fn, x[i]);
}
void binary(BinFn fn, const float* a, const float* b, float* y, std::int64_t n) { binary_t(fn, a, b, y, n); }
void binary(BinFn fn, const double* a, const double* b, double* y, std::int64_t n) { binary_t(fn, a, b, y, n); }
float exp_sub_sum(const float* x, float m, float* y, std::int64_t n) { return exp_sub_sum_t(x, m, y, n); }
double exp_sub_sum(const double* x, double m, double* y, std::int64_t n) { return exp_sub_sum_t(x, m, y, n); }
void exp_sub_accumulate(const float* x, const float* m, float* y, float* s, std::int64_t n) {
  exp_sub_accumulate_t(x, m, y, s, n);
}
void exp_sub_accumulate(const double* x, const double* m, double* y, double* s, std::int64_t n) {
  exp_sub_accumulate_t(x, m, y, s, n);
}
void bf16_to_f32(const std::uint16_t* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(x[i]) << 16;
    std::memcpy(y + i, &u, sizeof u);
  }
}
void f32_to_bf16(const float* x, std::uint16_t* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, x + i, sizeof u);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    y[i] = static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
  }
}
void apply_bf16(Fn fn, const std::uint16_t* x, std::uint16_t* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    float f;
    bf16_to_f32(x + i, &f, 1);
    f = eval(fn, f);
    f32_to_bf16(&f, y + i, 1);
  }
}
void f16_to_f32(const std::uint16_t* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(float16::from_bits(x[i]));
}
void f32_to_f16(const float* x, std::uint16_t* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = float16(x[i]).bits;
}
const char* target_name() { return "none (built without Highway)"; }
void for_each_target(const std::function<void()>& fn) { fn(); }

void adamw(const AdamWConstants<float>& k, float* p, const float* g, float* m, float* v, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) adamw_element(k, g[i], m[i], v[i], p[i]);
}
void adamw(const AdamWConstants<double>& k, double* p, const double* g, double* m, double* v, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) adamw_element(k, g[i], m[i], v[i], p[i]);
}

void gelu_backward(const float* x, const float* g, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float cdf = x[i] == 0.0f ? 0.5f : eval(Fn::Gelu, x[i]) / x[i];
    const float pdf = std::exp(-0.5f * x[i] * x[i]) * 0.3989422804014327f;
    y[i] = g[i] * (cdf + x[i] * pdf);
  }
}

void norm_backward_row(const float* x, const float* g, const float* w, float* out, std::int64_t n, float eps,
                       bool rms) {
  norm_rows::backward(x, g, w, out, n, eps, rms);
}
void norm_weight_backward_row(const float* x, const float* g, float* wg, std::int64_t n, float eps, bool rms) {
  norm_rows::weight_backward(x, g, wg, n, eps, rms);
}

}  // namespace dtensor::cpu::vmath
