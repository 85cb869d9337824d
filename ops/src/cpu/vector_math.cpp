// The CPU's vectorised elementwise math (vector_math.h), f32 and f64: the
// unary functions, the binary ones and softmax's loops. The kernels they
// run are in vector_math-inl.h; bf16 and f16 are in vector_math_half.cpp.
// Highway compiles this file once per SIMD target (foreach_target.h
// re-includes it) and HWY_DYNAMIC_DISPATCH picks the widest target the CPU
// supports on first use, so one binary runs on any x86-64 and uses AVX-512
// where it is there. The Highway targets compiled are set once, in the
// root meson.build.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/vector_math.cpp"
#include "dtensor/core/detail/strided_copy.h"

#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "dtensor/ops/detail/vector_math.h"

HWY_BEFORE_NAMESPACE();
namespace dtensor::cpu::vmath::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#include "vector_math-inl.h"

void ApplyF32(Fn fn, const float* x, float* y, std::int64_t n) { ApplyT(fn, x, y, n); }
void ApplyF64(Fn fn, const double* x, double* y, std::int64_t n) { ApplyT(fn, x, y, n); }

// One step of a binary op, on vectors or (the loop's ends) single values.
template <BinFn F, class V>
HWY_INLINE V Combine(V u, V v) {
  if constexpr (std::is_floating_point_v<V>) {
    if constexpr (F == BinFn::Add) return u + v;
    if constexpr (F == BinFn::Sub) return u - v;
    if constexpr (F == BinFn::Mul) return u * v;
    if constexpr (F == BinFn::Div) return u / v;
  } else {
    if constexpr (F == BinFn::Add) return hn::Add(u, v);
    if constexpr (F == BinFn::Sub) return hn::Sub(u, v);
    if constexpr (F == BinFn::Mul) return hn::Mul(u, v);
    if constexpr (F == BinFn::Div) return hn::Div(u, v);
  }
}

template <BinFn F, class T>
HWY_INLINE void BinaryLoop(const T* a, const T* b, T* y, std::int64_t n) {
  const hn::ScalableTag<T> d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  const bool stream = n * static_cast<std::int64_t>(sizeof(T)) >= kStreamStoreBytes;
  if (stream) {
    for (; i < n && reinterpret_cast<std::uintptr_t>(y + i) % (N * sizeof(T)) != 0; ++i) y[i] = Combine<F>(a[i], b[i]);
    for (; i + N <= n; i += N) hn::Stream(Combine<F>(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, y + i);
    hwy::FlushStream();
  } else {
    for (; i + N <= n; i += N) hn::StoreU(Combine<F>(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, y + i);
  }
  for (; i < n; ++i) y[i] = Combine<F>(a[i], b[i]);
}

template <class T>
HWY_NOINLINE void BinaryT(BinFn fn, const T* a, const T* b, T* y, std::int64_t n) {
  switch (fn) {
    case BinFn::Add: return BinaryLoop<BinFn::Add>(a, b, y, n);
    case BinFn::Sub: return BinaryLoop<BinFn::Sub>(a, b, y, n);
    case BinFn::Mul: return BinaryLoop<BinFn::Mul>(a, b, y, n);
    case BinFn::Div: return BinaryLoop<BinFn::Div>(a, b, y, n);
  }
}
void BinaryF32(BinFn fn, const float* a, const float* b, float* y, std::int64_t n) { BinaryT(fn, a, b, y, n); }
void BinaryF64(BinFn fn, const double* a, const double* b, double* y, std::int64_t n) { BinaryT(fn, a, b, y, n); }

template <class T>
HWY_NOINLINE T ExpSubSumT(const T* x, T m, T* y, std::int64_t n) {
  const hn::ScalableTag<T> d;
  const auto vm = hn::Set(d, m);
  auto acc = hn::Zero(d);
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto e = ExpFull(d, hn::Sub(hn::LoadU(d, x + i), vm));
    hn::StoreU(e, d, y + i);
    acc = hn::Add(acc, e);
  }
  T sum = hn::GetLane(hn::SumOfLanes(d, acc));
  if (i < n) {
    HWY_ALIGN T buf[hn::MaxLanes(d)] = {};
    for (std::int64_t j = i; j < n; ++j) buf[j - i] = x[j];
    hn::Store(ExpFull(d, hn::Sub(hn::Load(d, buf), vm)), d, buf);
    for (std::int64_t j = i; j < n; ++j) {
      y[j] = buf[j - i];
      sum += buf[j - i];
    }
  }
  return sum;
}
float ExpSubSumF32(const float* x, float m, float* y, std::int64_t n) { return ExpSubSumT(x, m, y, n); }
double ExpSubSumF64(const double* x, double m, double* y, std::int64_t n) { return ExpSubSumT(x, m, y, n); }

template <class T>
HWY_NOINLINE void ExpSubAccumulateT(const T* x, const T* m, T* y, T* s, std::int64_t n) {
  const hn::ScalableTag<T> d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto e = ExpFull(d, hn::Sub(hn::LoadU(d, x + i), hn::LoadU(d, m + i)));
    hn::StoreU(e, d, y + i);
    hn::StoreU(hn::Add(hn::LoadU(d, s + i), e), d, s + i);
  }
  for (; i < n; ++i) {
    HWY_ALIGN T buf[hn::MaxLanes(d)] = {};
    buf[0] = x[i] - m[i];
    hn::Store(ExpFull(d, hn::Load(d, buf)), d, buf);
    y[i] = buf[0];
    s[i] += buf[0];
  }
}
void ExpSubAccumulateF32(const float* x, const float* m, float* y, float* s, std::int64_t n) {
  ExpSubAccumulateT(x, m, y, s, n);
}
void ExpSubAccumulateF64(const double* x, const double* m, double* y, double* s, std::int64_t n) {
  ExpSubAccumulateT(x, m, y, s, n);
}

HWY_NOINLINE void GeluBackwardF32(const float* x, const float* g, float* y, std::int64_t n) {
  const hn::ScalableTag<float> d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  const auto zero = hn::Zero(d), half = hn::Set(d, 0.5f), minus_half = hn::Set(d, -0.5f),
             inv_sqrt_2pi = hn::Set(d, 0.3989422804014327f);
  const auto step = [&](auto xv, auto gv) {
    const auto cdf = hn::IfThenElse(hn::Eq(xv, zero), half, hn::Div(Gelu(d, xv), xv));
    const auto pdf = hn::Mul(ExpFull(d, hn::Mul(minus_half, hn::Mul(xv, xv))), inv_sqrt_2pi);
    return hn::Mul(gv, hn::Add(cdf, hn::Mul(xv, pdf)));
  };
  std::int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(step(hn::LoadU(d, x + i), hn::LoadU(d, g + i)), d, y + i);
  if (i < n) {  // the tail through the same vector code (see AdamWT)
    HWY_ALIGN float bx[hn::MaxLanes(d)] = {}, bg[hn::MaxLanes(d)] = {};
    std::copy(x + i, x + n, bx), std::copy(g + i, g + n, bg);
    hn::Store(step(hn::Load(d, bx), hn::Load(d, bg)), d, bx);
    std::copy(bx, bx + (n - i), y + i);
  }
}

// The mean (0 for rms) and 1/sqrt(var + eps) of one row, summed in lanes.
template <class D>
HWY_INLINE void RowStats(D d, const float* x, std::int64_t n, float eps, bool rms, float& mean, float& rstd) {
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  mean = 0;
  if (!rms) {
    auto acc = hn::Zero(d);
    std::int64_t i = 0;
    for (; i + N <= n; i += N) acc = hn::Add(acc, hn::LoadU(d, x + i));
    float s = hn::GetLane(hn::SumOfLanes(d, acc));
    for (; i < n; ++i) s += x[i];
    mean = s / static_cast<float>(n);
  }
  const auto m = hn::Set(d, mean);
  auto acc = hn::Zero(d);
  std::int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto c = hn::Sub(hn::LoadU(d, x + i), m);
    acc = hn::MulAdd(c, c, acc);
  }
  float v = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) v += (x[i] - mean) * (x[i] - mean);
  rstd = 1.0f / std::sqrt(v / static_cast<float>(n) + eps);
}

HWY_NOINLINE void NormBackwardRowF32(const float* x, const float* g, const float* w, float* out, std::int64_t n,
                                     float eps, bool rms) {
  const hn::ScalableTag<float> d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  float mean = 0, rstd = 0;
  RowStats(d, x, n, eps, rms, mean, rstd);
  const auto m = hn::Set(d, mean), r = hn::Set(d, rstd);
  const auto grad_at = [&](std::int64_t i) {
    return w ? hn::Mul(hn::LoadU(d, g + i), hn::LoadU(d, w + i)) : hn::LoadU(d, g + i);
  };
  auto acc_g = hn::Zero(d), acc_gx = hn::Zero(d);
  std::int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto gi = grad_at(i);
    acc_g = hn::Add(acc_g, gi);
    acc_gx = hn::MulAdd(gi, hn::Mul(hn::Sub(hn::LoadU(d, x + i), m), r), acc_gx);
  }
  float sum_g = hn::GetLane(hn::SumOfLanes(d, acc_g)), sum_gx = hn::GetLane(hn::SumOfLanes(d, acc_gx));
  for (std::int64_t j = i; j < n; ++j) {
    const float gj = w ? g[j] * w[j] : g[j];
    sum_g += gj;
    sum_gx += gj * (x[j] - mean) * rstd;
  }
  const float mean_g = rms ? 0.0f : sum_g / static_cast<float>(n), mean_gx = sum_gx / static_cast<float>(n);
  const auto mg = hn::Set(d, mean_g), mgx = hn::Set(d, mean_gx);
  for (i = 0; i + N <= n; i += N) {
    const auto xhat = hn::Mul(hn::Sub(hn::LoadU(d, x + i), m), r);
    hn::StoreU(hn::Mul(r, hn::Sub(hn::Sub(grad_at(i), mg), hn::Mul(xhat, mgx))), d, out + i);
  }
  for (; i < n; ++i) {
    const float gi = w ? g[i] * w[i] : g[i];
    out[i] = rstd * (gi - mean_g - (x[i] - mean) * rstd * mean_gx);
  }
}

HWY_NOINLINE void NormWeightBackwardRowF32(const float* x, const float* g, float* wg, std::int64_t n, float eps,
                                           bool rms) {
  const hn::ScalableTag<float> d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  float mean = 0, rstd = 0;
  RowStats(d, x, n, eps, rms, mean, rstd);
  const auto m = hn::Set(d, mean), r = hn::Set(d, rstd);
  std::int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::MulAdd(hn::LoadU(d, g + i), hn::Mul(hn::Sub(hn::LoadU(d, x + i), m), r), hn::LoadU(d, wg + i)), d,
               wg + i);
  for (; i < n; ++i) wg[i] += g[i] * (x[i] - mean) * rstd;
}

template <class T>
HWY_NOINLINE void AdamWT(const AdamWConstants<T>& k, T* p, const T* g, T* m, T* v, std::int64_t n) {
  const hn::ScalableTag<T> d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  const auto b1 = hn::Set(d, k.beta1), b2 = hn::Set(d, k.beta2), one_b1 = hn::Set(d, 1 - k.beta1),
             one_b2 = hn::Set(d, 1 - k.beta2), eps = hn::Set(d, k.eps), decay = hn::Set(d, k.decay),
             step = hn::Set(d, k.step_size), bc2 = hn::Set(d, k.bias2_sqrt);
  const auto update = [&](T* pp, const T* gp, T* mp, T* vp) {
    const auto gi = hn::LoadU(d, gp);
    const auto mi = hn::Add(hn::Mul(b1, hn::LoadU(d, mp)), hn::Mul(one_b1, gi));
    const auto vi = hn::Add(hn::Mul(b2, hn::LoadU(d, vp)), hn::Mul(hn::Mul(one_b2, gi), gi));
    hn::StoreU(mi, d, mp);
    hn::StoreU(vi, d, vp);
    const auto denom = hn::Add(hn::Div(hn::Sqrt(vi), bc2), eps);
    hn::StoreU(hn::Sub(hn::Mul(hn::LoadU(d, pp), decay), hn::Div(hn::Mul(step, mi), denom)), d, pp);
  };
  std::int64_t i = 0;
  for (; i + N <= n; i += N) update(p + i, g + i, m + i, v + i);
  if (i < n) {
    // The tail through the same vector code (the compiler may contract a
    // multiply-add in it, and a scalar tail would round differently), so an
    // element's result never depends on where a shard boundary put it.
    HWY_ALIGN T bp[hn::MaxLanes(d)] = {}, bg[hn::MaxLanes(d)] = {}, bm[hn::MaxLanes(d)] = {},
                bv[hn::MaxLanes(d)] = {};
    const std::int64_t r = n - i;
    std::copy(p + i, p + n, bp), std::copy(g + i, g + n, bg), std::copy(m + i, m + n, bm), std::copy(v + i, v + n, bv);
    update(bp, bg, bm, bv);
    std::copy(bp, bp + r, p + i), std::copy(bm, bm + r, m + i), std::copy(bv, bv + r, v + i);
  }
}
void AdamWF32(const AdamWConstants<float>& k, float* p, const float* g, float* m, float* v, std::int64_t n) {
  AdamWT(k, p, g, m, v, n);
}
void AdamWF64(const AdamWConstants<double>& k, double* p, const double* g, double* m, double* v, std::int64_t n) {
  AdamWT(k, p, g, m, v, n);
}

}  // namespace dtensor::cpu::vmath::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dtensor::cpu::vmath {

HWY_EXPORT(ApplyF32);
HWY_EXPORT(ApplyF64);
HWY_EXPORT(BinaryF32);
HWY_EXPORT(BinaryF64);
HWY_EXPORT(ExpSubSumF32);
HWY_EXPORT(ExpSubSumF64);
HWY_EXPORT(ExpSubAccumulateF32);
HWY_EXPORT(ExpSubAccumulateF64);
HWY_EXPORT(AdamWF32);
HWY_EXPORT(GeluBackwardF32);
HWY_EXPORT(NormBackwardRowF32);
HWY_EXPORT(NormWeightBackwardRowF32);

void norm_backward_row(const float* x, const float* g, const float* w, float* out, std::int64_t n, float eps,
                       bool rms) {
  HWY_DYNAMIC_DISPATCH(NormBackwardRowF32)(x, g, w, out, n, eps, rms);
}
void norm_weight_backward_row(const float* x, const float* g, float* wg, std::int64_t n, float eps, bool rms) {
  HWY_DYNAMIC_DISPATCH(NormWeightBackwardRowF32)(x, g, wg, n, eps, rms);
}

void gelu_backward(const float* x, const float* g, float* y, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(GeluBackwardF32)(x, g, y, n);
}
HWY_EXPORT(AdamWF64);

void adamw(const AdamWConstants<float>& k, float* p, const float* g, float* m, float* v, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(AdamWF32)(k, p, g, m, v, n);
}
void adamw(const AdamWConstants<double>& k, double* p, const double* g, double* m, double* v, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(AdamWF64)(k, p, g, m, v, n);
}

void apply(Fn fn, const float* x, float* y, std::int64_t n) { HWY_DYNAMIC_DISPATCH(ApplyF32)(fn, x, y, n); }
void apply(Fn fn, const double* x, double* y, std::int64_t n) {
  if (fn == Fn::Gelu) {
    // The exact (erf) form, PyTorch's approximate='none', as the scalar
    // fallback has it: Highway has no f64 erf to vectorise it with.
    for (std::int64_t i = 0; i < n; ++i) y[i] = 0.5 * x[i] * (1.0 + std::erf(x[i] * M_SQRT1_2));
    return;
  }
  HWY_DYNAMIC_DISPATCH(ApplyF64)(fn, x, y, n);
}
void binary(BinFn fn, const float* a, const float* b, float* y, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(BinaryF32)(fn, a, b, y, n);
}
void binary(BinFn fn, const double* a, const double* b, double* y, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(BinaryF64)(fn, a, b, y, n);
}
float exp_sub_sum(const float* x, float m, float* y, std::int64_t n) {
  return HWY_DYNAMIC_DISPATCH(ExpSubSumF32)(x, m, y, n);
}
double exp_sub_sum(const double* x, double m, double* y, std::int64_t n) {
  return HWY_DYNAMIC_DISPATCH(ExpSubSumF64)(x, m, y, n);
}
void exp_sub_accumulate(const float* x, const float* m, float* y, float* s, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(ExpSubAccumulateF32)(x, m, y, s, n);
}
void exp_sub_accumulate(const double* x, const double* m, double* y, double* s, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(ExpSubAccumulateF64)(x, m, y, s, n);
}

const char* target_name() {
  // The best target is the lowest bit set of those compiled in and supported.
  const std::int64_t targets = hwy::SupportedTargets() & HWY_TARGETS;
  return hwy::TargetName(targets & -targets);
}

void for_each_target(const std::function<void()>& fn) {
  for (const std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace dtensor::cpu::vmath
#endif  // HWY_ONCE
