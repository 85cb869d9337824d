// Samples for the pointwise ops (tests/op_cases.h), and known answers for
// their propagation: which layouts they keep and what they communicate.
#include <boost/test/unit_test.hpp>

#include <cmath>

#include <mutex>

#include "op_cases.h"
#include "support.h"

using namespace dtensor;
using dtensor::testing::OpSample;
using dtensor::testing::RegisterSamples;
using dtensor::testing::uniform;

namespace {

// Float32 values pass through Partial(sum) sources with integer addends of
// up to a few hundred: products of such addends carry ~1e-4 absolute error
// in f32 (a 2x3 mesh, two Partial operands); f64 is exact enough.
OpSample make(std::vector<Tensor> inputs, double scalar = 0) {
  OpSample s;
  s.inputs = std::move(inputs);
  s.attrs = ScalarAttrs{.value = scalar};
  for (const auto& t : s.inputs)
    if (t.dtype() == DType::Float32) s.rtol = s.atol = 2e-3;
  return s;
}

// Integer-valued floats in [-k, k]: exact under Partial(sum) addends, and
// with ties for comparisons, maximum and where conditions.
Tensor grid(const Shape& shape, DType dtype, std::uint64_t seed, double k = 2) {
  Tensor t = uniform(shape, DType::Float64, seed, -k, k + 1);
  Tensor out = Tensor::empty(shape, dtype);
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    for (std::int64_t i = 0; i < t.numel(); ++i)
      out.data_as<T>()[i] = static_cast<T>(std::floor(t.data_as<double>()[i]));
  });
  return out;
}

std::uint64_t next(std::mt19937_64& rng) { return rng() % 1000000; }

// Unary: an uneven 2-D f64, a 3-D f32 with a size-1 dim, and for ops that
// take integers an i64 one. `lo, hi` keep inputs in the op's domain.
void unary_samples(const std::string& op, bool ints, double lo, double hi, double scalar = 0) {
  RegisterSamples reg(op, [=](std::mt19937_64& rng) {
    std::vector<OpSample> out;
    out.push_back(make({uniform({5, 7}, DType::Float64, next(rng), lo, hi)}, scalar));
    out.push_back(make({uniform({3, 1, 6}, DType::Float32, next(rng), lo, hi)}, scalar));
    if (ints) out.push_back(make({grid({6, 5}, DType::Int64, next(rng), 9)}, scalar));
    return out;
  });
}

// Binary: (5,7) with (7,) and (3,1,6) with (1,4,6); `full` adds the same-shape
// fast path, a 0-d operand and an empty one; `ints` an i64 (1,5) with (6,1).
// The samples are few and small: every op shares one strategy rule, and the
// harness runs each sample up to 160 times per mesh.
using Draw = std::function<Tensor(const Shape&, DType, std::uint64_t)>;
void binary_samples(const std::string& op, bool full, bool floats3d, bool ints, Draw a, Draw b) {
  RegisterSamples reg(op, [=](std::mt19937_64& rng) {
    std::vector<OpSample> out;
    out.push_back(make({a({5, 7}, DType::Float64, next(rng)), b({7}, DType::Float64, next(rng))}));
    if (floats3d)
      out.push_back(make({a({3, 1, 6}, DType::Float32, next(rng)), b({1, 4, 6}, DType::Float32, next(rng))}));
    if (ints) out.push_back(make({grid({1, 5}, DType::Int64, next(rng), 9), grid({6, 1}, DType::Int64, next(rng), 9)}));
    if (full) {
      out.push_back(make({a({5, 7}, DType::Float64, next(rng)), b({5, 7}, DType::Float64, next(rng))}));
      out.push_back(make({a({}, DType::Float64, next(rng)), b({5}, DType::Float64, next(rng))}));
      out.push_back(make({a({0, 3}, DType::Float64, next(rng)), b({3}, DType::Float64, next(rng))}));
    }
    return out;
  });
}

Draw range(double lo, double hi) {
  return [=](const Shape& s, DType d, std::uint64_t seed) { return uniform(s, d, seed, lo, hi); };
}
Draw grid_draw() {
  return [](const Shape& s, DType d, std::uint64_t seed) { return grid(s, d, seed); };
}

const bool registered = [] {
  unary_samples("neg", true, -2, 2);
  unary_samples("abs", true, -2, 2);
  unary_samples("exp", false, -2, 2);
  unary_samples("log", false, 0.5, 3);
  unary_samples("sqrt", false, 0.5, 3);
  unary_samples("rsqrt", false, 0.5, 3);
  unary_samples("tanh", false, -2, 2);
  unary_samples("sigmoid", false, -3, 3);
  unary_samples("relu", true, -2, 2);
  unary_samples("gelu", false, -3, 3);
  unary_samples("silu", false, -3, 3);
  unary_samples("add_scalar", true, -2, 2, 3);
  unary_samples("mul_scalar", true, -2, 2, -2);
  unary_samples("div_scalar", false, -2, 2, 4);
  unary_samples("pow_scalar", false, 0.5, 2, 1.5);

  binary_samples("add", true, true, true, range(-2, 2), range(-2, 2));
  binary_samples("sub", false, true, true, range(-2, 2), range(-2, 2));
  binary_samples("mul", true, true, true, range(-2, 2), range(-2, 2));
  binary_samples("div", false, true, false, range(-2, 2), range(0.5, 2));
  binary_samples("pow", false, true, false, range(0.5, 2), range(-2, 2));
  binary_samples("maximum", false, true, true, grid_draw(), range(-2, 2));
  binary_samples("minimum", false, true, true, grid_draw(), range(-2, 2));
  for (const char* cmp : {"eq", "ne", "lt", "le", "gt", "ge"})
    binary_samples(cmp, false, false, true, grid_draw(), grid_draw());

  RegisterSamples where("where", [](std::mt19937_64& rng) {
    auto cond = [&](const Shape& s, DType d) {
      Tensor c = grid(s, d, next(rng), 1);
      return call_op("ge", {c, Tensor::zeros({}, d)});  // 0/1 values
    };
    std::vector<OpSample> out;
    out.push_back(make({cond({5, 7}, DType::Float64), uniform({5, 7}, DType::Float64, next(rng)),
                        uniform({5, 7}, DType::Float64, next(rng))}));
    out.push_back(make({cond({7}, DType::Float64), uniform({5, 1}, DType::Float64, next(rng)),
                        uniform({5, 7}, DType::Float64, next(rng))}));
    out.push_back(make({cond({3, 1, 6}, DType::Float32), uniform({1, 4, 6}, DType::Float32, next(rng)),
                        uniform({6}, DType::Float32, next(rng))}));
    return out;
  });
  return true;
}();

// ---- Known answers ----------------------------------------------------------

// Runs body(mesh, log) on every rank of a mesh and reports failures.
void on_mesh(const Shape& mesh_shape, const std::function<void(const DeviceMesh&, testing::FailureLog&)>& body) {
  testing::FailureLog log;
  run_threads(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape);
    body(mesh, log);
  });
  testing::check_no_failures(log.failures);
}

DTensor shard_of(const Tensor& full, const DeviceMesh& mesh, const Layout& layout) {
  Layout l = validate_layout(layout, mesh.shape(), full.shape());
  return DTensor::from_local(testing::source_shard(full, mesh.shape(), l, mesh.coordinate(), 11), mesh, l,
                             full.shape());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(ops)
BOOST_AUTO_TEST_SUITE(pointwise_known_answers)

BOOST_AUTO_TEST_CASE(add_of_matching_shards_communicates_nothing) {
  Tensor a = uniform({10, 3}, DType::Float64, 1), b = uniform({10, 3}, DType::Float64, 2);
  Tensor want = call_op("add", {a, b});
  on_mesh({4}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    DTensor x = shard_of(a, mesh, Layout::parse("S(0)")), y = shard_of(b, mesh, Layout::parse("S(0)"));
    CommCounter counter(mesh);
    DTensor z = x + y;
    if (counter.counts().data_collectives() != 0) log.add("add S(0)+S(0) communicated");
    if (!(z.placements() == Layout::parse("S(0)"))) log.add(fmt::format("add S(0)+S(0) gave {}", z.placements()));
    if (!allclose(z.full_tensor(), want)) log.add("add S(0)+S(0): wrong values");
  });
}

BOOST_AUTO_TEST_CASE(broadcast_operand_keeps_its_shard_on_the_aligned_dim) {
  // (5,7) S(1) + (7,) S(0): dim 1 of the result is dim 0 of b.
  Tensor a = uniform({5, 7}, DType::Float64, 3), b = uniform({7}, DType::Float64, 4);
  Tensor want = call_op("add", {a, b});
  on_mesh({2, 2}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    DTensor x = shard_of(a, mesh, Layout::parse("S(1),S(0)")), y = shard_of(b, mesh, Layout::parse("S(0),R"));
    CommCounter counter(mesh);
    DTensor z = x + y;
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("(5,7)+(7,) communicated: {}", counter.counts()));
    if (!(z.placements() == Layout::parse("S(1),S(0)"))) log.add(fmt::format("(5,7)+(7,) gave {}", z.placements()));
    if (!allclose(z.full_tensor(), want)) log.add("(5,7)+(7,): wrong values");
  });
}

BOOST_AUTO_TEST_CASE(mul_of_partial_by_replicate_stays_partial) {
  Tensor a = uniform({5, 7}, DType::Float64, 5), b = uniform({5, 7}, DType::Float64, 6);
  Tensor want = call_op("mul", {a, b});
  on_mesh({4}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    DTensor x = shard_of(a, mesh, Layout::parse("P(sum)")), y = shard_of(b, mesh, Layout::parse("R"));
    CommCounter counter(mesh);
    DTensor z = x * y;
    DTensor z2 = 3.0 * x;  // mul_scalar: linear
    DTensor z3 = -x;       // neg: linear
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("P(sum)*R communicated: {}", counter.counts()));
    for (const DTensor* t : {&z, &z2, &z3})
      if (!(t->placements() == Layout::parse("P(sum)"))) log.add(fmt::format("P(sum)*R gave {}", t->placements()));
    if (!allclose(z.full_tensor(), want, 1e-9, 1e-9)) log.add("P(sum)*R: wrong values");
    if (!allclose(z2.full_tensor(), call_op("mul_scalar", {a}, ScalarAttrs{.value = 3}), 1e-9, 1e-9))
      log.add("3*P(sum): wrong values");
  });
}

BOOST_AUTO_TEST_CASE(add_of_partials_stays_partial_and_a_replicate_addend_joins_locally) {
  Tensor a = uniform({6, 4}, DType::Float64, 7), b = uniform({6, 4}, DType::Float64, 8);
  Tensor want = call_op("add", {a, b});
  on_mesh({4}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    DTensor x = shard_of(a, mesh, Layout::parse("P(sum)")), y = shard_of(b, mesh, Layout::parse("P(sum)"));
    CommCounter counter(mesh);
    DTensor z = x + y;
    if (counter.counts().data_collectives() != 0) log.add("P+P communicated");
    if (!(z.placements() == Layout::parse("P(sum)"))) log.add(fmt::format("P+P gave {}", z.placements()));
    const DTensor r = shard_of(b, mesh, Layout::parse("R"));  // from_local's check is not the add's
    CommCounter counter2(mesh);
    DTensor w = x + r;
    // R -> P(sum) is local (one rank keeps the values, the others zero), so
    // the Replicate addend joins the Partial instead of reducing it.
    if (counter2.counts().data_collectives() != 0) log.add(fmt::format("P+R issued {}", counter2.counts()));
    if (!(w.placements() == Layout::parse("P(sum)"))) log.add(fmt::format("P+R gave {}", w.placements()));
    if (!allclose(z.full_tensor(), want, 1e-9, 1e-9) || !allclose(w.full_tensor(), want, 1e-9, 1e-9))
      log.add("P+P / P+R: wrong values");
  });
}

BOOST_AUTO_TEST_CASE(relu_of_partial_reduces_first_with_one_collective) {
  Tensor a = uniform({8, 3}, DType::Float64, 9);
  Tensor want = call_op("relu", {a});
  on_mesh({4}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    DTensor x = shard_of(a, mesh, Layout::parse("P(sum)"));
    CommCounter counter(mesh);
    DTensor y = relu(x);
    if (counter.counts().data_collectives() != 1) log.add(fmt::format("relu(P) issued {}", counter.counts()));
    if (y.placements().has_partial()) log.add(fmt::format("relu(P) gave {}", y.placements()));
    if (!allclose(y.full_tensor(), want, 1e-9, 1e-9)) log.add("relu(P): wrong values");
  });
}

BOOST_AUTO_TEST_CASE(monotone_ops_carry_partial_max_and_neg_swaps_it) {
  Tensor a = uniform({5, 3}, DType::Float64, 10);
  on_mesh({2, 2}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    DTensor x = shard_of(a, mesh, Layout::parse("P(max),S(0)"));
    CommCounter counter(mesh);
    DTensor e = exp(x);
    DTensor n = -x;
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("exp/neg of P(max) issued {}", counter.counts()));
    if (!(e.placements() == Layout::parse("P(max),S(0)"))) log.add(fmt::format("exp(P(max)) gave {}", e.placements()));
    if (!(n.placements() == Layout::parse("P(min),S(0)"))) log.add(fmt::format("-P(max) gave {}", n.placements()));
    if (!allclose(e.full_tensor(), call_op("exp", {a}), 1e-12, 1e-12)) log.add("exp(P(max)): wrong values");
    if (!allclose(n.full_tensor(), call_op("neg", {a}), 1e-12, 1e-12)) log.add("-P(max): wrong values");
  });
}

BOOST_AUTO_TEST_CASE(front_end_on_tensors_gives_known_values) {
  Tensor a = Tensor::from_vector<double>({1, -2, 3, 4, -5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<double>({2, 4, 8}, {3});
  BOOST_TEST(equal(a + b, Tensor::from_vector<double>({3, 2, 11, 6, -1, 14}, {2, 3})));
  BOOST_TEST(equal(a * 2.0 - 1.0, Tensor::from_vector<double>({1, -5, 5, 7, -11, 11}, {2, 3})));
  BOOST_TEST(equal(a / b, Tensor::from_vector<double>({0.5, -0.5, 0.375, 2, -1.25, 0.75}, {2, 3})));
  BOOST_TEST(equal(relu(a), Tensor::from_vector<double>({1, 0, 3, 4, 0, 6}, {2, 3})));
  BOOST_TEST(equal(gt(a, b), Tensor::from_vector<double>({0, 0, 0, 1, 0, 0}, {2, 3})));
  BOOST_TEST(equal(where(gt(a, Tensor::zeros({}, DType::Float64)), a, -a), abs(a)));
  BOOST_TEST(equal(maximum(a, b), Tensor::from_vector<double>({2, 4, 8, 4, 4, 8}, {2, 3})));
  BOOST_TEST(equal(1.0 - a, Tensor::from_vector<double>({0, 3, -2, -3, 6, -5}, {2, 3})));
  Tensor c = a;
  c += b;
  BOOST_TEST(equal(c, a + b));
  BOOST_TEST(equal(a, Tensor::from_vector<double>({1, -2, 3, 4, -5, 6}, {2, 3})));  // += rebinds, a untouched
  BOOST_TEST(std::abs(gelu(Tensor::from_vector<double>({1}, {1})).get({0}) - 0.8413447460685429) < 1e-12);
  BOOST_TEST(std::abs(sigmoid(Tensor::from_vector<float>({0}, {1})).get({0}) - 0.5) < 1e-7);
  Tensor i = Tensor::from_vector<std::int64_t>({-3, 4}, {2});
  BOOST_TEST(equal(-i * 3.0, Tensor::from_vector<std::int64_t>({9, -12}, {2})));
}

BOOST_AUTO_TEST_CASE(bad_calls_name_the_op_and_the_values) {
  Tensor i = Tensor::from_vector<std::int64_t>({1, 2}, {2});
  auto message = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "no exception";
  };
  std::string m = message([&] { exp(i); });
  BOOST_TEST(m.find("[exp]") != std::string::npos);
  BOOST_TEST(m.find("i64") != std::string::npos);
  // Checked once, in the op's meta, which lists every dtype it accepts.
  BOOST_TEST(m.find("expected f32, f64, bf16 or f16") != std::string::npos, m);
  BOOST_TEST(message([&] { div(i, i); }).find("[div] is not defined for i64 tensors; expected f32, f64, bf16 or f16") !=
                 std::string::npos,
             message([&] { div(i, i); }));
  BOOST_CHECK_THROW(exp(i), DTypeError);
  BOOST_CHECK_THROW(i * 2.5, ValueError);
  Tensor a = Tensor::zeros({5, 7}, DType::Float64), b = Tensor::zeros({6}, DType::Float64);
  BOOST_CHECK_THROW(a + b, ShapeError);
  m = message([&] { a + b; });
  BOOST_TEST(m.find("[add]") != std::string::npos);
  BOOST_TEST(m.find("(5,7)") != std::string::npos);
  BOOST_CHECK_THROW(a + Tensor::zeros({7}, DType::Float32), DTypeError);
}

BOOST_AUTO_TEST_CASE(in_place_ops_write_into_shared_storage_and_keep_the_layout) {
  Tensor a = Tensor::from_vector<double>({1, 2, 3}, {3});
  Tensor alias = a;  // shares storage
  add_(a, Tensor::from_vector<double>({10, 20, 30}, {3}));
  mul_(a, 2.0);
  BOOST_TEST(equal(alias, Tensor::from_vector<double>({22, 44, 66}, {3})));
  BOOST_CHECK_THROW(add_(a, Tensor::zeros({2, 3}, DType::Float64)), ShapeError);

  std::vector<std::string> failures;
  std::mutex mu;
  run_threads(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2, 2});
    Tensor x_full = Tensor::arange({6, 4}, DType::Float64), y_full = Tensor::full({6, 4}, 0.5, DType::Float64);
    DTensor x = distribute_tensor(comm.rank() == 0 ? x_full : Tensor(), mesh, Layout::parse("S(0),S(1)"));
    DTensor y = distribute_tensor(comm.rank() == 0 ? y_full : Tensor(), mesh, Layout::parse("R,S(0)"));
    Tensor local = x.to_local();  // shares x's storage
    sub_(x, y);
    Tensor got = x.full_tensor();
    std::lock_guard lock(mu);
    if (!(x.placements() == Layout::parse("S(0),S(1)")))
      failures.push_back(fmt::format("layout became {}", x.placements()));
    if (!equal(local, x.to_local())) failures.push_back("the rank's shard was not updated in place");
    if (!equal(got, x_full - y_full)) failures.push_back("wrong values");
  });
  testing::check_no_failures(failures);
}

BOOST_AUTO_TEST_SUITE_END()
BOOST_AUTO_TEST_SUITE_END()
