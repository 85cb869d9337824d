// Samples for the backward family (tests/op_cases.h), which test_ops runs
// over every layout combination against the unsharded op, and known-answer
// cases: hand-computed gradients, ties in max/min going to the first
// element, a row-sharded embedding table filling only its own rows and
// vocab-parallel cross entropy keeping the logits sharded.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <random>

#include "op_cases.h"
#include "support.h"

using namespace dtensor;
using dtensor::testing::OpSample;
using dtensor::testing::RegisterSamples;
using dtensor::testing::uniform;

namespace {

OpSample sample(std::vector<Tensor> inputs, OpAttrs attrs = {}) {
  OpSample s;
  s.inputs = std::move(inputs);
  s.attrs = std::move(attrs);
  s.rtol = 1e-9;
  s.atol = 1e-10;
  return s;
}

// i64 values in [0, bound), seeded.
Tensor indices(const Shape& shape, std::int64_t bound, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> v(static_cast<std::size_t>(numel(shape)));
  for (auto& x : v) x = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(bound));
  return Tensor::from_vector<std::int64_t>(v, shape);
}

std::vector<OpSample> activation_samples() {
  std::vector<OpSample> out{
      sample({uniform({5, 7}, DType::Float64, 1, -4, 4), uniform({5, 7}, DType::Float64, 2)}),
      sample({uniform({3, 4, 5}, DType::Float64, 3, -4, 4), uniform({3, 4, 5}, DType::Float64, 4)}),
  };
  OpSample f32 = sample({uniform({6, 5}, DType::Float32, 5, -4, 4), uniform({6, 5}, DType::Float32, 6)});
  // A Partial gradient's addends round in f32 before they are summed.
  f32.rtol = 1e-4;
  f32.atol = 1e-4;
  out.push_back(f32);
  return out;
}
const RegisterSamples gelu_backward_cases("gelu_backward", [](std::mt19937_64&) { return activation_samples(); });
const RegisterSamples silu_backward_cases("silu_backward", [](std::mt19937_64&) { return activation_samples(); });

// y is the forward's output, as the backward receives it.
std::vector<OpSample> softmax_backward_samples(const char* forward) {
  std::vector<OpSample> out;
  const std::pair<Shape, std::int64_t> cases[] = {{{5, 7}, 1}, {{3, 5, 6}, 0}, {{3, 5, 6}, -1}};
  std::uint64_t seed = 11;
  for (const auto& [shape, dim] : cases) {
    const Tensor y = call_op(forward, {uniform(shape, DType::Float64, seed++, -3, 3)}, DimAttrs{.dim = dim});
    out.push_back(sample({y, uniform(shape, DType::Float64, seed++)}, DimAttrs{.dim = dim}));
  }
  return out;
}
const RegisterSamples softmax_backward_cases("softmax_backward",
                                             [](std::mt19937_64&) { return softmax_backward_samples("softmax"); });
const RegisterSamples log_softmax_backward_cases("log_softmax_backward", [](std::mt19937_64&) {
  return softmax_backward_samples("log_softmax");
});

// x, grad[, weight] over the trailing k dims.
OpSample norm_sample(const Shape& shape, int k, bool weight, std::uint64_t seed, bool with_weight_input) {
  std::vector<Tensor> in{uniform(shape, DType::Float64, seed, -2, 2), uniform(shape, DType::Float64, seed + 1)};
  const Shape trailing(shape.end() - k, shape.end());
  if (weight && with_weight_input) in.push_back(uniform(trailing, DType::Float64, seed + 2, 0.5, 1.5));
  return sample(std::move(in), NormAttrs{.normalized_ndim = k, .weight = weight, .eps = 1e-5});
}
std::vector<OpSample> norm_backward_samples(bool with_weight_input) {
  return {norm_sample({3, 5, 6}, 1, true, 21, with_weight_input), norm_sample({5, 7}, 1, false, 24, with_weight_input),
          norm_sample({3, 5, 6}, 2, true, 27, with_weight_input)};
}
const RegisterSamples layer_norm_backward_cases("layer_norm_backward",
                                                [](std::mt19937_64&) { return norm_backward_samples(true); });
const RegisterSamples rms_norm_backward_cases("rms_norm_backward",
                                              [](std::mt19937_64&) { return norm_backward_samples(true); });
const RegisterSamples layer_norm_weight_backward_cases("layer_norm_weight_backward",
                                                       [](std::mt19937_64&) { return norm_backward_samples(false); });
const RegisterSamples rms_norm_weight_backward_cases("rms_norm_weight_backward",
                                                     [](std::mt19937_64&) { return norm_backward_samples(false); });

// Repeated indices (more lookups than rows) and a table with fewer rows
// than ranks.
const RegisterSamples embedding_backward_cases("embedding_backward", [](std::mt19937_64&) {
  return std::vector<OpSample>{
      sample({indices({9}, 7, 31), uniform({9, 4}, DType::Float64, 32), uniform({7, 4}, DType::Float64, 37)}),
      sample({indices({3, 4}, 6, 33), uniform({3, 4, 5}, DType::Float64, 34), uniform({6, 5}, DType::Float64, 38)}),
      sample({indices({2}, 3, 35), uniform({2, 2}, DType::Float64, 36), uniform({3, 2}, DType::Float64, 39)}),
  };
});

// lse from z, as the forward's cross_entropy computes it.
OpSample cross_entropy_sample(std::int64_t n, std::int64_t c, std::uint64_t seed) {
  const Tensor z = uniform({n, c}, DType::Float64, seed, -3, 3);
  const Tensor lse = call_op("log", {call_op("sum", {call_op("exp", {z})}, ReduceAttrs{.dims = {1}})});
  return sample({z, indices({n}, c, seed + 1), lse, uniform({n}, DType::Float64, seed + 2)});
}
const RegisterSamples cross_entropy_backward_cases("cross_entropy_backward", [](std::mt19937_64&) {
  return std::vector<OpSample>{cross_entropy_sample(5, 7, 41), cross_entropy_sample(6, 9, 44),
                               cross_entropy_sample(2, 3, 47)};
});

OpSample extremum_sample(const char* forward, const Shape& shape, std::vector<std::int64_t> dims, bool keepdim,
                         std::uint64_t seed) {
  const Tensor x = uniform(shape, DType::Float64, seed, -2, 2);
  const ReduceAttrs attrs{.dims = std::move(dims), .keepdim = keepdim};
  const Shape out = call_op(forward, {x}, attrs).shape();
  return sample({x, uniform(out, DType::Float64, seed + 1)}, attrs);
}
std::vector<OpSample> extremum_samples(const char* forward) {
  return {extremum_sample(forward, {5, 7}, {1}, false, 51), extremum_sample(forward, {3, 5, 6}, {0}, true, 53),
          extremum_sample(forward, {3, 5}, {}, false, 55), extremum_sample(forward, {3, 4, 5}, {0, -1}, false, 57)};
}
const RegisterSamples max_backward_cases("max_backward", [](std::mt19937_64&) { return extremum_samples("max"); });
const RegisterSamples min_backward_cases("min_backward", [](std::mt19937_64&) { return extremum_samples("min"); });

const RegisterSamples sum_to_shape_cases("sum_to_shape", [](std::mt19937_64&) {
  std::vector<OpSample> out{
      sample({uniform({3, 5, 6}, DType::Float64, 61)}, ShapeAttrs{.shape = {5, 1}}),
      sample({uniform({4, 5}, DType::Float64, 62)}, ShapeAttrs{.shape = {5}}),
      sample({uniform({4, 5}, DType::Float64, 63)}, ShapeAttrs{.shape = {1, 1}}),
      sample({uniform({3, 5}, DType::Float64, 64)}, ShapeAttrs{.shape = {3, 5}}),
      sample({uniform({2, 3, 4}, DType::Float64, 65)}, ShapeAttrs{.shape = {}}),
  };
  OpSample ints = sample({testing::integer_tensor({5, 3}, DType::Int64, 66)}, ShapeAttrs{.shape = {3}});
  ints.allow_partial = false;
  out.push_back(ints);
  return out;
});

Tensor f64(std::vector<double> v, Shape shape) { return Tensor::from_vector<double>(v, std::move(shape)); }
Tensor i64(std::vector<std::int64_t> v, Shape shape) { return Tensor::from_vector<std::int64_t>(v, std::move(shape)); }

void check_equal(const Tensor& got, const Tensor& want, double tol = 1e-12) {
  BOOST_TEST(allclose(got, want, tol, tol), fmt::format("got {}\nwant {}", got, want));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(backward_ops)

BOOST_AUTO_TEST_CASE(known_answers) {
  // gelu'(0) = 1/2, silu'(0) = 1/2; gelu'(x) = Phi(x) + x phi(x).
  const Tensor x = f64({0, 1, -2}, {3});
  const Tensor g = f64({2, 1, 3}, {3});
  const double phi1 = std::exp(-0.5) / std::sqrt(2 * M_PI), phi2 = std::exp(-2.0) / std::sqrt(2 * M_PI);
  check_equal(call_op("gelu_backward", {x, g}), f64({1, 0.5 * (1 + std::erf(1 / std::sqrt(2.0))) + phi1,
                                                     3 * (0.5 * (1 + std::erf(-2 / std::sqrt(2.0))) - 2 * phi2)},
                                                    {3}));
  const double s1 = 1 / (1 + std::exp(-1.0));
  check_equal(call_op("silu_backward", {f64({0, 1}, {2}), f64({2, 1}, {2})}), f64({1, s1 * (1 + (1 - s1))}, {2}));
  // A uniform softmax over 2: y = 1/2, grad (1, 3): 1/2 * ((1, 3) - 2) = (-1/2, 1/2).
  check_equal(call_op("softmax_backward", {f64({0.5, 0.5}, {1, 2}), f64({1, 3}, {1, 2})}, DimAttrs{.dim = 1}),
              f64({-0.5, 0.5}, {1, 2}));
  check_equal(call_op("log_softmax_backward", {f64({std::log(0.25), std::log(0.75)}, {1, 2}), f64({1, 3}, {1, 2})},
                      DimAttrs{.dim = 1}),
              f64({0, 0}, {1, 2}));
  // Indices (2, 0, 2): row 2 gets grad rows 0 and 2, row 1 nothing.
  check_equal(call_op("embedding_backward",
                      {i64({2, 0, 2}, {3}), f64({1, 2, 3, 4, 5, 6}, {3, 2}), Tensor::zeros({3, 2}, DType::Float64)}),
              f64({3, 4, 0, 0, 6, 8}, {3, 2}));
  // Uniform logits over 2 classes: softmax 1/2, target 1, grad 2: (1, -1).
  check_equal(call_op("cross_entropy_backward",
                      {f64({0, 0}, {1, 2}), i64({1}, {1}), f64({std::log(2.0)}, {1}), f64({2}, {1})}),
              f64({1, -1}, {1, 2}));
  // Ties go to the first extremum of the group, as argmax's.
  check_equal(call_op("max_backward", {f64({1, 3, 3, 2, 2, 0}, {2, 3}), f64({5, 7}, {2})}, ReduceAttrs{.dims = {1}}),
              f64({0, 5, 0, 7, 0, 0}, {2, 3}));
  check_equal(call_op("min_backward", {f64({1, 3, 1, 2, 2, 0}, {2, 3}), f64({5}, {})}, ReduceAttrs{}),
              f64({0, 0, 0, 0, 0, 5}, {2, 3}));
  check_equal(call_op("max_backward", {f64({1, 3, 3, 2, 4, 4}, {2, 3}), f64({5, 6, 7}, {1, 3})},
                      ReduceAttrs{.dims = {0}, .keepdim = true}),
              f64({0, 0, 0, 5, 6, 7}, {2, 3}));
  check_equal(call_op("sum_to_shape", {f64({1, 2, 3, 4, 5, 6}, {2, 3})}, ShapeAttrs{.shape = {2, 1}}),
              f64({6, 15}, {2, 1}));
  check_equal(call_op("sum_to_shape", {f64({1, 2, 3, 4, 5, 6}, {2, 3})}, ShapeAttrs{.shape = {3}}),
              f64({5, 7, 9}, {3}));
  // rms_norm of a constant row with unit weight: the gradient of x/|x|_rms
  // along the row is zero, across it 1/rms.
  check_equal(call_op("rms_norm_backward", {f64({2, 2}, {1, 2}), f64({1, 1}, {1, 2})}, NormAttrs{.eps = 0}),
              f64({0, 0}, {1, 2}));
  check_equal(call_op("layer_norm_weight_backward", {f64({1, 3}, {1, 2}), f64({2, 5}, {1, 2})}, NormAttrs{.eps = 0}),
              f64({-2, 5}, {2}));
}

BOOST_AUTO_TEST_CASE(bad_calls_name_the_value) {
  const Tensor x = f64({1, 2, 3, 4}, {2, 2});
  BOOST_CHECK_THROW(call_op("gelu_backward", {x, f64({1, 2}, {2})}), ShapeError);
  BOOST_CHECK_THROW(call_op("softmax_backward", {x, x}, DimAttrs{.dim = 2}), ShapeError);
  const Tensor table = Tensor::zeros({3, 2}, DType::Float64);
  BOOST_CHECK_THROW(call_op("embedding_backward", {i64({0, 1}, {2}), x, Tensor::zeros({3, 3}, DType::Float64)}),
                    ShapeError);
  BOOST_CHECK_THROW(call_op("embedding_backward", {i64({0, 5}, {2}), x, table}), ValueError);
  BOOST_CHECK_THROW(call_op("cross_entropy_backward", {x, i64({0, 2}, {2}), f64({0, 0}, {2}), f64({1, 1}, {2})}),
                    ValueError);
  BOOST_CHECK_THROW(call_op("max_backward", {x, f64({1, 2, 3}, {3})}, ReduceAttrs{.dims = {1}}), ShapeError);
  BOOST_CHECK_THROW(call_op("sum_to_shape", {x}, ShapeAttrs{.shape = {3}}), ShapeError);
  BOOST_CHECK_THROW(call_op("layer_norm_backward", {x, x}, NormAttrs{.weight = true}), ValueError);
  try {
    call_op("embedding_backward", {i64({0, 5}, {2}), x, table});
  } catch (const ValueError& e) {
    BOOST_TEST(std::string(e.what()).find("index 5") != std::string::npos, e.what());
  }
}

// A row-sharded table's gradient fills only its own rows, with no
// communication; vocab-parallel cross entropy's gradient stays sharded on
// the class dim; a batch-sharded norm's weight gradient is Partial(sum).
BOOST_AUTO_TEST_CASE(sharded_gradients_need_no_communication) {
  testing::FailureLog log;
  const Tensor idx = indices({6}, 8, 71);
  const Tensor g = uniform({6, 3}, DType::Float64, 72);
  const Tensor weights = uniform({8, 3}, DType::Float64, 76);
  const Tensor want = call_op("embedding_backward", {idx, g, weights});
  const Tensor z = uniform({4, 8}, DType::Float64, 73, -3, 3);
  const Tensor lse = call_op("log", {call_op("sum", {call_op("exp", {z})}, ReduceAttrs{.dims = {1}})});
  const Tensor t = indices({4}, 8, 74);
  const Tensor gl = uniform({4}, DType::Float64, 75);
  const Tensor want_ce = call_op("cross_entropy_backward", {z, t, lse, gl});
  const Tensor x = uniform({8, 5}, DType::Float64, 77), gx = uniform({8, 5}, DType::Float64, 78);
  const NormAttrs norm{.weight = true};
  const Tensor want_dw = call_op("layer_norm_weight_backward", {x, gx}, norm);
  run_threads(4, [&](Communicator& world) {
    DeviceMesh mesh(world, {4});
    const Layout r = Layout::parse("R");
    const DTensor di = distribute_tensor(idx, mesh, r), dg = distribute_tensor(g, mesh, r);
    const DTensor dz = distribute_tensor(z, mesh, Layout::parse("S(1)")), dt = distribute_tensor(t, mesh, r);
    const DTensor dlse = distribute_tensor(lse, mesh, r), dgl = distribute_tensor(gl, mesh, r);
    const DTensor dw = distribute_tensor(weights, mesh, Layout::parse("S(0)"));
    const DTensor dx = distribute_tensor(x, mesh, Layout::parse("S(0)")),
                  dgx = distribute_tensor(gx, mesh, Layout::parse("S(0)"));
    CommCounter counter(mesh);
    // Every rank holds the whole batch; for a row-sharded table each adds
    // only the lookups of its own two rows.
    const DTensor table = call_op("embedding_backward", std::vector<DTensor>{di, dg, dw});
    const DTensor dce = call_op("cross_entropy_backward", std::vector<DTensor>{dz, dt, dlse, dgl});
    // Batch-sharded rows: each rank sums its own, the weight's gradient is
    // Partial(sum).
    const DTensor norm_w = call_op("layer_norm_weight_backward", std::vector<DTensor>{dx, dgx}, norm);
    const CommStats c = counter.counts();
    if (norm_w.placements() != Layout::parse("P(sum)"))
      log.add(fmt::format("rank {}: layer_norm_weight_backward gave {}; expected P(sum)", world.rank(),
                          norm_w.placements()));
    if (!allclose(norm_w.full_tensor(), want_dw, 1e-12, 1e-12)) log.add("layer_norm_weight_backward differs");
    if (c.data_collectives() != 0) log.add(fmt::format("rank {}: the backward ops issued {}", world.rank(), c));
    if (table.placements() != Layout::parse("S(0)"))
      log.add(fmt::format("rank {}: embedding_backward gave {}; expected S(0)", world.rank(), table.placements()));
    if (dce.placements() != Layout::parse("S(1)"))
      log.add(fmt::format("rank {}: cross_entropy_backward gave {}; expected S(1)", world.rank(), dce.placements()));
    if (!allclose(table.full_tensor(), want, 1e-12, 1e-12)) log.add("embedding_backward differs");
    if (!allclose(dce.full_tensor(), want_ce, 1e-12, 1e-12)) log.add("cross_entropy_backward differs");
  });
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_SUITE_END()
