#pragma once
// Internal: the CPU's vectorised elementwise math (vector_math.cpp), compiled
// by Google Highway for several x86 (or other) targets and dispatched at run
// time to the widest the CPU has. Every function takes contiguous arrays of
// n elements; y may alias x. Accuracy, measured against the std:: function in
// double by tests/test_vector_math.cpp, is documented there per function and
// dtype. NaN, +-inf and +-0 give what the std:: formula gives (sigmoid is
// 1/(1+exp(-x)), silu x/(1+exp(-x)), gelu x/2*(1+erf(x/sqrt(2))), rsqrt
// 1/sqrt(x), relu x < 0 ? 0 : x).
#include <cmath>
#include <cstdint>
#include <functional>

namespace dtensor::cpu::vmath {

enum class Fn { Exp, Log, Tanh, Sigmoid, Silu, Gelu, Sqrt, Rsqrt, Relu };
enum class BinFn { Add, Sub, Mul, Div };

/// y = fn(x), f32 and f64; relu keeps NaN and -0 (x < 0 ? 0 : x). Outputs of
/// 4 MiB or more are written with streaming stores, as binary's.
void apply(Fn fn, const float* x, float* y, std::int64_t n);
void apply(Fn fn, const double* x, double* y, std::int64_t n);

/// y = fn(a, b) for same-length contiguous a and b; stores bypass the cache
/// (streaming) for outputs too big for it, so a fresh output costs no
/// read-for-ownership traffic.
void binary(BinFn fn, const float* a, const float* b, float* y, std::int64_t n);
void binary(BinFn fn, const double* a, const double* b, double* y, std::int64_t n);

/// Softmax's inner loops: y = exp(x - m) and returns sum(y) (one row, a
/// scalar max m); and the strided form y[j] = exp(x[j] - m[j]), s[j] += y[j].
float exp_sub_sum(const float* x, float m, float* y, std::int64_t n);
double exp_sub_sum(const double* x, double m, double* y, std::int64_t n);
void exp_sub_accumulate(const float* x, const float* m, float* y, float* s, std::int64_t n);
void exp_sub_accumulate(const double* x, const double* m, double* y, double* s, std::int64_t n);

/// y = g * gelu'(x) for f32, gelu the exact (erf) form: gelu'(x) = Phi(x) +
/// x phi(x), with Phi(x) = gelu(x) / x (1/2 at 0) from the vector gelu and
/// phi(x) = exp(-x^2/2) / sqrt(2 pi), in one pass (the backward of gelu).
void gelu_backward(const float* x, const float* g, float* y, std::int64_t n);

/// Layer norm's backward on one row of n f32 values (rms norm's with
/// `rms`: no mean), the row's mean and 1/sqrt(var + eps) recomputed from x:
/// out = dL/dx for the gradient g of the normalised output times the weight
/// w (null: none); and the weight gradient's term of the row, g * xhat,
/// added into wg. Sums run in vector lanes.
void norm_backward_row(const float* x, const float* g, const float* w, float* out, std::int64_t n, float eps,
                       bool rms);
void norm_weight_backward_row(const float* x, const float* g, float* wg, std::int64_t n, float eps, bool rms);

/// One AdamW step's constants for one parameter (decoupled weight decay,
/// bias corrections folded in): decay = 1 - lr * weight_decay, step_size =
/// lr / (1 - beta1^t), bias2_sqrt = sqrt(1 - beta2^t).
template <class C>
struct AdamWConstants {
  C beta1, beta2, eps, decay, step_size, bias2_sqrt;
};

/// AdamW on one element, in place: the formula every path runs (the
/// vectorised one does the same operations in the same order; the compiler
/// may fuse a multiply-add there).
template <class C>
inline void adamw_element(const AdamWConstants<C>& k, C g, C& m, C& v, C& p) {
  m = k.beta1 * m + (1 - k.beta1) * g;
  v = k.beta2 * v + (1 - k.beta2) * g * g;
  const C denom = std::sqrt(v) / k.bias2_sqrt + k.eps;
  p = p * k.decay - k.step_size * m / denom;
}

/// AdamW over n contiguous elements: one pass over parameter, gradient and
/// both moments.
void adamw(const AdamWConstants<float>& k, float* p, const float* g, float* m, float* v, std::int64_t n);
void adamw(const AdamWConstants<double>& k, double* p, const double* g, double* m, double* v, std::int64_t n);

/// bf16 (as its bits) to f32, exactly; and f32 to bf16 with bfloat16(float)'s
/// rounding (nearest even, NaN kept a quiet NaN), bit for bit.
void bf16_to_f32(const std::uint16_t* x, float* y, std::int64_t n);
void f32_to_bf16(const float* x, std::uint16_t* y, std::int64_t n);
/// y = fn(x) for bf16 (as bits): bit for bit f32_to_bf16(apply(fn,
/// bf16_to_f32(x))), converted in registers; y may alias x.
void apply_bf16(Fn fn, const std::uint16_t* x, std::uint16_t* y, std::int64_t n);
/// f16 likewise: to f32 exactly (a NaN stays a NaN of the same sign), and
/// back with float16(float)'s rounding, bit for bit.
void f16_to_f32(const std::uint16_t* x, float* y, std::int64_t n);
void f32_to_f16(const float* x, std::uint16_t* y, std::int64_t n);

/// The SIMD target the dispatch chooses on this CPU ("AVX3", "AVX2", ...).
const char* target_name();

/// For the tests: runs fn once per SIMD target compiled in that this CPU
/// can run, with the dispatch forced to that target, then restores the
/// normal choice. (Once, with the fallback's name, without Highway.)
void for_each_target(const std::function<void()>& fn);

}  // namespace dtensor::cpu::vmath
