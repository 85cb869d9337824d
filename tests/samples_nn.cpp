// Samples for the embedding family (tests/op_cases.h) and known-answer tests
// of its sharding: a row-sharded table gives Partial(sum) and a
// column-sharded one S(last), both without communication; vocab-parallel
// cross entropy never gathers the logits.
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

// i64 values in [0, bound), seeded.
Tensor indices(const Shape& shape, std::int64_t bound, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> v(static_cast<std::size_t>(numel(shape)));
  for (auto& x : v) x = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(bound));
  return Tensor::from_vector<std::int64_t>(v, shape);
}

OpSample two_inputs(Tensor a, Tensor b) {
  OpSample s;
  s.inputs = {std::move(a), std::move(b)};
  s.rtol = 1e-12;
  s.atol = 1e-12;
  return s;
}

// Indices vary over R and S(k) (i64, so never Partial); the table over R,
// S(0), S(1), P(sum). Uneven sizes and a table with fewer rows than ranks.
const RegisterSamples embedding_samples("embedding", [](std::mt19937_64&) {
  return std::vector<OpSample>{
      two_inputs(indices({5}, 7, 1), uniform({7, 4}, DType::Float64, 2)),
      two_inputs(indices({3, 4}, 6, 3), uniform({6, 5}, DType::Float64, 4)),
      two_inputs(indices({2}, 3, 5), uniform({3, 2}, DType::Float64, 6)),
  };
});

const RegisterSamples pick_samples("pick", [](std::mt19937_64&) {
  return std::vector<OpSample>{
      two_inputs(uniform({5, 7}, DType::Float64, 11), indices({5}, 7, 12)),
      two_inputs(uniform({6, 9}, DType::Float64, 13), indices({6}, 9, 14)),
      two_inputs(uniform({2, 3}, DType::Float64, 15), indices({2}, 3, 16)),
  };
});

// The unsharded loss, element by element.
double reference_cross_entropy(const Tensor& logits, const Tensor& targets) {
  const std::int64_t n = logits.shape()[0], c = logits.shape()[1];
  double total = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    double m = -INFINITY;
    for (std::int64_t k = 0; k < c; ++k) m = std::max(m, logits.get({r, k}));
    double s = 0;
    for (std::int64_t k = 0; k < c; ++k) s += std::exp(logits.get({r, k}) - m);
    total += m + std::log(s) - logits.get({r, static_cast<std::int64_t>(targets.get({r}))});
  }
  return total / static_cast<double>(n);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(nn)

BOOST_AUTO_TEST_CASE(known_values_on_plain_tensors) {
  Tensor table = Tensor::arange({4, 3}, DType::Float64);  // row r = [3r, 3r+1, 3r+2]
  Tensor idx = Tensor::from_vector<std::int64_t>({2, 0, 2, 3}, {2, 2});
  BOOST_TEST(
      equal(embedding(idx, table), Tensor::from_vector<double>({6, 7, 8, 0, 1, 2, 6, 7, 8, 9, 10, 11}, {2, 2, 3})));
  Tensor logits = Tensor::arange({2, 3}, DType::Float64);
  Tensor targets = Tensor::from_vector<std::int64_t>({1, 2}, {2});
  BOOST_TEST(equal(pick(logits, targets), Tensor::from_vector<double>({1, 5}, {2})));
  // Each row is [a, a+1, a+2]: loss = log(1 + e + e^2) - (target - a).
  const double lse = std::log(1 + std::exp(1.0) + std::exp(2.0));
  Tensor loss = cross_entropy(logits, targets);
  BOOST_TEST(loss.dim() == 0);
  BOOST_TEST(std::abs(loss.get({}) - ((lse - 1) + (lse - 2)) / 2) < 1e-12);
  // Large logits stay finite (the max is subtracted first).
  Tensor big = Tensor::full({2, 3}, 1000.0, DType::Float64);
  BOOST_TEST(std::abs(cross_entropy(big, targets).get({}) - std::log(3.0)) < 1e-12);
}

BOOST_AUTO_TEST_CASE(errors_name_the_op_and_the_value) {
  Tensor table = Tensor::zeros({10, 3}, DType::Float64);
  try {
    embedding(Tensor::from_vector<std::int64_t>({1, 12}, {2}), table);
    BOOST_ERROR("embedding with index 12 of 10 rows did not throw");
  } catch (const ValueError& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("[embedding]") != std::string::npos, what);
    BOOST_TEST(what.find("12") != std::string::npos, what);
    BOOST_TEST(what.find("10") != std::string::npos, what);
  }
  BOOST_CHECK_THROW(embedding(Tensor::from_vector<std::int64_t>({-1}, {1}), table), ValueError);
  BOOST_CHECK_THROW(embedding(Tensor::zeros({2}, DType::Float64), table), DTypeError);
  BOOST_CHECK_THROW(embedding(Tensor::from_vector<std::int64_t>({1}, {1}), Tensor::zeros({3}, DType::Float64)),
                    ShapeError);
  // On a row-sharded table every rank sees the replicated indices, so each
  // rank reports the bad index (no rank waits on another).
  try {
    run_threads(4, [&](Communicator& world) {
      DeviceMesh mesh(world, {4});
      DTensor dt = distribute_tensor(world.rank() == 0 ? table : Tensor(), mesh, Layout::parse("S(0)"));
      DTensor di = distribute_tensor(world.rank() == 0 ? Tensor::from_vector<std::int64_t>({1, 11}, {2}) : Tensor(),
                                     mesh, Layout::parse("R"));
      embedding(di, dt);
    });
    BOOST_ERROR("embedding of a sharded table with index 11 of 10 rows did not throw");
  } catch (const std::exception& e) {
    BOOST_TEST(std::string(e.what()).find("[embedding] index 11") != std::string::npos, e.what());
  }
  Tensor logits = Tensor::zeros({2, 3}, DType::Float64);
  try {
    pick(logits, Tensor::from_vector<std::int64_t>({0, 3}, {2}));
    BOOST_ERROR("pick with target 3 of 3 classes did not throw");
  } catch (const ValueError& e) {
    BOOST_TEST(std::string(e.what()).find("target 3") != std::string::npos, e.what());
  }
  BOOST_CHECK_THROW(cross_entropy(logits, Tensor::from_vector<std::int64_t>({0}, {1})), ShapeError);
  BOOST_CHECK_THROW(cross_entropy(logits, Tensor::zeros({2}, DType::Float64)), DTypeError);
}

BOOST_AUTO_TEST_CASE(embedding_of_a_sharded_table_needs_no_communication) {
  testing::FailureLog log;
  Tensor table = uniform({10, 6}, DType::Float64, 21);  // 10 rows over 4 ranks: 3,3,3,1
  Tensor idx = Tensor::from_vector<std::int64_t>({9, 0, 4, 4, 7, 2, 3}, {7});
  const Tensor want = embedding(idx, table);
  run_threads(4, [&](Communicator& world) {
    DeviceMesh mesh(world, {4});
    DTensor di = distribute_tensor(world.rank() == 0 ? idx : Tensor(), mesh, Layout::parse("R"));
    for (const char* text : {"S(0)", "S(1)"}) {
      DTensor dt = distribute_tensor(world.rank() == 0 ? table : Tensor(), mesh, Layout::parse(text));
      CommCounter counter(mesh);
      DTensor y = embedding(di, dt);
      if (counter.counts().data_collectives() != 0)
        log.add(fmt::format("table {}: embedding issued {}", text, counter.counts()));
      const Layout expected = Layout::parse(text == std::string("S(0)") ? "P(sum)" : "S(1)");
      if (y.placements() != expected) log.add(fmt::format("table {}: output {}", text, y.placements()));
      Tensor got = y.full_tensor();
      if (!allclose(got, want, 0, 0)) log.add(fmt::format("table {}: got {} want {}", text, got, want));
    }
  });
  BOOST_TEST(log.failures.empty());
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_CASE(embedding_on_a_2d_mesh_combines_index_and_row_shards) {
  testing::FailureLog log;
  Tensor table = uniform({9, 4}, DType::Float64, 41);
  Tensor idx = Tensor::from_vector<std::int64_t>({8, 0, 4, 4, 7, 2, 3, 1, 5, 6}, {2, 5});
  const Tensor want = embedding(idx, table);
  run_threads(4, [&](Communicator& world) {
    DeviceMesh mesh(world, {2, 2});
    // Indices split by mesh dim 0, table rows by mesh dim 1: S(0),P(sum).
    DTensor di = distribute_tensor(world.rank() == 0 ? idx : Tensor(), mesh, Layout::parse("S(0),R"));
    DTensor dt = distribute_tensor(world.rank() == 0 ? table : Tensor(), mesh, Layout::parse("R,S(0)"));
    CommCounter counter(mesh);
    DTensor y = embedding(di, dt);
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("embedding issued {}", counter.counts()));
    if (y.placements() != Layout::parse("S(0),P(sum)")) log.add(fmt::format("output {}", y.placements()));
    // A replicated table keeps the indices' shards.
    DTensor dr = distribute_tensor(world.rank() == 0 ? table : Tensor(), mesh, Layout::parse("R,R"));
    DTensor di2 = distribute_tensor(world.rank() == 0 ? idx : Tensor(), mesh, Layout::parse("S(0),S(1)"));
    CommCounter counter2(mesh);
    DTensor y2 = embedding(di2, dr);
    if (counter2.counts().data_collectives() != 0) log.add(fmt::format("R table issued {}", counter2.counts()));
    if (y2.placements() != Layout::parse("S(0),S(1)")) log.add(fmt::format("R table: output {}", y2.placements()));
    Tensor got = y.full_tensor();
    Tensor got2 = y2.full_tensor();
    if (!allclose(got, want, 0, 0)) log.add(fmt::format("got {} want {}", got, want));
    if (!allclose(got2, want, 0, 0)) log.add(fmt::format("R table: got {} want {}", got2, want));
  });
  BOOST_TEST(log.failures.empty());
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_CASE(vocab_parallel_cross_entropy_never_gathers_the_logits) {
  testing::FailureLog log;
  Tensor logits = uniform({8, 64}, DType::Float64, 31, -5, 5);
  Tensor targets = indices({8}, 64, 32);
  const double want = reference_cross_entropy(logits, targets);
  const double plain = cross_entropy(logits, targets).get({});
  BOOST_TEST(std::abs(plain - want) < 1e-9);
  const std::uint64_t logits_bytes = 8 * 64 * sizeof(double);
  run_threads(4, [&](Communicator& world) {
    DeviceMesh mesh(world, {4});
    DTensor dl = distribute_tensor(world.rank() == 0 ? logits : Tensor(), mesh, Layout::parse("S(1)"));
    DTensor dtg = distribute_tensor(world.rank() == 0 ? targets : Tensor(), mesh, Layout::parse("R"));
    CommCounter counter(mesh);
    DTensor loss = cross_entropy(dl, dtg);
    const CommStats c = counter.counts();
    if (c.count(CollectiveKind::AllGather) != 0 || c.count(CollectiveKind::AllToAll) != 0)
      log.add(fmt::format("rank {}: cross entropy issued {}", world.rank(), c));
    if (c.recv_bytes * 4 > logits_bytes)
      log.add(fmt::format("rank {}: received {} bytes, the logits are {}", world.rank(), c.recv_bytes, logits_bytes));
    const double got = loss.full_tensor().get({});
    if (!testing::close(got, want, 1e-9)) log.add(fmt::format("rank {}: loss {} want {}", world.rank(), got, want));
  });
  BOOST_TEST(log.failures.empty());
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_SUITE_END()
