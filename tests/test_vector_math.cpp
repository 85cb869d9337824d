// The CPU's vectorised elementwise math (ops/include/dtensor/ops/detail/vector_math.h) against the
// std:: functions in higher precision (double for f32, long double for f64):
// seeded random inputs across each function's range plus edge values (+-0,
// +-inf, NaN, the largest and smallest normals, subnormals, and the
// saturation and overflow ends), with a bound in ULP per function and dtype.
// Then the ops themselves through call_op, f32, f64 and bf16. bf16/f16
// pointwise ops bit for bit against widening whole tensors, and moves of
// bf16/f16 keeping their bits: test_vector_math_half.cpp (the same suite).
//
// ULP here: |y - ref| / the spacing of T at |ref| (at least the smallest
// subnormal, so subnormal results count in units of it). A NaN reference
// needs a NaN, an infinite one the same infinity, a zero one a zero of the
// same sign: the std:: formula's own NaN/inf/zero semantics.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <dtensor/dtensor.h>
#include <fmt/format.h>

#include "dtensor/ops/detail/vector_math.h"

namespace {

using dtensor::cpu::vmath::Fn;
using Wide = long double;

struct FnCase {
  Fn fn;
  const char* name;
  // Max ULP, f32 and f64; a negative f64 bound: no f64 vector kernel.
  double max_ulp_f32;
  double max_ulp_f64;
  // Half-width of the dense uniform range where the function varies.
  double range;
};

// The documented bounds (vector_math.h points here), each a little above
// the worst measured on any target: exp: Highway's polynomial (1 ULP) with
// the reduction's rounding; log: Highway's documented 4 ULP (f64, f32
// subnormals; f32 normals: Cephes' polynomial, 0.89 ULP on the dense sweep
// below; f64 tanh: 4 ULP too); f32 tanh: its fitted polynomial below 0.625,
// 1 - 2/(e^2x + 1) above (1.34 ULP on the dense sweep below); sigmoid and silu: exp's error scaled by the derivative
// plus the reciprocal (f32: an approximate one and a Newton step; targets without FMA, SSE4 and below, round more:
// silu 3.0 ULP measured); gelu (f32): the erfc approximation's relative 1.2e-7 (2 ULP) plus the rounding of Q(t), 2 -
// erfc and the products (5.5 ULP measured on random samples; 6.9 on a sweep of every 41st float of |x| < 20, all
// targets); sqrt: correctly rounded; rsqrt: 1/sqrt(x) rounds twice.
const FnCase kCases[] = {
    {Fn::Exp, "exp", 2, 2, 110},         {Fn::Log, "log", 4, 4, 4},       {Fn::Tanh, "tanh", 2, 4, 20},
    {Fn::Sigmoid, "sigmoid", 3, 3, 120}, {Fn::Silu, "silu", 3.5, 3, 120}, {Fn::Gelu, "gelu", 7, -1, 20},
    {Fn::Relu, "relu", 0, 0, 4},         {Fn::Sqrt, "sqrt", 0.5, 0.5, 4}, {Fn::Rsqrt, "rsqrt", 1.5, 1.5, 4},
};

// exp(-x) as the formula in T sees it: +inf once it overflows T (so that
// sigmoid and silu give +-0 there, not the subnormal of the exact value).
template <class T>
Wide exp_neg(Wide x) {
  const Wide e = std::exp(-x);
  return e > std::numeric_limits<T>::max() ? std::numeric_limits<Wide>::infinity() : e;
}

template <class T>
Wide reference(Fn fn, Wide x) {
  switch (fn) {
    case Fn::Exp: return std::exp(x);
    case Fn::Log: return std::log(x);
    case Fn::Tanh: return std::tanh(x);
    case Fn::Sigmoid: return 1 / (1 + exp_neg<T>(x));
    case Fn::Silu: return x / (1 + exp_neg<T>(x));
    // x/2 * (1 + erf(x/sqrt2)) written with erfc, which is the same number
    // without the cancellation of 1 + erf for x << 0 (the reference must be
    // exact where the kernel is; -inf * 0 is still NaN at x = -inf).
    case Fn::Gelu: return x / 2 * std::erfc(-x / std::sqrt(Wide(2)));
    case Fn::Sqrt: return std::sqrt(x);
    case Fn::Rsqrt: return 1 / std::sqrt(x);
    case Fn::Relu: return x < 0 ? Wide(0) : x;  // the old kernel's max(x, 0): NaN and -0 stay
  }
  return x;
}

template <class T>
Wide ulp_at(Wide ref) {
  const T r = static_cast<T>(ref);
  const T a = std::fabs(r);
  if (!std::isfinite(a)) return std::numeric_limits<T>::max();  // ref rounds to inf: count against max's spacing
  const T up = std::nextafter(a, std::numeric_limits<T>::infinity());
  return std::max<Wide>(static_cast<Wide>(up) - static_cast<Wide>(a), std::numeric_limits<T>::denorm_min());
}

// The error of y against ref in ULP, or infinity where the special-value
// semantics differ.
template <class T>
double ulp_error(T y, Wide ref) {
  constexpr double bad = std::numeric_limits<double>::infinity();
  if (std::isnan(ref)) return std::isnan(y) ? 0 : bad;
  if (std::isnan(y)) return bad;
  const Wide rounded = static_cast<T>(ref);
  if (std::isinf(rounded) && std::isinf(ref)) return y == rounded ? 0 : bad;
  if (ref == 0) return y == 0 && std::signbit(y) == std::signbit(ref) ? 0 : bad;
  if (std::isinf(y)) return std::isinf(rounded) && y == rounded ? 0 : bad;
  return static_cast<double>(std::fabs(static_cast<Wide>(y) - ref) / ulp_at<T>(ref));
}

// The largest ulp_error of y against ref over a sweep, and the input x it
// was at (infinity, a special-value mismatch, wins).
std::pair<double, float> worst_ulp(const std::vector<float>& x, const std::vector<float>& y,
                                   const std::vector<Wide>& ref) {
  double worst = 0;
  float worst_x = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double e = ulp_error<float>(y[i], ref[i]);
    if (!(e <= worst)) worst = e, worst_x = x[i];
  }
  return {worst, worst_x};
}

template <class T>
std::vector<T> edge_values() {
  using L = std::numeric_limits<T>;
  std::vector<T> v{T(0),
                   -T(0),
                   L::infinity(),
                   -L::infinity(),
                   L::quiet_NaN(),
                   -L::quiet_NaN(),
                   L::max(),
                   -L::max(),
                   L::min(),
                   -L::min(),
                   L::denorm_min(),
                   -L::denorm_min(),
                   T(1),
                   T(-1),
                   T(0.5),
                   T(-0.5),
                   T(2),
                   T(1e-30),
                   T(-1e-30),
                   T(88.72),
                   T(88.7228),
                   T(88.73),
                   T(89),
                   T(-87.33),
                   T(-87.4),
                   T(-103.9),
                   T(-104),
                   T(-105),
                   T(9),
                   T(-9),
                   T(18.7),
                   T(-18.7),
                   T(19),
                   T(-19),
                   T(104),
                   T(-104),
                   T(1.41),
                   T(-1.41),
                   T(1.4143),
                   T(-1.4143),
                   T(13),
                   T(-13),
                   T(14),
                   T(-14),
                   T(-13.19),  // f32 gelu's exponent crosses -87 (ExpCore's end)
                   T(-13.2),
                   T(-13.21),
                   T(0.625),  // f32 tanh's polynomial ends
                   T(-0.625),
                   T(std::nextafter(T(0.625), T(0))),
                   T(std::nextafter(T(1), T(2))),
                   T(std::nextafter(T(1), T(0)))};
  if constexpr (sizeof(T) == 8) {
    for (T x : {705.0, 706.0, 708.0, 709.0, 709.78, 709.79, 710.0, -708.0, -709.0, -744.0, -745.1, -746.0, -1000.0,
                -1001.0, 37.0, -37.0})
      v.push_back(x);
  }
  return v;
}

// Random inputs: log-uniform magnitudes over the whole finite range
// (subnormals to max) with either sign, dense uniform ones on [-range,
// range], and positive log-uniform ones for the functions of x > 0.
template <class T>
std::vector<T> random_values(std::mt19937_64& rng, double range, int count) {
  using L = std::numeric_limits<T>;
  const double lo = std::log10(static_cast<double>(L::denorm_min()));
  const double hi = std::log10(static_cast<double>(L::max()));
  std::uniform_real_distribution<double> exponent(lo, hi), dense(-range, range);
  std::vector<T> v;
  for (int i = 0; i < count; ++i) {
    const double mag = std::pow(10.0, exponent(rng));
    v.push_back(static_cast<T>(i % 2 ? mag : -mag));
    v.push_back(static_cast<T>(dense(rng)));
    v.push_back(static_cast<T>(std::pow(10.0, exponent(rng))));
  }
  return v;
}

template <class T>
void check_function(const FnCase& c, std::uint64_t seed) {
  const double bound = sizeof(T) == 4 ? c.max_ulp_f32 : c.max_ulp_f64;
  if (bound < 0) return;
  std::mt19937_64 rng(seed);
  std::vector<T> x = edge_values<T>();
  const std::vector<T> r = random_values<T>(rng, c.range, 20000);
  x.insert(x.end(), r.begin(), r.end());
  x.push_back(T(0.25));  // an odd length: the tail path runs too
  std::vector<T> y(x.size());
  dtensor::cpu::vmath::apply(c.fn, x.data(), y.data(), static_cast<std::int64_t>(x.size()));
  double worst = 0;
  T worst_x = 0;
  int failures = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const Wide ref = reference<T>(c.fn, static_cast<Wide>(x[i]));
    const double e = ulp_error<T>(y[i], ref);
    if (e > worst) {
      worst = e;
      worst_x = x[i];
    }
    if (!(e <= bound) && ++failures <= 5)
      BOOST_ERROR(fmt::format("seed {} {} {}: x = {:.9g} gives {:.9g}, reference {:.12Lg}: {} ULP, bound {}", seed,
                              c.name, dtensor::dtype_of<T>(), x[i], y[i], ref, e, bound));
  }
  // Sorted, neighbours are alike (whole vectors of positive normals, of
  // values in the fast ranges): every lane must still give what it gave
  // among unlike neighbours, bit for bit.
  std::vector<std::size_t> order(x.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t i, std::size_t j) {
    if (std::isnan(x[i]) || std::isnan(x[j])) return !std::isnan(x[i]) && std::isnan(x[j]);
    return x[i] < x[j];
  });
  std::vector<T> xs(x.size()), ys(x.size());
  for (std::size_t k = 0; k < order.size(); ++k) xs[k] = x[order[k]];
  dtensor::cpu::vmath::apply(c.fn, xs.data(), ys.data(), static_cast<std::int64_t>(xs.size()));
  int differ = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    const T a = ys[k], b = y[order[k]];
    if (!(std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b))) && ++differ <= 3)
      BOOST_ERROR(fmt::format("seed {} {} {}: x = {:.9g} gives {:.9g} sorted, {:.9g} unsorted", seed, c.name,
                              dtensor::dtype_of<T>(), xs[k], a, b));
  }
  BOOST_TEST(differ == 0, "seed " << seed << " " << c.name << ": " << differ << " lanes depend on their neighbours");
  BOOST_TEST_MESSAGE(fmt::format("{} {}: max {:.3g} ULP (at x = {:.9g}) over {} inputs, bound {} [{}]", c.name,
                                 dtensor::dtype_of<T>(), worst, worst_x, x.size(), bound,
                                 dtensor::cpu::vmath::target_name()));
  BOOST_TEST(failures == 0, "seed " << seed << " " << c.name << ": " << failures << " inputs over the bound");
}

constexpr std::uint64_t kSeed = 20261201;

void check_loops() {
  using dtensor::cpu::vmath::BinFn;
  std::mt19937_64 rng(kSeed);
  std::normal_distribution<float> normal;
  // The unary functions on outputs big enough to stream (and misaligned by
  // one element): the same values as on small pieces, which do not stream.
  {
    const std::int64_t n = (std::int64_t{4} << 20) / 4 + 5;
    std::vector<float> x(n + 1), big(n + 1), piece(n + 1);
    for (auto& v : x) v = 3 * normal(rng);
    for (const FnCase& c : kCases) {
      dtensor::cpu::vmath::apply(c.fn, x.data() + 1, big.data() + 1, n);
      for (std::int64_t i = 0; i < n; i += 1000)
        dtensor::cpu::vmath::apply(c.fn, x.data() + 1 + i, piece.data() + 1 + i, std::min<std::int64_t>(1000, n - i));
      int bad = 0;
      for (std::int64_t i = 1; i <= n; ++i)
        bad += !(big[i] == piece[i] || (std::isnan(big[i]) && std::isnan(piece[i])));
      BOOST_TEST(bad == 0, "seed " << kSeed << " target " << dtensor::cpu::vmath::target_name() << " " << c.name
                                   << " streamed: " << bad << " differ");
    }
  }
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{15}, std::int64_t{17}, std::int64_t{1000},
                         (std::int64_t{4} << 20) / 4 + 3}) {
    for (std::int64_t offset : {0, 1}) {
      std::vector<float> a(n + offset), b(n + offset), y(n + offset);
      for (auto& v : a) v = normal(rng);
      for (auto& v : b) v = normal(rng);
      for (BinFn fn : {BinFn::Add, BinFn::Sub, BinFn::Mul, BinFn::Div}) {
        dtensor::cpu::vmath::binary(fn, a.data() + offset, b.data() + offset, y.data() + offset, n);
        int bad = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          const float u = a[i + offset], v = b[i + offset];
          const float want = fn == BinFn::Add ? u + v : fn == BinFn::Sub ? u - v : fn == BinFn::Mul ? u * v : u / v;
          bad += y[i + offset] != want;
        }
        BOOST_TEST(bad == 0, "seed " << kSeed << " target " << dtensor::cpu::vmath::target_name() << " n " << n
                                     << " offset " << offset << " fn " << static_cast<int>(fn) << ": " << bad
                                     << " wrong");
      }
      if (n > 100000) continue;
      const float m = 0.5f;
      const float sum = dtensor::cpu::vmath::exp_sub_sum(a.data() + offset, m, y.data() + offset, n);
      double want_sum = 0;
      int bad = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double e = std::exp(static_cast<double>(a[i + offset] - m));  // the kernel's float subtraction
        want_sum += e;
        bad += ulp_error<float>(y[i + offset], e) > 2;
      }
      BOOST_TEST(bad == 0, "seed " << kSeed << " exp_sub_sum n " << n << ": " << bad << " wrong");
      BOOST_TEST(std::fabs(sum - want_sum) <= 1e-5 * (want_sum + 1), "seed " << kSeed << " n " << n);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(vector_math)

// On every SIMD target this CPU runs (SSSE3 ... AVX-512 and the scalar
// fallback), not only the one the dispatch picks here: other CPUs get those.
BOOST_AUTO_TEST_CASE(every_function_within_its_ulp_bound_f32) {
  dtensor::cpu::vmath::for_each_target([] {
    for (const FnCase& c : kCases) check_function<float>(c, kSeed + static_cast<std::uint64_t>(c.fn));
  });
}

BOOST_AUTO_TEST_CASE(every_function_within_its_ulp_bound_f64) {
  dtensor::cpu::vmath::for_each_target([] {
    for (const FnCase& c : kCases) check_function<double>(c, kSeed + 100 + static_cast<std::uint64_t>(c.fn));
  });
}

// f32 gelu's central path (|x| < 3.5, on the FMA targets AVX2 and AVX-512:
// a polynomial for log erfcx and one exp) over a dense sweep of its range,
// every 499th float of either sign, not only random samples: 5 ULP (4.4
// measured). The other targets and |x| >= 3.5 keep the erfc formula and the
// random-sample bound above.
BOOST_AUTO_TEST_CASE(gelu_f32_central_range_dense) {
  std::vector<float> x;
  for (std::uint32_t u = 0; u < 0x40600000u; u += 499) {  // 0x40600000: 3.5f
    float f;
    std::memcpy(&f, &u, sizeof f);
    x.push_back(f);
    x.push_back(-f);
  }
  std::vector<Wide> ref(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ref[i] = reference<float>(Fn::Gelu, x[i]);
  std::vector<float> y(x.size());
  dtensor::cpu::vmath::for_each_target([&] {
    const std::string target = dtensor::cpu::vmath::target_name();
    if (target != "AVX2" && target != "AVX3") return;
    dtensor::cpu::vmath::apply(Fn::Gelu, x.data(), y.data(), static_cast<std::int64_t>(x.size()));
    const auto [worst, worst_x] = worst_ulp(x, y, ref);
    BOOST_TEST_MESSAGE(fmt::format("gelu f32 central, {}: max {:.3g} ULP at x = {:.9g}", target, worst, worst_x));
    BOOST_TEST(worst <= 5.0, "no seed (dense sweep) target " << target << ": " << worst << " ULP at x = " << worst_x);
  });
}

// f32 gelu over a dense sweep of every range where it is not x or 0 (|x| <
// 20: every 1499th float of either sign, and every float near the worst
// spots found by a full sweep, x = -0.06 and the ExpCore end near -13.2),
// on every SIMD target, the erfc formula of |x| >= 3.5 and of the targets
// without FMA included: the random samples' bound, 7 ULP, everywhere.
BOOST_AUTO_TEST_CASE(gelu_f32_whole_range_dense_every_target) {
  std::vector<float> x;
  const auto add = [&](std::uint32_t from, std::uint32_t to, std::uint32_t stride) {
    for (std::uint32_t u = from; u < to; u += stride) {
      float f;
      std::memcpy(&f, &u, sizeof f);
      x.push_back(f);
      x.push_back(-f);
    }
  };
  add(0, 0x41A00000u, 1499);         // 0x41A00000: 20.0f
  add(0x3D6B851Fu, 0x3D851EB8u, 7);  // [0.0575, 0.065)
  add(0x41516666u, 0x41540000u, 3);  // [13.0875, 13.25)
  std::vector<Wide> ref(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ref[i] = reference<float>(Fn::Gelu, x[i]);
  std::vector<float> y(x.size());
  dtensor::cpu::vmath::for_each_target([&] {
    const std::string target = dtensor::cpu::vmath::target_name();
    dtensor::cpu::vmath::apply(Fn::Gelu, x.data(), y.data(), static_cast<std::int64_t>(x.size()));
    const auto [worst, worst_x] = worst_ulp(x, y, ref);
    BOOST_TEST_MESSAGE(fmt::format("gelu f32 dense, {}: max {:.3g} ULP at x = {:.9g} over {} inputs", target, worst,
                                   worst_x, x.size()));
    BOOST_TEST(worst <= 7.0, "no seed (dense sweep) target " << target << ": " << worst << " ULP at x = " << worst_x);
  });
}

// f32 log and tanh over dense sweeps, on every SIMD target: log over every
// 17th float of [0.5, 2) (its error depends on the mantissa; the exponent
// only adds e * ln 2) and every 997th positive normal; tanh over every
// 1021st float of either sign below 9.5 (where it is not +-1) and every 5th
// of [0.6, 0.7), around the switch from its polynomial to the exp formula
// at 0.625. The bounds sit a little above the worst measured on any target
// (log 0.89, tanh 1.34 ULP).
void check_dense(Fn fn, const char* name, const std::vector<float>& x, double bound) {
  std::vector<Wide> ref(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) ref[i] = reference<float>(fn, x[i]);
  std::vector<float> y(x.size());
  dtensor::cpu::vmath::for_each_target([&] {
    const std::string target = dtensor::cpu::vmath::target_name();
    dtensor::cpu::vmath::apply(fn, x.data(), y.data(), static_cast<std::int64_t>(x.size()));
    const auto [worst, worst_x] = worst_ulp(x, y, ref);
    BOOST_TEST_MESSAGE(fmt::format("{} f32 dense, {}: max {:.3g} ULP at x = {:.9g} over {} inputs", name, target, worst,
                                   worst_x, x.size()));
    BOOST_TEST(worst <= bound, "no seed (dense sweep) " << name << " target " << target << ": " << worst
                                                        << " ULP at x = " << worst_x << ", bound " << bound);
  });
}

std::vector<float> float_sweep(std::uint32_t from, std::uint32_t to, std::uint32_t stride, bool both_signs) {
  std::vector<float> x;
  for (std::uint32_t u = from; u < to; u += stride) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    x.push_back(f);
    if (both_signs) x.push_back(-f);
  }
  return x;
}

BOOST_AUTO_TEST_CASE(log_and_tanh_f32_dense_every_target) {
  std::vector<float> x = float_sweep(0x3F000000u, 0x40000000u, 17, false);  // [0.5, 2)
  const std::vector<float> normals = float_sweep(0x00800000u, 0x7F800000u, 997, false);
  x.insert(x.end(), normals.begin(), normals.end());
  check_dense(Fn::Log, "log", x, 1.0);
  x = float_sweep(0, 0x41180000u, 1021, true);                                     // |x| < 9.5
  const std::vector<float> knee = float_sweep(0x3F19999Au, 0x3F333333u, 5, true);  // [0.6, 0.7)
  x.insert(x.end(), knee.begin(), knee.end());
  check_dense(Fn::Tanh, "tanh", x, 1.5);
}

// The binary loops and softmax's pieces, on lengths around the vector width
// and the streaming threshold (4 MiB of output), offsets misaligned.
BOOST_AUTO_TEST_CASE(binary_and_softmax_loops_match_scalar) { dtensor::cpu::vmath::for_each_target(check_loops); }

// The ops through call_op on plain Tensors, each dtype the kernels see: the
// result against the reference at a tolerance for the dtype (bf16 computes
// in f32 and rounds to 8 bits).
BOOST_AUTO_TEST_CASE(ops_through_call_op) {
  using dtensor::DType;
  using dtensor::Tensor;
  const std::vector<std::pair<const char*, Fn>> ops{{"exp", Fn::Exp},         {"log", Fn::Log},    {"tanh", Fn::Tanh},
                                                    {"sigmoid", Fn::Sigmoid}, {"silu", Fn::Silu},  {"gelu", Fn::Gelu},
                                                    {"sqrt", Fn::Sqrt},       {"rsqrt", Fn::Rsqrt}};
  for (DType dtype : {DType::Float32, DType::Float64, DType::BFloat16}) {
    for (const auto& [name, fn] : ops) {
      const bool positive = fn == Fn::Log || fn == Fn::Sqrt || fn == Fn::Rsqrt;
      const std::uint64_t seed = kSeed + static_cast<std::uint64_t>(fn);
      Tensor x = positive ? Tensor::rand({7, 301}, dtype, seed) : Tensor::randn({7, 301}, dtype, seed);
      x = dtensor::call_op("mul_scalar", {x}, dtensor::ScalarAttrs{.value = positive ? 10.0 : 6.0});
      const Tensor y = dtensor::call_op(name, {x});
      BOOST_TEST((y.dtype() == dtype));
      const Tensor xd = x.to(DType::Float64), yd = y.to(DType::Float64);
      const double* xs = xd.data_as<double>();
      const double* ys = yd.data_as<double>();
      // f64 gelu keeps std::erf (1 + erf cancels for x << 0: absolute error).
      const double rel = dtype == DType::BFloat16 ? 1.0 / 128 : dtype == DType::Float32 ? 5e-7 : 2e-15;
      // Results below the dtype's (bf16: f32's) normals: a few units of its
      // subnormal spacing (the products round there).
      const double abs = dtype == DType::Float64 && fn == Fn::Gelu ? 1e-15
                         : dtype == DType::Float64                 ? 0
                         : dtype == DType::Float32                 ? 1.2e-44
                                                                   : 9.2e-41;
      int bad = 0;
      for (std::int64_t i = 0; i < x.numel(); ++i) {
        const double ref = static_cast<double>(reference<float>(fn, static_cast<Wide>(xs[i])));
        if (!(std::fabs(ys[i] - ref) <= rel * std::fabs(ref) + abs) && !(std::isnan(ref) && std::isnan(ys[i])) &&
            ++bad <= 3)
          BOOST_ERROR(
              fmt::format("seed {} {} {}: x = {} gives {}, reference {}", seed, name, dtype, xs[i], ys[i], ref));
      }
      BOOST_TEST(bad == 0, "seed " << seed << " " << name << " " << dtensor::dtype_name(dtype));
    }
  }
}

// softmax and log_softmax through call_op, along the last dim (the row
// kernel) and the first (the strided one), with a NaN row and a row of -inf.
BOOST_AUTO_TEST_CASE(softmax_through_call_op) {
  using dtensor::DType;
  using dtensor::Tensor;
  for (bool log : {false, true}) {
    for (std::int64_t dim : {-1, 0}) {
      const std::uint64_t seed = kSeed + 7;
      Tensor x = Tensor::randn({5, 37}, DType::Float32, seed);
      x = dtensor::call_op("mul_scalar", {x}, dtensor::ScalarAttrs{.value = 10.0});
      std::vector<float> v(x.data_as<float>(), x.data_as<float>() + x.numel());
      v[2 * 37 + 3] = std::numeric_limits<float>::quiet_NaN();
      for (int j = 0; j < 37; ++j) v[4 * 37 + j] = -std::numeric_limits<float>::infinity();
      x = Tensor::from_vector(v, {5, 37});
      const Tensor y = dtensor::call_op(log ? "log_softmax" : "softmax", {x}, dtensor::DimAttrs{.dim = dim});
      const float* ys = y.data_as<float>();
      const int rows = dim == -1 ? 5 : 37, n = dim == -1 ? 37 : 5;
      auto at = [&](int r, int k) { return dim == -1 ? r * 37 + k : k * 37 + r; };
      int bad = 0;
      for (int r = 0; r < rows; ++r) {
        double m = -INFINITY, s = 0;
        bool nan = false;
        for (int k = 0; k < n; ++k) {
          nan = nan || std::isnan(v[at(r, k)]);
          m = std::max(m, static_cast<double>(v[at(r, k)]));
        }
        for (int k = 0; k < n; ++k) s += std::exp(v[at(r, k)] - m);
        for (int k = 0; k < n; ++k) {
          const double e = v[at(r, k)] - m;
          const double ref = nan || std::isinf(m) ? NAN : log ? e - std::log(s) : std::exp(e) / s;
          const double got = ys[at(r, k)];
          // log_softmax's x - (m + log s) is exact only to the rounding of its
          // operands: the tolerance scales with them.
          const double scale = log ? std::fabs(v[at(r, k)]) + std::fabs(m) + 1 : std::fabs(ref);
          const bool ok =
              std::isnan(ref) ? std::isnan(got) : got == ref || std::fabs(got - ref) <= 2e-6 * scale + 1e-30;
          if (!ok && ++bad <= 3)
            BOOST_ERROR(fmt::format("seed {} {} dim {} row {} k {}: {} vs {}", seed, log ? "log_softmax" : "softmax",
                                    dim, r, k, got, ref));
        }
      }
      BOOST_TEST(bad == 0);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

// AdamW's vector loop against adamw_element in higher precision, on lengths
// that leave every tail size, and an element's result independent of where
// the array starts (a shard boundary): the same values updated as one array
// and as two halves give the same bits.
template <class T>
void check_adamw() {
  using dtensor::cpu::vmath::AdamWConstants;
  const unsigned seed = 20261204;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const AdamWConstants<T> k{T(0.9), T(0.95), T(1e-8), T(1 - 1e-3 * 0.1), T(1e-3 / (1 - 0.9 * 0.9)),
                            static_cast<T>(std::sqrt(1 - 0.95 * 0.95))};
  const AdamWConstants<Wide> wide{0.9L, 0.95L, 1e-8L, static_cast<Wide>(k.decay), static_cast<Wide>(k.step_size),
                                  static_cast<Wide>(k.bias2_sqrt)};
  const Wide tol = std::is_same_v<T, float> ? 1e-5L : 1e-13L;
  for (std::int64_t n = 1; n <= 70; ++n) {
    std::vector<T> p(n), g(n), m(n), v(n);
    for (std::int64_t i = 0; i < n; ++i) {
      p[i] = static_cast<T>(normal(rng)), g[i] = static_cast<T>(normal(rng) * 1e-2);
      m[i] = static_cast<T>(normal(rng) * 1e-3), v[i] = static_cast<T>(std::abs(normal(rng)) * 1e-5);
    }
    std::vector<T> p2 = p, m2 = m, v2 = v;
    std::vector<T> p1 = p, m1 = m, v1 = v;
    dtensor::cpu::vmath::adamw(k, p1.data(), g.data(), m1.data(), v1.data(), n);
    const std::int64_t half = n / 2;
    dtensor::cpu::vmath::adamw(k, p2.data(), g.data(), m2.data(), v2.data(), half);
    dtensor::cpu::vmath::adamw(k, p2.data() + half, g.data() + half, m2.data() + half, v2.data() + half, n - half);
    for (std::int64_t i = 0; i < n; ++i) {
      Wide pw = p[i], mw = m[i], vw = v[i];
      dtensor::cpu::vmath::adamw_element(wide, static_cast<Wide>(g[i]), mw, vw, pw);
      const Wide err = std::max({std::abs(p1[i] - pw), std::abs(m1[i] - mw) / 1e-3L, std::abs(v1[i] - vw) / 1e-5L});
      BOOST_TEST((err <= tol), "seed " << seed << " n " << n << " i " << i << " target "
                                       << dtensor::cpu::vmath::target_name() << ": error " << static_cast<double>(err));
      BOOST_TEST((std::memcmp(&p1[i], &p2[i], sizeof(T)) == 0 && std::memcmp(&m1[i], &m2[i], sizeof(T)) == 0 &&
                  std::memcmp(&v1[i], &v2[i], sizeof(T)) == 0),
                 "seed " << seed << " n " << n << " i " << i << ": split at " << half << " changed the bits");
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(adamw_loop_matches_the_formula_and_ignores_shard_boundaries) {
  dtensor::cpu::vmath::for_each_target([] {
    check_adamw<float>();
    check_adamw<double>();
  });
}

// gelu's backward in one vectorised pass against g * (Phi(x) + x phi(x)) in
// long double, on every target: dense over the range where gelu' varies,
// the tails, and the edge values (0: 1/2; NaN in, NaN out).
BOOST_AUTO_TEST_CASE(gelu_backward_f32_matches_the_derivative_every_target) {
  const unsigned seed = 20261204;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> wide(-12.0, 12.0), grad(-2.0, 2.0);
  std::vector<float> x{0.0f, -0.0f, 1e-30f, -1e-30f, 3.5f, -3.5f, 1.5f, -1.5f, 8.0f, -8.0f, 20.0f, -20.0f};
  for (int i = 0; i < 20000; ++i) x.push_back(static_cast<float>(wide(rng)));
  for (int i = -4000; i <= 4000; ++i) x.push_back(static_cast<float>(i) / 1000.0f);
  std::vector<float> g(x.size());
  for (auto& v : g) v = static_cast<float>(grad(rng));
  dtensor::cpu::vmath::for_each_target([&] {
    std::vector<float> y(x.size());
    dtensor::cpu::vmath::gelu_backward(x.data(), g.data(), y.data(), static_cast<std::int64_t>(x.size()));
    int bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const Wide xi = x[i];
      const Wide cdf = 0.5L * (1 + std::erf(xi / std::sqrt(2.0L)));
      const Wide pdf = std::exp(-0.5L * xi * xi) / std::sqrt(2 * 3.14159265358979323846264338327950288L);
      const Wide want = static_cast<Wide>(g[i]) * (cdf + xi * pdf);
      // A few f32 ulps of |g| (gelu' is at most 1.13 in magnitude).
      const Wide tol = 8 * static_cast<Wide>(std::numeric_limits<float>::epsilon()) * std::abs(static_cast<Wide>(g[i]));
      if (!(std::abs(static_cast<Wide>(y[i]) - want) <= tol) && ++bad <= 3)
        BOOST_ERROR("seed " << seed << " target " << dtensor::cpu::vmath::target_name() << " x " << x[i] << " g "
                            << g[i] << ": " << y[i] << ", expected " << static_cast<double>(want));
    }
    BOOST_TEST(bad == 0, "seed " << seed << " target " << dtensor::cpu::vmath::target_name() << ": " << bad << " bad");
    const float nan = std::numeric_limits<float>::quiet_NaN(), one = 1.0f;
    float out = 0;
    dtensor::cpu::vmath::gelu_backward(&nan, &one, &out, 1);
    BOOST_TEST(std::isnan(out));
  });
}

// Layer norm's (and rms norm's) backward rows in vector lanes against the
// formula in long double, on every target, lengths 1-100 (every tail), with
// and without a weight; the weight gradient's row term added onto what is
// there.
BOOST_AUTO_TEST_CASE(norm_backward_rows_match_the_formula_every_target) {
  const unsigned seed = 20261204;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const float eps = 1e-5f;
  dtensor::cpu::vmath::for_each_target([&] {
    for (int rms = 0; rms < 2; ++rms)
      for (std::int64_t n = 1; n <= 100; ++n) {
        std::vector<float> x(n), g(n), w(n), out(n), wg(n);
        for (std::int64_t i = 0; i < n; ++i) {
          x[i] = static_cast<float>(2 + normal(rng)), g[i] = static_cast<float>(normal(rng));
          w[i] = static_cast<float>(1 + 0.1 * normal(rng)), wg[i] = static_cast<float>(normal(rng));
        }
        const std::vector<float> wg0 = wg;
        const bool weighted = n % 2 == 0;
        dtensor::cpu::vmath::norm_backward_row(x.data(), g.data(), weighted ? w.data() : nullptr, out.data(), n, eps,
                                               rms);
        dtensor::cpu::vmath::norm_weight_backward_row(x.data(), g.data(), wg.data(), n, eps, rms);
        Wide mean = 0, var = 0, sum_g = 0, sum_gx = 0;
        if (!rms) {
          for (float v : x) mean += v;
          mean /= n;
        }
        for (float v : x) var += (v - mean) * (v - mean);
        const Wide rstd = 1 / std::sqrt(var / n + eps);
        auto gw = [&](std::int64_t i) { return weighted ? static_cast<Wide>(g[i]) * w[i] : static_cast<Wide>(g[i]); };
        for (std::int64_t i = 0; i < n; ++i) sum_g += gw(i), sum_gx += gw(i) * (x[i] - mean) * rstd;
        const Wide mean_g = rms ? 0 : sum_g / n, mean_gx = sum_gx / n;
        for (std::int64_t i = 0; i < n; ++i) {
          const Wide xhat = (x[i] - mean) * rstd;
          const Wide want = rstd * (gw(i) - mean_g - xhat * mean_gx), want_wg = wg0[i] + g[i] * xhat;
          BOOST_TEST((std::abs(out[i] - want) <= 1e-4L * (1 + std::abs(want)) &&
                      std::abs(wg[i] - want_wg) <= 1e-5L * (1 + std::abs(want_wg))),
                     "seed " << seed << " target " << dtensor::cpu::vmath::target_name() << " rms " << rms << " n "
                             << n << " i " << i << ": " << out[i] << " vs " << static_cast<double>(want) << ", "
                             << wg[i] << " vs " << static_cast<double>(want_wg));
        }
      }
  });
}
