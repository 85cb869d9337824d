// The CPU GEMM backend (ops/include/dtensor/ops/detail/gemm.h) on its own: results against a naive
// product over seeded random shapes (transpositions, leading dimensions
// wider than the rows, m, n, k of 0 and 1, sizes past one block), and the
// kernel set it chose against the CPU's features.
#include <boost/test/unit_test.hpp>

#include <cctype>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dtensor/ops/detail/gemm.h"

using namespace dtensor;

namespace {

struct Case {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  std::string describe() const {
    std::ostringstream s;
    s << "m=" << m << " n=" << n << " k=" << k << " trans_a=" << trans_a << " trans_b=" << trans_b << " lda=" << lda
      << " ldb=" << ldb << " ldc=" << ldc;
    return s.str();
  }
};

std::int64_t draw_dim(std::mt19937& rng) {
  // Mostly small, with the edges (0, 1) and now and then past a block of
  // the kernels (their panels are a few hundred wide).
  const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
  if (kind == 0) return 0;
  if (kind == 1) return 1;
  if (kind == 2) return std::uniform_int_distribution<std::int64_t>(100, 400)(rng);
  return std::uniform_int_distribution<std::int64_t>(2, 40)(rng);
}

Case draw_case(std::mt19937& rng) {
  Case c;
  c.trans_a = rng() % 2 != 0;
  c.trans_b = rng() % 2 != 0;
  c.m = draw_dim(rng);
  c.n = draw_dim(rng);
  c.k = draw_dim(rng);
  auto pad = [&] { return std::uniform_int_distribution<std::int64_t>(0, 1)(rng) * (1 + rng() % 5); };
  // Leading dimension: the stored row's width (at least 1), plus padding.
  c.lda = std::max<std::int64_t>(1, c.trans_a ? c.m : c.k) + pad();
  c.ldb = std::max<std::int64_t>(1, c.trans_b ? c.k : c.n) + pad();
  c.ldc = std::max<std::int64_t>(1, c.n) + pad();
  return c;
}

template <class T>
DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::Float32;
  if constexpr (std::is_same_v<T, double>) return DType::Float64;
  return DType::Int64;
}

const char* short_name(DType d) { return d == DType::Float32 ? "f32" : d == DType::Float64 ? "f64" : "i64"; }

/// Runs one case (with `accumulate`, C += op(A) op(B) onto random C);
/// returns what is wrong, or an empty string.
template <class T>
std::string check_case(const Case& c, std::mt19937& rng, bool accumulate = false) {
  const std::int64_t a_rows = c.trans_a ? c.k : c.m, b_rows = c.trans_b ? c.n : c.k;
  std::vector<T> a(static_cast<std::size_t>(a_rows * c.lda)), b(static_cast<std::size_t>(b_rows * c.ldb));
  std::uniform_int_distribution<int> small(-4, 4);
  std::uniform_real_distribution<double> unit(-1, 1);
  for (auto& x : a) x = std::is_integral_v<T> ? T(small(rng)) : T(unit(rng));
  for (auto& x : b) x = std::is_integral_v<T> ? T(small(rng)) : T(unit(rng));
  // C starts as NaN (or a sentinel): every element of the product must be
  // overwritten, and the padding past n in each row left alone.
  const T sentinel = std::is_integral_v<T> ? T(7777) : std::numeric_limits<T>::quiet_NaN();
  std::vector<T> out(static_cast<std::size_t>(std::max<std::int64_t>(c.m, 1) * c.ldc), sentinel);
  if (accumulate)
    for (std::int64_t i = 0; i < c.m; ++i)
      for (std::int64_t j = 0; j < c.n; ++j) out[i * c.ldc + j] = std::is_integral_v<T> ? T(small(rng)) : T(unit(rng));
  const std::vector<T> before = out;
  cpu::gemm(dtype_of<T>(), c.trans_a, c.trans_b, c.m, c.n, c.k, a.data(), c.lda, b.data(), c.ldb, out.data(), c.ldc,
            accumulate);
  auto at_a = [&](std::int64_t i, std::int64_t p) { return c.trans_a ? a[p * c.lda + i] : a[i * c.lda + p]; };
  auto at_b = [&](std::int64_t p, std::int64_t j) { return c.trans_b ? b[j * c.ldb + p] : b[p * c.ldb + j]; };
  // f32 sums of k products of |x| <= 1 differ from the double sum by a few
  // ulps of k; f64 by far less; int64 not at all.
  const double tol = std::is_same_v<T, float>    ? 1e-5 * static_cast<double>(c.k + 1)
                     : std::is_same_v<T, double> ? 1e-12 * static_cast<double>(c.k + 1)
                                                 : 0.0;
  for (std::int64_t i = 0; i < c.m; ++i)
    for (std::int64_t j = 0; j < c.ldc; ++j) {
      const double got = static_cast<double>(out[i * c.ldc + j]);
      if (j >= c.n) {
        const bool untouched = std::is_integral_v<T> ? got == 7777.0 : std::isnan(got);
        if (!untouched) return "padding C[" + std::to_string(i) + "," + std::to_string(j) + "] was written";
        continue;
      }
      double want = accumulate ? static_cast<double>(before[i * c.ldc + j]) : 0;
      for (std::int64_t p = 0; p < c.k; ++p) want += static_cast<double>(at_a(i, p)) * static_cast<double>(at_b(p, j));
      if (!(std::abs(got - want) <= tol))
        return "C[" + std::to_string(i) + "," + std::to_string(j) + "] = " + std::to_string(got) + ", expected " +
               std::to_string(want);
    }
  return "";
}

template <class T>
void check_random_cases(unsigned seed, int cases, bool accumulate = false) {
  std::mt19937 rng(seed);
  for (int i = 0; i < cases; ++i) {
    const Case c = draw_case(rng);
    const std::string problem = check_case<T>(c, rng, accumulate);
    BOOST_TEST(problem.empty(), "dtype " << short_name(dtype_of<T>()) << " seed " << seed << " case " << i << " ("
                                         << c.describe() << (accumulate ? ", accumulating" : "") << "): " << problem);
  }
}

// Whether this run sends large f32 products to oneDNN (libdnnl.so.2 there).
boost::test_tools::assertion_result onednn_there(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(cpu::gemm_uses_onednn(DType::Float32, 1024, 1024, 1024));
  r.message() << "no oneDNN in this run: " << cpu::gemm_backend();
  return r;
}

bool has_avx512_for_skx() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(cpu_gemm)

BOOST_AUTO_TEST_CASE(matches_a_naive_product_f32) { check_random_cases<float>(11, 300); }
BOOST_AUTO_TEST_CASE(matches_a_naive_product_f64) { check_random_cases<double>(12, 300); }
BOOST_AUTO_TEST_CASE(matches_a_naive_product_i64) { check_random_cases<std::int64_t>(13, 150); }
// C += op(A) op(B) (beta = 1: how linear_bias folds its bias into the GEMM),
// k = 0 included, where C must stay as it was.
BOOST_AUTO_TEST_CASE(accumulates_onto_c_f32) { check_random_cases<float>(14, 200, true); }
BOOST_AUTO_TEST_CASE(accumulates_onto_c_f64) { check_random_cases<double>(15, 200, true); }
BOOST_AUTO_TEST_CASE(accumulates_onto_c_i64) { check_random_cases<std::int64_t>(16, 100, true); }

// f32 products from 2^20 multiply-adds go to oneDNN: the same checks
// (transpositions, padded leading dimensions, accumulation, NaN-filled C)
// on shapes that reach it, each asserted to take that path; the small
// products and every f64 one stay with OpenBLAS.
BOOST_AUTO_TEST_CASE(large_f32_products_on_onednn, *boost::unit_test::precondition(onednn_there)) {
  std::mt19937 rng(17);
  BOOST_TEST(!cpu::gemm_uses_onednn(DType::Float32, 64, 64, 64));
  BOOST_TEST(!cpu::gemm_uses_onednn(DType::Float64, 1024, 1024, 1024));
  for (int i = 0; i < 24; ++i) {
    Case c;
    do {
      c.m = std::uniform_int_distribution<std::int64_t>(1, 300)(rng);
      c.n = std::uniform_int_distribution<std::int64_t>(1, 300)(rng);
      c.k = std::uniform_int_distribution<std::int64_t>(16, 300)(rng);
    } while (c.m * c.n * c.k < (std::int64_t{1} << 20));
    c.trans_a = rng() % 2 != 0, c.trans_b = rng() % 2 != 0;
    const std::int64_t pad = i % 3 == 0 ? 0 : static_cast<std::int64_t>(1 + rng() % 5);
    c.lda = (c.trans_a ? c.m : c.k) + pad, c.ldb = (c.trans_b ? c.k : c.n) + pad, c.ldc = c.n + pad;
    const bool accumulate = i % 2 != 0;
    BOOST_TEST(cpu::gemm_uses_onednn(DType::Float32, c.m, c.n, c.k), c.describe());
    const std::string problem = check_case<float>(c, rng, accumulate);
    BOOST_TEST(problem.empty(), "seed 17 case " << i << " (" << c.describe() << (accumulate ? ", accumulating" : "")
                                                << "): " << problem);
  }
}

// Thread ranks call the GEMM at once, each from its own thread that then
// exits: every thread gets the main thread's bits (the choice of library
// and kernel depends on the shape alone), and nothing a thread leaves
// behind leaks (the sanitizer build checks).
BOOST_AUTO_TEST_CASE(threads_at_once_get_the_same_bits) {
  std::mt19937 rng(18);
  for (const std::int64_t size : {48, 160, 320}) {  // below and above oneDNN's 2^20 multiply-adds
    std::vector<float> a(static_cast<std::size_t>(size * size)), b(a.size());
    std::uniform_real_distribution<float> unit(-1, 1);
    for (auto& x : a) x = unit(rng);
    for (auto& x : b) x = unit(rng);
    auto product = [&] {
      std::vector<float> c(a.size());
      cpu::gemm(DType::Float32, false, true, size, size, size, a.data(), size, b.data(), size, c.data(), size);
      return c;
    };
    const std::vector<float> want = product();
    std::vector<std::vector<float>> got(4);
    std::vector<std::thread> threads;
    for (auto& g : got) threads.emplace_back([&g, &product] { g = product(); });
    for (auto& t : threads) t.join();
    for (std::size_t t = 0; t < got.size(); ++t)
      BOOST_TEST((got[t] == want), "size " << size << " thread " << t << " differs from the main thread's product ("
                                           << cpu::gemm_backend() << ")");
  }
}

BOOST_AUTO_TEST_CASE(every_edge_of_zero_and_one) {
  // Each of m, n, k in {0, 1, 2} with each pair of flags, both float types.
  std::mt19937 rng(14);
  for (std::int64_t m : {0, 1, 2})
    for (std::int64_t n : {0, 1, 2})
      for (std::int64_t k : {0, 1, 2})
        for (int flags = 0; flags < 4; ++flags) {
          Case c;
          c.m = m, c.n = n, c.k = k, c.trans_a = (flags & 1) != 0, c.trans_b = (flags & 2) != 0;
          c.lda = std::max<std::int64_t>(1, c.trans_a ? m : k);
          c.ldb = std::max<std::int64_t>(1, c.trans_b ? k : n);
          c.ldc = std::max<std::int64_t>(1, n);
          const std::string f = check_case<float>(c, rng), d = check_case<double>(c, rng);
          BOOST_TEST(f.empty(), "f32 " << c.describe() << ": " << f);
          BOOST_TEST(d.empty(), "f64 " << c.describe() << ": " << d);
        }
}

BOOST_AUTO_TEST_CASE(uses_the_widest_kernels_the_cpu_has) {
  // OpenBLAS names its core in mixed case (DYNAMIC_ARCH builds) or in upper
  // case (builds for one target): compared in lower case.
  std::string kernels(cpu::gemm_kernels());
  for (char& ch : kernels) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  BOOST_TEST_MESSAGE("GEMM backend: " << cpu::gemm_backend());
  if (kernels == "eigen") {
    // The build or the run found no OpenBLAS (ops/meson.build, gemm_backend() says which).
    BOOST_TEST(cpu::gemm_backend().starts_with("eigen"), "kernels eigen, backend " << cpu::gemm_backend());
    return;
  }
  // OpenBLAS's kernel sets by the widest vectors they use.
  const std::vector<std::string> avx512 = {"skylakex", "cooperlake", "sapphirerapids"};
  std::vector<std::string> avx2 = {"haswell", "zen"};
  avx2.insert(avx2.end(), avx512.begin(), avx512.end());
  auto in = [&](const std::vector<std::string>& names) {
    for (const auto& name : names)
      if (kernels == name) return true;
    return false;
  };
  if (has_avx512_for_skx())
    BOOST_TEST(in(avx512), "the CPU has AVX-512 (F, DQ, BW, VL) but GEMM runs " << kernels << " kernels ("
                                                                                << cpu::gemm_backend() << ")");
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    BOOST_TEST(in(avx2),
               "the CPU has AVX2 and FMA but GEMM runs " << kernels << " kernels (" << cpu::gemm_backend() << ")");
}

BOOST_AUTO_TEST_SUITE_END()
