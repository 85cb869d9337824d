// The CPU's vectorised elementwise math (ops/include/dtensor/ops/detail/vector_math.h)
// on bf16 and f16 (ops/src/cpu/vector_math_half.cpp): pointwise ops, which
// convert in blocks, bit for bit against widening whole tensors to f32,
// computing and rounding once; bf16 gelu's table against computing; and
// moves of bf16/f16 keeping their bits. The f32/f64 accuracy checks are in
// test_vector_math.cpp (the same suite, vector_math).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <dtensor/dtensor.h>

#include "dtensor/ops/detail/vector_math.h"

namespace {

using dtensor::cpu::vmath::Fn;

constexpr std::uint64_t kSeed = 20261201;  // test_vector_math.cpp's

// A bf16/f16 tensor of random 16-bit patterns (NaNs, infinities, zeros and
// subnormals among them), or of every pattern once when n = 65536.
dtensor::Tensor half_bits(dtensor::DType dtype, std::int64_t n, std::uint64_t seed) {
  dtensor::Tensor t = dtensor::Tensor::empty({n}, dtype);
  auto* bits = reinterpret_cast<std::uint16_t*>(t.data());
  std::mt19937_64 rng(seed);
  for (std::int64_t i = 0; i < n; ++i)
    bits[i] = n == 65536 ? static_cast<std::uint16_t>(i) : static_cast<std::uint16_t>(rng());
  return t;
}

// The index of the first element whose bits differ, or -1.
std::int64_t first_difference(const dtensor::Tensor& a, const dtensor::Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return 0;
  const auto* p = reinterpret_cast<const std::uint16_t*>(a.data());
  const auto* q = reinterpret_cast<const std::uint16_t*>(b.data());
  for (std::int64_t i = 0; i < a.numel(); ++i)
    if (p[i] != q[i]) return i;
  return -1;
}

// What dispatch computed before bf16/f16 ran through the kernels as they
// are: widen every input to f32, run the f32 kernel, round the result once.
dtensor::Tensor widened(const char* op, std::vector<dtensor::Tensor> inputs, const dtensor::OpAttrs& attrs,
                        dtensor::DType dtype) {
  for (auto& t : inputs) t = t.to(dtensor::DType::Float32);
  return dtensor::call_op(op, std::span<const dtensor::Tensor>(inputs), attrs).to(dtype);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(vector_math)

// The unary and binary kernels take bf16 and f16 as they are, converting in
// blocks: the same bits as widening whole tensors, for every 16-bit input
// (unary) and random pairs (binary, same shapes and broadcast), on every
// SIMD target.
BOOST_AUTO_TEST_CASE(half_pointwise_matches_widen_compute_round) {
  using dtensor::DType;
  using dtensor::Tensor;
  const std::vector<const char*> unary{"neg",   "abs",        "exp",        "log",        "sqrt",
                                       "rsqrt", "tanh",       "sigmoid",    "relu",       "gelu",
                                       "silu",  "add_scalar", "mul_scalar", "div_scalar", "pow_scalar"};
  const std::vector<const char*> binary{"add", "sub", "mul", "div", "pow", "maximum", "minimum",
                                        "eq",  "ne",  "lt",  "le",  "gt",  "ge"};
  dtensor::cpu::vmath::for_each_target([&] {
    for (DType dtype : {DType::BFloat16, DType::Float16}) {
      const Tensor all = half_bits(dtype, 65536, kSeed);
      for (const char* op : unary) {
        const std::string name = op;
        const bool scalar = name.ends_with("_scalar");
        const dtensor::OpAttrs attrs =
            scalar ? dtensor::OpAttrs(dtensor::ScalarAttrs{.value = 1.7}) : dtensor::OpAttrs();
        const std::int64_t at = first_difference(dtensor::call_op(op, {all}, attrs), widened(op, {all}, attrs, dtype));
        BOOST_TEST(at == -1, "seed " << kSeed << " target " << dtensor::cpu::vmath::target_name() << " " << op << " "
                                     << dtensor::dtype_name(dtype) << ": first difference at input bits " << at);
      }
      const Tensor a = half_bits(dtype, 3 * 1024 + 5, kSeed + 1), b = half_bits(dtype, 3 * 1024 + 5, kSeed + 2);
      const Tensor rows = half_bits(dtype, 7 * 301, kSeed + 3).view({7, 301}), row = half_bits(dtype, 301, kSeed + 4);
      for (const char* op : binary) {
        const std::int64_t at = first_difference(dtensor::call_op(op, {a, b}), widened(op, {a, b}, {}, dtype));
        const std::int64_t at_bc =
            first_difference(dtensor::call_op(op, {rows, row}), widened(op, {rows, row}, {}, dtype));
        BOOST_TEST((at == -1 && at_bc == -1), "seed " << kSeed << " target " << dtensor::cpu::vmath::target_name()
                                                      << " " << op << " " << dtensor::dtype_name(dtype)
                                                      << ": first difference at " << at << " (broadcast " << at_bc
                                                      << ")");
      }
    }
  });
}

// bf16 gelu computes short arrays and gathers long ones from a table of all
// 65536 results: the same bits either way, on every SIMD target.
BOOST_AUTO_TEST_CASE(bf16_gelu_short_arrays_match_long_ones) {
  dtensor::cpu::vmath::for_each_target([] {
    std::vector<std::uint16_t> x(65536 + 7), whole(x.size()), pieces(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::uint16_t>(i * 40503u);  // every pattern
    const auto n = static_cast<std::int64_t>(x.size());
    dtensor::cpu::vmath::apply_bf16(Fn::Gelu, x.data(), whole.data(), n);
    for (std::int64_t i = 0; i < n; i += 1000)
      dtensor::cpu::vmath::apply_bf16(Fn::Gelu, x.data() + i, pieces.data() + i, std::min<std::int64_t>(1000, n - i));
    std::int64_t differ = 0, first = -1;
    for (std::int64_t i = 0; i < n; ++i)
      if (whole[i] != pieces[i] && differ++ == 0) first = i;
    BOOST_TEST(differ == 0, "seed none (all patterns) target " << dtensor::cpu::vmath::target_name() << ": " << differ
                                                               << " differ, first at input bits "
                                                               << (first < 0 ? -1 : x[first]));
  });
}

// Ops that only move elements keep bf16/f16 bits as they are.
BOOST_AUTO_TEST_CASE(half_moves_keep_bits) {
  using dtensor::DType;
  using dtensor::Tensor;
  for (DType dtype : {DType::BFloat16, DType::Float16}) {
    const Tensor x = half_bits(dtype, 64 * 48, kSeed + 5).view({64, 48});
    const Tensor t = dtensor::call_op("transpose", {x}, dtensor::TransposeAttrs{.dim0 = 0, .dim1 = 1});
    const Tensor back = dtensor::call_op("transpose", {t}, dtensor::TransposeAttrs{.dim0 = 0, .dim1 = 1});
    BOOST_TEST(first_difference(back, x) == -1, "seed " << kSeed << " transpose " << dtensor::dtype_name(dtype));
    const auto* xb = reinterpret_cast<const std::uint16_t*>(x.data());
    const auto* tb = reinterpret_cast<const std::uint16_t*>(t.data());
    int bad = 0;
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 48; ++j) bad += tb[j * 64 + i] != xb[i * 48 + j];
    BOOST_TEST(bad == 0,
               "seed " << kSeed << " transpose " << dtensor::dtype_name(dtype) << ": " << bad << " moved wrong");
    const Tensor c = dtensor::call_op("cat", {x, x}, dtensor::DimAttrs{.dim = 0});
    const Tensor n = dtensor::call_op("narrow", {c}, dtensor::NarrowAttrs{.dim = 0, .start = 64, .length = 64});
    BOOST_TEST(first_difference(n, x) == -1, "seed " << kSeed << " cat/narrow " << dtensor::dtype_name(dtype));
  }
}

BOOST_AUTO_TEST_SUITE_END()
