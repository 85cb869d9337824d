// Samples for the reduction ops (tests/op_cases.h) and known-answer tests
// of their sharding: what a reduction of a sharded dim communicates, mean
// over uneven and empty shards, softmax over a sharded dim.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>

#include "op_cases.h"
#include "support.h"

using namespace dtensor;
using dtensor::testing::OpSample;
using dtensor::testing::RegisterSamples;
using dtensor::testing::uniform;

namespace {

OpSample reduce_sample(Tensor x, std::vector<std::int64_t> dims, bool keepdim, double p = 2) {
  OpSample s;
  s.inputs = {std::move(x)};
  s.attrs = ReduceAttrs{.dims = std::move(dims), .keepdim = keepdim, .p = p};
  return s;
}

// sum, mean, max, min: one or several dims, keepdim, all dims, uneven sizes.
std::vector<OpSample> reduce_samples(bool integer) {
  std::vector<OpSample> out{
      reduce_sample(uniform({5, 7}, DType::Float64, 11), {1}, false),
      reduce_sample(uniform({5, 7}, DType::Float64, 12), {0}, true),
      reduce_sample(uniform({3, 5, 6}, DType::Float64, 13), {0, 2}, false),
      reduce_sample(uniform({3, 5, 6}, DType::Float64, 14), {-1}, true),
      reduce_sample(uniform({3, 5}, DType::Float64, 15), {}, false),
      reduce_sample(uniform({2, 3}, DType::Float64, 16), {0}, false),  // empty shards on 4 ranks
  };
  OpSample f32 = reduce_sample(uniform({5, 6}, DType::Float32, 17), {0}, false);
  f32.rtol = 1e-4;
  f32.atol = 1e-4;
  out.push_back(f32);
  if (integer) out.push_back(reduce_sample(testing::integer_tensor({5, 3}, DType::Int64, 18), {1}, false));
  return out;
}

const RegisterSamples sum_samples("sum", [](std::mt19937_64&) { return reduce_samples(true); });
const RegisterSamples mean_samples("mean", [](std::mt19937_64&) { return reduce_samples(false); });
const RegisterSamples max_samples("max", [](std::mt19937_64&) { return reduce_samples(true); });
const RegisterSamples min_samples("min", [](std::mt19937_64&) { return reduce_samples(true); });

const RegisterSamples norm_samples("norm", [](std::mt19937_64&) {
  return std::vector<OpSample>{
      reduce_sample(uniform({5, 7}, DType::Float64, 21), {1}, false, 2),
      reduce_sample(uniform({3, 5, 6}, DType::Float64, 22), {0, 2}, true, 1),
      reduce_sample(uniform({3, 5}, DType::Float64, 23), {}, false, std::numeric_limits<double>::infinity()),
      reduce_sample(uniform({5, 4}, DType::Float64, 24), {0}, false, 3),
  };
});

const RegisterSamples argmax_samples("argmax", [](std::mt19937_64&) {
  return std::vector<OpSample>{
      reduce_sample(uniform({5, 7}, DType::Float64, 31), {1}, false),
      reduce_sample(uniform({3, 5, 6}, DType::Float64, 32), {0}, true),
      reduce_sample(uniform({3, 5}, DType::Float64, 33), {}, false),
      reduce_sample(testing::integer_tensor({5, 3}, DType::Int64, 34), {-2}, false),
  };
});

OpSample softmax_sample(Tensor x, std::int64_t dim) {
  OpSample s;
  s.inputs = {std::move(x)};
  s.attrs = DimAttrs{.dim = dim};
  return s;
}

std::vector<OpSample> softmax_samples() {
  std::vector<OpSample> out{
      softmax_sample(uniform({5, 7}, DType::Float64, 41, -4, 4), 1),
      softmax_sample(uniform({3, 5, 6}, DType::Float64, 42, -4, 4), 0),
      softmax_sample(uniform({3, 5, 6}, DType::Float64, 43, -4, 4), -2),
  };
  OpSample f32 = softmax_sample(uniform({5, 6}, DType::Float32, 44, -4, 4), -1);
  f32.rtol = 1e-4;
  f32.atol = 1e-4;
  out.push_back(f32);
  // Sharding the last dim leaves some ranks one column (inner == 1) where
  // the full tensor has two: the sums must still be added in the same order,
  // so the result is held bit for bit (Partial inputs are left out: their
  // addends do not sum back to the full tensor's bits).
  OpSample exact = softmax_sample(uniform({3, 37, 2}, DType::Float32, 45, -4, 4), 1);
  exact.rtol = 0;
  exact.atol = 0;
  exact.allow_partial = false;
  out.push_back(exact);
  return out;
}
const RegisterSamples softmax_cases("softmax", [](std::mt19937_64&) { return softmax_samples(); });
const RegisterSamples log_softmax_cases("log_softmax", [](std::mt19937_64&) { return softmax_samples(); });

OpSample norm_sample(Shape shape, int k, bool weight, bool bias, std::uint64_t seed) {
  OpSample s;
  s.inputs = {uniform(shape, DType::Float64, seed, -2, 2)};
  const Shape trailing(shape.end() - k, shape.end());
  if (weight) s.inputs.push_back(uniform(trailing, DType::Float64, seed + 1, 0.5, 1.5));
  if (bias) s.inputs.push_back(uniform(trailing, DType::Float64, seed + 2));
  s.attrs = NormAttrs{.normalized_ndim = k, .weight = weight, .bias = bias, .eps = 1e-5};
  return s;
}

const RegisterSamples layer_norm_cases("layer_norm", [](std::mt19937_64&) {
  return std::vector<OpSample>{
      norm_sample({3, 5, 6}, 1, true, true, 51),
      norm_sample({5, 7}, 1, false, false, 52),
      norm_sample({3, 5, 6}, 2, true, false, 53),
      norm_sample({5, 7}, 1, false, true, 54),
  };
});
const RegisterSamples rms_norm_cases("rms_norm", [](std::mt19937_64&) {
  return std::vector<OpSample>{
      norm_sample({3, 5, 6}, 1, true, false, 61),
      norm_sample({5, 7}, 1, false, false, 62),
      norm_sample({3, 5, 6}, 2, true, false, 63),
  };
});

std::string check_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  if (!allclose(got, want, tol, tol))
    return fmt::format("{}: got {} want {} (max |diff| {})", what, got, want, max_abs_diff(got, want));
  return {};
}

bool has_nan(const Tensor& t) {
  const double* p = t.data_as<double>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (std::isnan(p[i])) return true;
  return false;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(reduction)

BOOST_AUTO_TEST_CASE(known_values_on_plain_tensors) {
  Tensor x = Tensor::arange({2, 3}, DType::Float64);  // [[0 1 2] [3 4 5]]
  BOOST_TEST(equal(sum(x, {1}), Tensor::from_vector<double>({3, 12}, {2})));
  BOOST_TEST(equal(sum(x, {0}, true), Tensor::from_vector<double>({3, 5, 7}, {1, 3})));
  BOOST_TEST(equal(sum(x), Tensor::from_vector<double>({15}, {})));
  BOOST_TEST(equal(mean(x, {0, 1}), Tensor::from_vector<double>({2.5}, {})));
  BOOST_TEST(equal(max(x, {0}), Tensor::from_vector<double>({3, 4, 5}, {3})));
  BOOST_TEST(equal(min(x, {1}), Tensor::from_vector<double>({0, 3}, {2})));
  BOOST_TEST(equal(argmax(x, 1), Tensor::from_vector<std::int64_t>({2, 2}, {2})));
  BOOST_TEST(equal(argmax(x), Tensor::from_vector<std::int64_t>({5}, {})));
  BOOST_TEST(allclose(norm(x, 2, {1}), Tensor::from_vector<double>({std::sqrt(5.0), std::sqrt(50.0)}, {2})));
  Tensor sm = softmax(x, 1);
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  BOOST_TEST(allclose(sm, Tensor::from_vector<double>({1 / z, std::exp(1.0) / z, std::exp(2.0) / z, 1 / z,
                                                       std::exp(1.0) / z, std::exp(2.0) / z},
                                                      {2, 3})));
  BOOST_TEST(allclose(log_softmax(x, -1), Tensor::from_vector<double>({-std::log(z), 1 - std::log(z), 2 - std::log(z),
                                                                       -std::log(z), 1 - std::log(z), 2 - std::log(z)},
                                                                      {2, 3})));
  // Each row [a, a+1, a+2] normalizes to [-1, 0, 1] * sqrt(3/2).
  const double r = std::sqrt(1.5);
  BOOST_TEST(allclose(layer_norm(x, {3}, std::nullopt, std::nullopt, 0.0),
                      Tensor::from_vector<double>({-r, 0, r, -r, 0, r}, {2, 3})));
  BOOST_TEST(allclose(rms_norm(Tensor::full({1, 2}, 3.0, DType::Float64), 1, std::nullopt, 0.0),
                      Tensor::ones({1, 2}, DType::Float64)));
  // NaN propagates through max and min, along a run and across runs.
  Tensor n = Tensor::arange({2, 3}, DType::Float64);
  n.set({0, 1}, std::nan(""));
  BOOST_TEST(std::isnan(max(n, {1}).get({0})));
  BOOST_TEST(std::isnan(min(n, {0}).get({1})));
  BOOST_TEST(max(n, {0}).get({0}) == 3.0);
  // Integer sums and maxima stay integer.
  Tensor i = Tensor::arange({2, 3}, DType::Int64);
  BOOST_TEST(equal(sum(i, {0}), Tensor::from_vector<std::int64_t>({3, 5, 7}, {3})));
  BOOST_TEST(equal(max(i), Tensor::from_vector<std::int64_t>({5}, {})));
}

BOOST_AUTO_TEST_CASE(errors_name_the_op_and_the_value) {
  Tensor i = Tensor::arange({2, 3}, DType::Int64);
  try {
    mean(i, {0});
    BOOST_ERROR("mean of i64 did not throw");
  } catch (const DTypeError& e) {
    BOOST_TEST(std::string(e.what()).find("[mean]") != std::string::npos, e.what());
    BOOST_TEST(std::string(e.what()).find("i64") != std::string::npos, e.what());
  }
  Tensor x = Tensor::zeros({2, 3}, DType::Float64);
  BOOST_CHECK_THROW(sum(x, {2}), ShapeError);
  BOOST_CHECK_THROW(sum(x, {1, -1}), ShapeError);
  BOOST_CHECK_THROW(max(Tensor::zeros({0, 3}, DType::Float64), {0}), ShapeError);
  BOOST_CHECK_THROW(softmax(x, 2), ShapeError);
  BOOST_CHECK_THROW(layer_norm(x, {2}), ShapeError);
  BOOST_CHECK_THROW(layer_norm(x, 1, std::optional<Tensor>(Tensor::ones({2}, DType::Float64))), ShapeError);
}

BOOST_AUTO_TEST_CASE(sum_over_a_sharded_dim_is_partial_without_communication) {
  testing::FailureLog log;
  Tensor full = uniform({10, 3}, DType::Float64, 5);
  const Tensor want = sum(full, {0});
  run_threads(4, [&](Communicator& world) {
    DeviceMesh mesh(world, {4});
    DTensor x = distribute_tensor(world.rank() == 0 ? full : Tensor(), mesh, Layout::parse("S(0)"));
    CommCounter counter(mesh);
    DTensor y = sum(x, {0});
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("sum issued {}", counter.counts()));
    if (y.placements() != Layout::parse("P(sum)")) log.add(fmt::format("sum gave {}", y.placements()));
    // A kept sharded dim stays sharded, also without communication.
    CommCounter counter2(mesh);
    DTensor z = max(x, {1}, true);
    if (counter2.counts().data_collectives() != 0) log.add(fmt::format("max issued {}", counter2.counts()));
    if (z.placements() != Layout::parse("S(0)")) log.add(fmt::format("max gave {}", z.placements()));
    DTensor m = max(x, {0});
    if (m.placements() != Layout::parse("P(max)")) log.add(fmt::format("max over dim 0 gave {}", m.placements()));
    auto e1 = check_close(y.full_tensor(), want, 1e-12, "sum");
    auto e2 = check_close(z.full_tensor(), max(full, {1}, true), 0, "max keepdim");
    auto e3 = check_close(m.full_tensor(), max(full, {0}), 0, "max dim 0");
    for (auto* e : {&e1, &e2, &e3})
      if (!e->empty()) log.add(*e);
  });
  BOOST_TEST(log.failures.empty());
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_CASE(mean_over_uneven_and_empty_shards_is_the_global_mean) {
  testing::FailureLog log;
  // 10 rows over 4 ranks: 3,3,3,1; 2 rows over 4 ranks: 1,1,0,0 (PyTorch #162692).
  for (std::int64_t rows : {10, 2}) {
    Tensor full = uniform({rows, 3}, DType::Float64, 7 + rows);
    const Tensor want = mean(full, {0});
    const Tensor want_all = mean(full);
    run_threads(4, [&](Communicator& world) {
      DeviceMesh mesh(world, {4});
      DTensor x = distribute_tensor(world.rank() == 0 ? full : Tensor(), mesh, Layout::parse("S(0)"));
      CommCounter counter(mesh);
      DTensor y = mean(x, {0});
      DTensor y_all = mean(x);
      if (counter.counts().data_collectives() != 0) log.add(fmt::format("mean issued {}", counter.counts()));
      if (y.placements() != Layout::parse("P(sum)")) log.add(fmt::format("mean gave {}", y.placements()));
      Tensor got = y.full_tensor();
      Tensor got_all = y_all.full_tensor();
      if (has_nan(got) || has_nan(got_all)) log.add(fmt::format("{} rows: NaN in the mean {}", rows, got));
      auto e1 = check_close(got, want, 1e-12, fmt::format("{} rows: mean over dim 0", rows));
      auto e2 = check_close(got_all, want_all, 1e-12, fmt::format("{} rows: mean over all", rows));
      for (auto* e : {&e1, &e2})
        if (!e->empty()) log.add(*e);
    });
  }
  BOOST_TEST(log.failures.empty());
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_CASE(softmax_gathers_its_dim_and_keeps_other_shards) {
  testing::FailureLog log;
  Tensor full = uniform({5, 7}, DType::Float64, 9, -3, 3);
  const Tensor want = softmax(full, 1);
  const Tensor want_log = log_softmax(full, 0);
  run_threads(4, [&](Communicator& world) {
    DeviceMesh mesh(world, {4});
    // Over a sharded dim: the dim is redistributed first.
    DTensor x1 = distribute_tensor(world.rank() == 0 ? full : Tensor(), mesh, Layout::parse("S(1)"));
    CommCounter counter(mesh);
    DTensor y1 = softmax(x1, 1);
    if (counter.counts().data_collectives() == 0) log.add("softmax over a sharded dim issued no collective");
    if (is_shard(y1.placements()[0], 1)) log.add(fmt::format("softmax output {}", y1.placements()));
    // Over an unsharded dim of an S(0) input: no collective, S(0) out.
    DTensor x0 = distribute_tensor(world.rank() == 0 ? full : Tensor(), mesh, Layout::parse("S(0)"));
    CommCounter counter0(mesh);
    DTensor y0 = softmax(x0, 1);
    if (counter0.counts().data_collectives() != 0) log.add(fmt::format("softmax issued {}", counter0.counts()));
    if (y0.placements() != Layout::parse("S(0)")) log.add(fmt::format("softmax gave {}", y0.placements()));
    // log_softmax over dim 0 of an S(1) input: S(1) stays, no collective.
    CommCounter counter2(mesh);
    DTensor y2 = log_softmax(x1, 0);
    if (counter2.counts().data_collectives() != 0) log.add(fmt::format("log_softmax issued {}", counter2.counts()));
    auto e1 = check_close(y1.full_tensor(), want, 1e-12, "softmax over sharded dim");
    auto e2 = check_close(y0.full_tensor(), want, 1e-12, "softmax over unsharded dim");
    auto e3 = check_close(y2.full_tensor(), want_log, 1e-12, "log_softmax");
    for (auto* e : {&e1, &e2, &e3})
      if (!e->empty()) log.add(*e);
  });
  BOOST_TEST(log.failures.empty());
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_CASE(layer_norm_keeps_sequence_shards) {
  testing::FailureLog log;
  Tensor full = uniform({6, 4, 8}, DType::Float64, 3);
  Tensor w = uniform({8}, DType::Float64, 4, 0.5, 1.5);
  Tensor b = uniform({8}, DType::Float64, 5);
  const Tensor want = layer_norm(full, {8}, std::optional<Tensor>(w), std::optional<Tensor>(b));
  run_threads(4, [&](Communicator& world) {
    DeviceMesh mesh(world, {2, 2});
    DTensor x = distribute_tensor(world.rank() == 0 ? full : Tensor(), mesh, Layout::parse("S(0),S(1)"));
    DTensor dw = distribute_tensor(world.rank() == 0 ? w : Tensor(), mesh, Layout::parse("R,R"));
    DTensor db = distribute_tensor(world.rank() == 0 ? b : Tensor(), mesh, Layout::parse("R,R"));
    CommCounter counter(mesh);
    DTensor y = layer_norm(x, {8}, std::optional<DTensor>(dw), std::optional<DTensor>(db));
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("layer_norm issued {}", counter.counts()));
    if (y.placements() != Layout::parse("S(0),S(1)")) log.add(fmt::format("layer_norm gave {}", y.placements()));
    auto e = check_close(y.full_tensor(), want, 1e-12, "layer_norm");
    if (!e.empty()) log.add(e);
  });
  BOOST_TEST(log.failures.empty());
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_CASE(nested_shards_and_partial_max_pass_through_without_communication) {
  testing::FailureLog log;
  Tensor full = uniform({7, 4, 5}, DType::Float64, 19);
  run_threads(4, [&](Communicator& world) {
    DeviceMesh mesh(world, {2, 2});
    // Dim 0 split by mesh dim 1 first (FSDP over TP): kept as it is.
    const Layout nested = Layout::parse("S(0)[1],S(0)[0]");
    DTensor x = distribute_tensor(world.rank() == 0 ? full : Tensor(), mesh, nested);
    CommCounter counter(mesh);
    DTensor s = sum(x, {2});
    DTensor sm = softmax(x, -1);
    DTensor ln = layer_norm(x, 2);
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("nested shards: issued {}", counter.counts()));
    for (const DTensor* y : {&s, &sm, &ln})
      if (y->placements() != nested) log.add(fmt::format("nested shards: output {}", y->placements()));
    // P(max) in, max over anything: P(max) out.
    DTensor pm = DTensor::from_local(full, mesh, Layout::parse("P(max),R"), full.shape());
    CommCounter counter2(mesh);
    DTensor m = max(pm, {0, 2});
    if (counter2.counts().data_collectives() != 0) log.add(fmt::format("P(max): issued {}", counter2.counts()));
    if (m.placements() != Layout::parse("P(max),R")) log.add(fmt::format("P(max): output {}", m.placements()));
    auto e1 = check_close(s.full_tensor(), sum(full, {2}), 1e-12, "nested sum");
    auto e2 = check_close(sm.full_tensor(), softmax(full, -1), 1e-12, "nested softmax");
    auto e3 = check_close(ln.full_tensor(), layer_norm(full, 2), 1e-12, "nested layer_norm");
    auto e4 = check_close(m.full_tensor(), max(full, {0, 2}), 0, "P(max) max");
    for (auto* e : {&e1, &e2, &e3, &e4})
      if (!e->empty()) log.add(*e);
  });
  BOOST_TEST(log.failures.empty());
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_SUITE_END()
