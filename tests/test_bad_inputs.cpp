// Inputs a new user gets wrong, and numbers that must not come out silently
// wrong: NaN through every max/min (local kernels and collectives alike),
// int64 Avg beyond the sum's range, typed errors naming the bad dim or
// name, and a 0-d Partial(sum) held on coordinate 0 only. The collective
// cases run on thread ranks, or as an MPI job of any size (the mpi suite).
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "checks.h"
#include "dtensor/mesh/threads.h"
#include "dtensor/core/detail/combine.h"
#include "support.h"

using namespace dtensor;
using dtensor::testing::check_throws;
using dtensor::testing::FailureLog;

namespace bad_inputs {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr DType kFloating[] = {DType::Float32, DType::Float64, DType::BFloat16, DType::Float16};

// The ranks the collective cases run on: 4 threads, or the MPI job.
int ranks() { return static_cast<int>(numel(testing::backend_meshes({{4}}).front())); }

// A 1-d f64 tensor of `values` in `dtype`.
Tensor values_as(const std::vector<double>& values, DType dtype) {
  return Tensor::from_vector(values, {static_cast<std::int64_t>(values.size())}).to(dtype);
}

bool all_nan(const Tensor& t) {
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (!std::isnan(t.get({i}))) return false;
  return true;
}

__extension__ using Wide = __int128;  // the test's exact reference only

// sum / n rounded toward zero, exactly.
std::int64_t exact_average(const std::vector<std::int64_t>& xs) {
  Wide sum = 0;
  for (std::int64_t x : xs) sum += x;
  return static_cast<std::int64_t>(sum / static_cast<Wide>(xs.size()));
}

}  // namespace bad_inputs
using namespace bad_inputs;

// The tests' own numeric checks (checks.h) fail on NaN, so a kernel, a
// gradient or an optimizer step that outputs NaN cannot pass a suite.
BOOST_AUTO_TEST_CASE(the_tests_numeric_checks_fail_on_nan) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  BOOST_TEST(!testing::within(nan, 1.0));
  BOOST_TEST(!testing::close(nan, 0.0, 1.0));
  BOOST_TEST(!testing::close(0.0, nan, 1.0));
  BOOST_TEST(std::isnan(testing::worse(0.0, nan)));
  BOOST_TEST(std::isnan(testing::worse(nan, 1.0)));
  // and they still pass what they should
  BOOST_TEST(testing::within(1.0, 1.0));
  BOOST_TEST(testing::close(1.0, 1.5, 0.5));
  BOOST_TEST(testing::worse(1.0, 2.0) == 2.0);
  BOOST_TEST(testing::worse(2.0, 1.0) == 2.0);
}

BOOST_AUTO_TEST_SUITE(nan_propagates)

// The element rule every backend shares: a NaN on either side wins.
BOOST_AUTO_TEST_CASE(reduce_into_keeps_a_nan_on_either_side) {
  for (DType dtype : kFloating)
    for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min})
      for (int nan_side = 0; nan_side < 2; ++nan_side) {
        Tensor acc = values_as({nan_side == 0 ? kNaN : 1.0, -1.0}, dtype);
        Tensor x = values_as({nan_side == 1 ? kNaN : 2.0, kNaN}, dtype);
        reduce_into(acc.data(), x.data(), 2, dtype, op);
        BOOST_TEST(all_nan(acc), fmt::format("dtype {} op {} NaN in {}: got {}, {}", dtype, op, nan_side ? "x" : "acc",
                                             acc.get({0}), acc.get({1})));
      }
}

// all_reduce and reduce_scatter max/min: every rank gets NaN wherever one
// rank holds it, whichever rank that is.
BOOST_AUTO_TEST_CASE(collectives_give_nan_whichever_rank_holds_it) {
  const int n = ranks();
  FailureLog log;
  testing::run_ranks(n, [&](Communicator& comm) {
    for (DType dtype : kFloating)
      for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min})
        for (int holder = 0; holder < n; ++holder)
          for (int at = 0; at < n; ++at) {
            // Element i of rank r's send: NaN at i == at on the holder, else
            // r + i (so the numbers alone would give a finite answer). Every
            // (holder, element) pair: a backend that reduces each element on
            // one rank drops the NaN only where that rank is not the holder.
            std::vector<double> mine(static_cast<std::size_t>(n));
            for (int i = 0; i < n; ++i)
              mine[static_cast<std::size_t>(i)] = comm.rank() == holder && i == at ? kNaN : comm.rank() + i;
            const Tensor send = values_as(mine, dtype);
            Tensor reduced = Tensor::empty({n}, dtype);
            comm.all_reduce(send.data(), reduced.data(), static_cast<std::size_t>(n), dtype, op);
            for (int i = 0; i < n; ++i)
              if (std::isnan(reduced.get({i})) != (i == at))
                log.add(fmt::format("rank {}: all_reduce {} {} with NaN at {} on rank {}: element {} is {}",
                                    comm.rank(), op, dtype, at, holder, i, reduced.get({i})));
            Tensor block = Tensor::empty({1}, dtype);
            const std::vector<std::size_t> counts(static_cast<std::size_t>(n), 1);
            comm.reduce_scatter(send.data(), block.data(), counts, dtype, op);
            if (std::isnan(block.get({0})) != (comm.rank() == at))
              log.add(fmt::format("rank {}: reduce_scatter {} {} with NaN at {} on rank {}: got {}", comm.rank(), op,
                                  dtype, at, holder, block.get({0})));
          }
  });
  testing::check_no_failures(log.failures);
}

// The user's view: a sharded max()/min() is the plain tensor's, NaN
// included, and P(max) -> R does not depend on which rank holds the NaN.
BOOST_AUTO_TEST_CASE(sharded_max_is_the_plain_max) {
  const int n = ranks();
  FailureLog log;
  testing::run_ranks(n, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {n});
    for (std::int64_t at = 0; at < 2 * n; ++at) {
      std::vector<double> v(static_cast<std::size_t>(2 * n));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i % 3);
      v[static_cast<std::size_t>(at)] = kNaN;
      const Tensor full = values_as(v, DType::Float32);
      const DTensor x = distribute_tensor(full, mesh, Layout::parse("S(0)"));
      for (bool use_max : {true, false}) {
        const Tensor plain = use_max ? max(full) : min(full);
        const Tensor sharded = (use_max ? max(x) : min(x)).full_tensor();
        if (!std::isnan(plain.get({})) || !std::isnan(sharded.get({})))
          log.add(fmt::format("rank {}: {}() with NaN at {}: plain {}, sharded {}", comm.rank(),
                              use_max ? "max" : "min", at, plain.get({}), sharded.get({})));
      }
    }
    for (int holder = 0; holder < n; ++holder) {
      const Tensor local = values_as({comm.rank() == holder ? kNaN : 2.0}, DType::Float64);
      const DTensor p = DTensor::from_local(local, mesh, Layout::parse("P(max)"), Shape{1});
      const Tensor r = p.redistribute(Layout::parse("R")).to_local();
      if (!std::isnan(r.get({0})))
        log.add(fmt::format("rank {}: P(max) -> R with NaN on rank {} gives {}", comm.rank(), holder, r.get({0})));
    }
  });
  testing::check_no_failures(log.failures);
}

// The same on simulated GPU ranks (device buffers, the device reduce
// kernel): NaN through max, and the exact int64 Avg.
BOOST_AUTO_TEST_CASE(simulated_gpu_ranks_keep_nan_and_average_exactly,
                     *boost::unit_test::precondition(testing::needs_gpu)) {
  constexpr int n = 4;
  FailureLog log;
  ThreadsOptions options;
  options.device = Device::CUDA;
  run_threads(
      n,
      [&](Communicator& comm) {
        const Tensor send = values_as({comm.rank() == 2 ? kNaN : 1.0, 2.0}, DType::Float32).to(Device::CUDA);
        Tensor got = Tensor::empty({2}, DType::Float32, Device::CUDA);
        comm.all_reduce(send.data(), got.data(), 2, DType::Float32, ReduceOp::Max);
        const Tensor host = got.to(Device::CPU);
        if (!std::isnan(host.get({0})) || host.get({1}) != 2.0)
          log.add(fmt::format("rank {}: device max gives {}, {}", comm.rank(), host.get({0}), host.get({1})));
        const Tensor big = Tensor::full({3}, static_cast<double>(std::int64_t{1} << 62), DType::Int64);
        const Tensor dev = big.to(Device::CUDA);
        Tensor avg = Tensor::empty({3}, DType::Int64, Device::CUDA);
        comm.all_reduce(dev.data(), avg.data(), 3, DType::Int64, ReduceOp::Avg);
        if (!equal(avg.to(Device::CPU), big))
          log.add(fmt::format("rank {}: device avg of 2^62 gives {}", comm.rank(), avg.to(Device::CPU)));
      },
      options);
  testing::check_no_failures(log.failures);
}

// NCCL's fix-up (its max and min drop NaN): integer keys whose max/min,
// turned back, is combine::max_nan / min_nan. Checked here on the host, over
// every pair of special and random values.
template <class F, class Bits>
void check_order_keys(std::uint64_t seed) {
  std::vector<F> v = {std::numeric_limits<F>::quiet_NaN(),
                      -std::numeric_limits<F>::quiet_NaN(),
                      std::numeric_limits<F>::infinity(),
                      -std::numeric_limits<F>::infinity(),
                      F(0),
                      -F(0),
                      std::numeric_limits<F>::denorm_min(),
                      -std::numeric_limits<F>::denorm_min(),
                      std::numeric_limits<F>::max(),
                      std::numeric_limits<F>::lowest(),
                      F(1),
                      F(-1)};
  std::mt19937_64 rng(seed);
  std::normal_distribution<F> normal(F(0), F(1e3));
  for (int i = 0; i < 20; ++i) v.push_back(normal(rng));
  int bad = 0;
  for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min})
    for (F a : v)
      for (F b : v) {
        const auto ka = combine::order_key(std::bit_cast<Bits>(a), op);
        const auto kb = combine::order_key(std::bit_cast<Bits>(b), op);
        const auto k = op == ReduceOp::Max ? std::max(ka, kb) : std::min(ka, kb);
        const F got = std::bit_cast<F>(combine::from_order_key(k));
        const F want = op == ReduceOp::Max ? combine::max_nan(a, b) : combine::min_nan(a, b);
        const bool same = std::isnan(want) ? std::isnan(got) : got == want;
        if (!same && ++bad <= 5)
          BOOST_ERROR("seed " << seed << " " << fmt::format("{}", op) << "(" << a << ", " << b << "): keys give " << got
                              << ", expected " << want);
      }
  BOOST_TEST(bad == 0, "seed " << seed << ": " << bad << " wrong pairs");
  for (F a : v)
    if (!std::isnan(a))
      BOOST_TEST(std::bit_cast<Bits>(std::bit_cast<F>(combine::from_order_key(
                     combine::order_key(std::bit_cast<Bits>(a), ReduceOp::Max)))) == std::bit_cast<Bits>(a),
                 "seed " << seed << ": " << a << " does not come back from its key");
}

BOOST_AUTO_TEST_CASE(order_keys_order_as_max_nan) {
  check_order_keys<float, std::uint32_t>(17);
  check_order_keys<double, std::uint64_t>(18);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(integer_average)

// R -> P(avg) -> R of 2^62 on n ranks is 2^62, and collectives of values
// whose sum overflows average to sum / n rounded toward zero.
BOOST_AUTO_TEST_CASE(avg_of_int64_does_not_overflow) {
  const int n = ranks();
  const std::uint64_t seed = testing::seeded(29);
  FailureLog log;
  testing::run_ranks(n, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {n});
    const std::int64_t big = std::int64_t{1} << 62;
    const Tensor full = Tensor::full({3}, static_cast<double>(big), DType::Int64);
    const DTensor r = distribute_tensor(full, mesh, Layout::parse("R"));
    const Tensor back = r.redistribute(Layout::parse("P(avg)")).redistribute(Layout::parse("R")).to_local();
    if (!equal(back, full))
      log.add(fmt::format("rank {}: R -> P(avg) -> R of 2^62 on {} ranks gives {}", comm.rank(), n, back));

    // Columns: every rank the same extreme, then seeded values over the
    // whole range, then small ones of mixed sign (rounding toward zero).
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
    constexpr int kCols = 8;
    std::vector<std::vector<std::int64_t>> table(static_cast<std::size_t>(n));  // [rank][col]
    std::mt19937_64 rng(seed);
    for (int p = 0; p < n; ++p) {
      std::vector<std::int64_t>& row = table[static_cast<std::size_t>(p)];
      row = {kMax,
             kMin,
             big,
             -big,
             static_cast<std::int64_t>(rng()),
             static_cast<std::int64_t>(rng()),
             p == 0 ? -5 : 0,
             p == 0 ? 5 - n : 1};
    }
    std::vector<std::int64_t> want(kCols);
    for (int c = 0; c < kCols; ++c) {
      std::vector<std::int64_t> col;
      for (int p = 0; p < n; ++p) col.push_back(table[static_cast<std::size_t>(p)][static_cast<std::size_t>(c)]);
      want[static_cast<std::size_t>(c)] = exact_average(col);
    }
    const std::vector<std::int64_t>& mine = table[static_cast<std::size_t>(comm.rank())];
    std::vector<std::int64_t> got(kCols);
    comm.all_reduce(mine.data(), got.data(), kCols, DType::Int64, ReduceOp::Avg);
    for (int c = 0; c < kCols; ++c)
      if (got[static_cast<std::size_t>(c)] != want[static_cast<std::size_t>(c)])
        log.add(fmt::format("rank {}: all_reduce avg seed {} column {}: {} expected {}", comm.rank(), seed, c,
                            got[static_cast<std::size_t>(c)], want[static_cast<std::size_t>(c)]));
    // reduce_scatter with uneven blocks: column c goes to rank c % n, so
    // send lists the columns grouped by rank.
    std::vector<std::size_t> counts(static_cast<std::size_t>(n), 0);
    for (int c = 0; c < kCols; ++c) ++counts[static_cast<std::size_t>(c % n)];
    std::size_t offset = 0;
    for (int p = 0; p < comm.rank(); ++p) offset += counts[static_cast<std::size_t>(p)];
    std::vector<std::int64_t> order;
    for (int p = 0; p < n; ++p)
      for (int c = 0; c < kCols; ++c)
        if ((c % n) == p) order.push_back(c);
    std::vector<std::int64_t> send;
    for (std::int64_t c : order) send.push_back(mine[static_cast<std::size_t>(c)]);
    std::vector<std::int64_t> block(std::max<std::size_t>(counts[static_cast<std::size_t>(comm.rank())], 1));
    comm.reduce_scatter(send.data(), block.data(), counts, DType::Int64, ReduceOp::Avg);
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(comm.rank())]; ++i) {
      const std::int64_t c = order[offset + i];
      if (block[i] != want[static_cast<std::size_t>(c)])
        log.add(fmt::format("rank {}: reduce_scatter avg seed {} column {}: {} expected {}", comm.rank(), seed, c,
                            block[i], want[static_cast<std::size_t>(c)]));
    }
  });
  testing::check_no_failures(log.failures);
}

// The pair rule itself, over random values and rank counts.
BOOST_AUTO_TEST_CASE(average_pairs_are_exact) {
  const std::uint64_t seed = testing::seeded(31);
  std::mt19937_64 rng(seed);
  int bad = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 9);
    std::vector<std::int64_t> xs(static_cast<std::size_t>(n));
    for (auto& x : xs) x = trial % 2 ? static_cast<std::int64_t>(rng()) : static_cast<std::int64_t>(rng() % 21) - 10;
    std::int64_t pair[2] = {0, 0};
    for (std::int64_t x : xs) {
      std::int64_t p[2];
      combine::average_split(x, n, p);
      pair[0] += p[0];
      pair[1] += p[1];
    }
    if (combine::average_finish(pair, n) != exact_average(xs) && ++bad <= 5)
      BOOST_ERROR("seed " << seed << " trial " << trial << ": " << combine::average_finish(pair, n) << " expected "
                          << exact_average(xs));
  }
  BOOST_TEST(bad == 0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(errors_name_the_value)

BOOST_AUTO_TEST_CASE(slice_and_split_name_the_dim_and_range) {
  const Tensor x = Tensor::zeros({4, 6});
  check_throws<ShapeError>([&] { slice(x, 2, 0, 1); }, "dim 2 out of range for a 2-d tensor (expected -2..1)");
  check_throws<ShapeError>([&] { slice(x, -3, 0, 1); }, "[slice] dim -3");
  check_throws<ShapeError>([&] { split(x, 5, std::int64_t{2}); },
                           "[split] dim 5 out of range for a 2-d tensor (expected -2..1)");
  check_throws<ShapeError>([&] { split(x, -3, std::vector<std::int64_t>{2, 2}); }, "expected -2..1");
  BOOST_TEST(slice(x, -1, 1, 3).shape() == (Shape{4, 2}));
}

BOOST_AUTO_TEST_CASE(layout_index_names_the_mesh_dim) {
  const Layout l = Layout::parse("S(0),R");
  check_throws<LayoutError>([&] { (void)l[2]; }, "mesh dim 2 of the layout 'S(0),R': expected a mesh dim in [0, 2)");
  check_throws<LayoutError>([&] { (void)l[-1]; }, "mesh dim -1");
  check_throws<LayoutError>([&] { (void)l.level(7); }, "mesh dim 7");
}

BOOST_AUTO_TEST_CASE(parse_errors_quote_the_whole_layout) {
  check_throws<ParseError>([] { Layout::parse("S(0),,R"); }, "placement 2 of 'S(0),,R' is empty");
  check_throws<ParseError>([] { Layout::parse(",R"); }, "placement 1 of ',R' is empty");
  check_throws<ParseError>([] { Layout::parse("S(0),R,"); }, "placement 3 of 'S(0),R,' is empty");
  // A part that is there quotes itself (the CLI adds the whole text).
  check_throws<ParseError>([] { Layout::parse("S(0),Q,R"); }, "[placement] 'Q' is not a placement");
}

BOOST_AUTO_TEST_CASE(nesting_levels_are_per_tensor_dim) {
  // The dim that has levels is the one the error names.
  check_throws<ParseError>([] { Layout::parse("S(0),S(0)[1]"); },
                           "S(0) on mesh dim 0 has no nesting level but S(0) on mesh dim 1 has one");
  check_throws<ParseError>([] { Layout::parse("S(1)[0],S(0),S(1)"); }, "every shard of dim 1 or to none");
  // A dim given no levels nests left to right beside one that has them.
  const Layout l = Layout::parse("S(0),S(1)[1],S(1)[0]");
  BOOST_TEST(l.split_order(1) == (std::vector<int>{2, 1}));
  BOOST_TEST(l.split_order(0) == (std::vector<int>{0}));
  BOOST_TEST((Layout::parse("S(0),S(1)[0]") == Layout::parse("S(0),S(1)")));
}

BOOST_AUTO_TEST_CASE(submesh_names_the_repeated_dim) {
  FailureLog log;
  testing::run_ranks(ranks(), [&](Communicator& comm) {
    const int n = comm.size();
    DeviceMesh mesh(comm, n % 2 == 0 ? Shape{2, n / 2} : Shape{1, n}, {"dp", "tp"});
    if (auto problem = testing::throw_problem<MeshError>(
            [&] {
              mesh.submesh({"dp", "dp"});
            },
            {"'dp' is listed twice", "mesh dims dp,tp"}))
      log.add(fmt::format("rank {}: {}", comm.rank(), *problem));
  });
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(zero_dim_partial)

// distribute_tensor of a 0-d value as P(sum) over every mesh dim: the value
// on coordinate 0, the identity (0) elsewhere, so that it sums back to
// itself; a 1-element 1-d tensor does the same.
BOOST_AUTO_TEST_CASE(a_scalar_partial_sum_sits_on_coordinate_zero) {
  const Shape mesh_shape = testing::backend_meshes({{2, 3}}).back();
  FailureLog log;
  testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape);
    std::vector<Placement> sums(mesh_shape.size(), Partial{ReduceOp::Sum});
    const Layout layout(sums);
    for (const Shape& shape : {Shape{}, Shape{1}}) {
      const Tensor full = Tensor::full(shape, 0.25, DType::Float64);
      const DTensor t = distribute_tensor(full, mesh, layout);
      const bool origin =
          std::all_of(mesh.coordinate().begin(), mesh.coordinate().end(), [](std::int64_t c) { return c == 0; });
      const Tensor& local = t.to_local();
      const double held = shape.empty() ? local.get({}) : local.get({0});
      if (held != (origin ? 0.25 : 0.0))
        log.add(fmt::format("rank {}: a {}-d 0.25 as {} holds {} on coordinate [{}]", comm.rank(), shape.size(), layout,
                            held, fmt::join(mesh.coordinate(), ",")));
      // R -> P(sum) by redistribution keeps the same rule.
      const DTensor moved = distribute_tensor(full, mesh, Layout::replicated(mesh.ndim())).redistribute(layout);
      const double kept = shape.empty() ? moved.to_local().get({}) : moved.to_local().get({0});
      if (kept != (origin ? 0.25 : 0.0))
        log.add(fmt::format("rank {}: a {}-d 0.25 redistributed R -> {} holds {} on coordinate [{}]", comm.rank(),
                            shape.size(), layout, kept, fmt::join(mesh.coordinate(), ",")));
      const Tensor back = t.full_tensor();
      const double sum = shape.empty() ? back.get({}) : back.get({0});
      if (sum != 0.25)
        log.add(fmt::format("rank {}: a {}-d 0.25 as {} sums back to {}", comm.rank(), shape.size(), layout, sum));
    }
  });
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_SUITE_END()
