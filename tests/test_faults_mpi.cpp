// Faults between ranks, on 4 thread ranks and as an MPI job of 4 processes
// (tests/meson.build runs this binary both ways): calls that do not match
// end every rank at once with the same CollectiveMismatch naming both calls
// and the ranks, and leave the communicator usable; a rank that does not
// arrive is named by the timeout; from_local names the argument the ranks
// disagree on. Each case runs on a communicator of its own with a short
// deadline, so that a regression fails in about a second instead of
// hanging. The rank that deviates is drawn from a fixed seed (printed).
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "comm_checks.h"
#include "support.h"

#include "dtensor/api/dtensor_tensor.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/threads.h"

using namespace dtensor;
using comm_test::contains;

namespace faults {

constexpr int kRanks = 4;
constexpr std::uint64_t kSeed = 20261201;
const auto kDeadline = std::chrono::milliseconds(1500);

// The rank that deviates in a case: one of 1..3 (rank 0 is the reference
// the messages compare against).
int odd_rank(std::string_view name) {
  std::mt19937_64 rng(kSeed + std::hash<std::string_view>{}(name));
  return 1 + static_cast<int>(rng() % (kRanks - 1));
}

boost::test_tools::assertion_result four_ranks(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result ok(testing::can_run(kRanks));
  ok.message() << "needs " << kRanks << " ranks (an MPI job of " << kRanks << " processes, or thread ranks)";
  return ok;
}

// Runs fn on kRanks ranks of the test backend, on a fresh communicator with
// the given deadline, and reports what the ranks logged.
void on_ranks(std::chrono::milliseconds deadline, const std::function<void(Communicator&, testing::FailureLog&)>& fn) {
  testing::FailureLog log;
  if (testing::test_backend() == "threads") {
    run_threads(
        kRanks, [&](Communicator& comm) { fn(comm, log); }, ThreadsOptions{deadline});
  } else {
    std::unique_ptr<Communicator> world = mpi_world(MpiOptions{deadline});
    try {
      fn(*world, log);
    } catch (const std::exception& e) {
      log.add(fmt::format("rank {} threw: {}", world->rank(), e.what()));
    }
  }
  testing::check_no_failures(log.failures);
}

using Call = std::function<void(Communicator&, int odd)>;

// Every rank makes `call`; every rank must throw CollectiveMismatch before
// the deadline, with a message holding each of `expected`, and the
// communicator must still sum correctly afterwards.
void expect_mismatch(std::string_view name, const Call& call, const std::vector<std::string>& expected) {
  const int odd = odd_rank(name);
  BOOST_TEST_MESSAGE("case " << name << ": seed " << kSeed << ", rank " << odd << " deviates");
  std::string seen_on_0;
  on_ranks(kDeadline, [&](Communicator& comm, testing::FailureLog& log) {
    const auto where =
        fmt::format("case {} (seed {}, rank {} deviates) on {} rank {}", name, kSeed, odd, comm.backend(), comm.rank());
    const auto start = std::chrono::steady_clock::now();
    std::string message;
    try {
      call(comm, odd);
      log.add(where + ": no CollectiveMismatch");
    } catch (const CollectiveMismatch& e) {
      message = e.what();
      if (comm.rank() == 0) seen_on_0 = message;
    } catch (const std::exception& e) {
      log.add(fmt::format("{}: expected CollectiveMismatch, got '{}'", where, e.what()));
      return;
    }
    const auto took = std::chrono::steady_clock::now() - start;
    if (!testing::sanitized() && took >= kDeadline)
      log.add(fmt::format("{}: the mismatch took {} ms, past the deadline", where,
                          std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
    std::vector<std::string> needles = expected;
    needles.push_back("rank 0 called");
    needles.push_back(fmt::format("rank {} called", odd));
    for (const auto& n : needles)
      if (!message.empty() && !contains(message, n))
        log.add(fmt::format("{}: the message does not say '{}': '{}'", where, n, message));
    // Nothing was left half done: the next call works.
    double one = 1, sum = 0;
    try {
      comm.all_reduce(&one, &sum, 1, DType::Float64, ReduceOp::Sum);
      if (sum != kRanks) log.add(fmt::format("{}: the all_reduce after the mismatch gave {}", where, sum));
    } catch (const std::exception& e) {
      log.add(fmt::format("{}: the all_reduce after the mismatch threw '{}'", where, e.what()));
    }
  });
  BOOST_TEST_MESSAGE("  rank 0 saw: " << seen_on_0);
}

std::vector<float> floats(std::size_t n) { return std::vector<float>(n, 1.0f); }

}  // namespace faults

using namespace faults;

BOOST_AUTO_TEST_SUITE(mismatched_collectives, *boost::unit_test::precondition(four_ranks))

BOOST_AUTO_TEST_CASE(large_all_gather_against_all_reduce) {
  // 4 MiB in all: past the threshold where the MPI backend makes the
  // blocking call.
  expect_mismatch("large_all_gather_against_all_reduce",
                  [](Communicator& comm, int odd) {
                    const std::size_t elems = 1 << 20;
                    auto in = floats(elems), out = floats(elems);
                    if (comm.rank() == odd)
                      comm.all_reduce(in.data(), out.data(), elems, DType::Float32, ReduceOp::Sum);
                    else
                      comm.all_gather(in.data(), out.data(), elems * sizeof(float) / kRanks);
                  },
                  {"all_gather(recv_bytes=[1048576, 1048576, 1048576, 1048576])", "all_reduce(count=1048576"});
}

BOOST_AUTO_TEST_CASE(all_reduce_counts_either_side_of_the_blocking_threshold) {
  expect_mismatch("all_reduce_counts_either_side_of_the_blocking_threshold",
                  [](Communicator& comm, int odd) {
                    const std::size_t elems = comm.rank() == odd ? 32768 : 8192;  // 128 KiB against 32 KiB
                    auto in = floats(elems), out = floats(elems);
                    comm.all_reduce(in.data(), out.data(), elems, DType::Float32, ReduceOp::Sum);
                  },
                  {"all_reduce(count=8192", "all_reduce(count=32768"});
}

BOOST_AUTO_TEST_CASE(broadcast_roots_differ) {
  expect_mismatch("broadcast_roots_differ",
                  [](Communicator& comm, int odd) {
                    auto buf = floats(64);
                    comm.broadcast(buf.data(), buf.size() * sizeof(float), comm.rank() == odd ? odd : 0);
                  },
                  {"broadcast(bytes=256, root=0)", "root=" + std::to_string(odd_rank("broadcast_roots_differ"))});
}

BOOST_AUTO_TEST_CASE(small_all_gather_against_all_reduce) {
  expect_mismatch("small_all_gather_against_all_reduce",
                  [](Communicator& comm, int odd) {
                    auto in = floats(16), out = floats(16 * kRanks);
                    if (comm.rank() == odd)
                      comm.all_reduce(in.data(), out.data(), 16, DType::Float32, ReduceOp::Sum);
                    else
                      comm.all_gather(in.data(), out.data(), 16 * sizeof(float));
                  },
                  {"all_gather(recv_bytes=[64, 64, 64, 64])", "all_reduce(count=16"});
}

BOOST_AUTO_TEST_CASE(small_count_mismatch) {
  expect_mismatch("small_count_mismatch",
                  [](Communicator& comm, int odd) {
                    const std::size_t elems = comm.rank() == odd ? 11 : 10;
                    auto in = floats(elems), out = floats(elems);
                    comm.all_reduce(in.data(), out.data(), elems, DType::Float32, ReduceOp::Sum);
                  },
                  {"all_reduce(count=10", "all_reduce(count=11"});
}

// An int64 Avg runs as a Sum of (x / n, x % n) pairs, twice the count: it
// must still differ from a real Sum of that count on the other ranks.
BOOST_AUTO_TEST_CASE(integer_average_against_a_sum_of_its_pairs) {
  expect_mismatch("integer_average_against_a_sum_of_its_pairs",
                  [](Communicator& comm, int odd) {
                    std::vector<std::int64_t> in(16, 3), out(16);
                    if (comm.rank() == odd)
                      comm.all_reduce(in.data(), out.data(), 8, DType::Int64, ReduceOp::Avg);
                    else
                      comm.all_reduce(in.data(), out.data(), 16, DType::Int64, ReduceOp::Sum);
                  },
                  {"all_reduce(count=16", "all_reduce(count=8", "avg"});
  expect_mismatch("integer_average_reduce_scatter_against_a_sum_of_its_pairs",
                  [](Communicator& comm, int odd) {
                    std::vector<std::int64_t> in(kRanks * 4, 3), out(4);
                    std::vector<std::size_t> counts(kRanks, comm.rank() == odd ? 2 : 4);
                    comm.reduce_scatter(in.data(), out.data(), counts, DType::Int64,
                                        comm.rank() == odd ? ReduceOp::Avg : ReduceOp::Sum);
                  },
                  {"reduce_scatter(counts=[4, 4, 4, 4]", "reduce_scatter(counts=[2, 2, 2, 2]", "avg"});
}

BOOST_AUTO_TEST_CASE(reduce_op_and_dtype_mismatch) {
  expect_mismatch("reduce_op_and_dtype_mismatch",
                  [](Communicator& comm, int odd) {
                    std::vector<double> in(kRanks * 4, 1.0), out(4);
                    std::vector<std::size_t> counts(kRanks, comm.rank() == odd ? 2 : 4);
                    comm.reduce_scatter(in.data(), out.data(), counts,
                                        comm.rank() == odd ? DType::Float32 : DType::Float64,
                                        comm.rank() == odd ? ReduceOp::Max : ReduceOp::Sum);
                  },
                  {"reduce_scatter(counts=[4, 4, 4, 4]", "reduce_scatter(counts=[2, 2, 2, 2]", "op=max"});
}

BOOST_AUTO_TEST_CASE(barrier_against_all_to_all) {
  expect_mismatch("barrier_against_all_to_all",
                  [](Communicator& comm, int odd) {
                    if (comm.rank() == odd) {
                      comm.barrier();
                      return;
                    }
                    std::vector<std::size_t> bytes(kRanks, 8), offsets(kRanks);
                    for (int p = 0; p < kRanks; ++p)
                      offsets[static_cast<std::size_t>(p)] = 8 * static_cast<std::size_t>(p);
                    std::vector<std::byte> in(8 * kRanks), out(8 * kRanks);
                    comm.all_to_all(in.data(), bytes, offsets, out.data(), bytes, offsets);
                  },
                  {"barrier()", "all_to_all(send_bytes=[8, 8, 8, 8]"});
}

BOOST_AUTO_TEST_CASE(all_to_all_sizes_disagree) {
  // Every rank calls all_to_all; the odd rank sends 16 bytes to rank 0,
  // which expects 8 from it.
  const int odd = odd_rank("all_to_all_sizes_disagree");
  expect_mismatch("all_to_all_sizes_disagree",
                  [](Communicator& comm, int odd) {
                    std::vector<std::size_t> send(kRanks, 8), recv(kRanks, 8), offsets(kRanks);
                    if (comm.rank() == odd) send[0] = 16;
                    for (int p = 0; p < kRanks; ++p)
                      offsets[static_cast<std::size_t>(p)] = 16 * static_cast<std::size_t>(p);
                    std::vector<std::byte> in(16 * kRanks), out(16 * kRanks);
                    comm.all_to_all(in.data(), send, offsets, out.data(), recv, offsets);
                  },
                  {fmt::format("(rank {} sends 16 bytes to rank 0, which expects 8)", odd)});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(timeouts, *boost::unit_test::precondition(four_ranks))

// The ranks that skip a call are named by every rank that waited for them.
void expect_timeout_naming(const std::vector<int>& skip, const std::string& named) {
  const auto deadline = std::chrono::milliseconds(300);
  on_ranks(deadline, [&](Communicator& comm, testing::FailureLog& log) {
    if (std::find(skip.begin(), skip.end(), comm.rank()) != skip.end()) return;
    const auto where = fmt::format("{} rank {} (ranks {} skip)", comm.backend(), comm.rank(), named);
    const auto start = std::chrono::steady_clock::now();
    try {
      float x = 1, y = 0;
      comm.all_reduce(&x, &y, 1, DType::Float32, ReduceOp::Sum);
      log.add(where + ": no CommTimeout");
    } catch (const CommTimeout& e) {
      const std::string want = fmt::format("timed out after 300 ms waiting for rank(s) {}", named);
      if (!contains(e.what(), want) || !contains(e.what(), "all_reduce"))
        log.add(fmt::format("{}: the message does not say '{}': '{}'", where, want, e.what()));
    } catch (const std::exception& e) {
      log.add(fmt::format("{}: expected CommTimeout, got '{}'", where, e.what()));
    }
    if (!testing::sanitized() && std::chrono::steady_clock::now() - start > std::chrono::seconds(3))
      log.add(where + ": the timeout came more than 3 s late");
  });
}

BOOST_AUTO_TEST_CASE(one_rank_missing) {
  const int odd = odd_rank("one_rank_missing");
  BOOST_TEST_MESSAGE("seed " << kSeed << ", rank " << odd << " skips");
  expect_timeout_naming({odd}, std::to_string(odd));
}

BOOST_AUTO_TEST_CASE(two_ranks_missing) { expect_timeout_naming({1, 3}, "1, 3"); }

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(from_local_agreement, *boost::unit_test::precondition(four_ranks))

// Every rank must throw E naming `expected` (and no rank may pass).
// What one rank passes to from_local.
struct FromLocalArgs {
  Tensor local;
  Layout placements = Layout::parse("S(0)");
  std::optional<Shape> global_shape;
};

template <class E>
void expect_from_local_error(std::string_view name, const std::function<FromLocalArgs(int rank, int odd)>& args,
                             const std::vector<std::string>& expected) {
  const int odd = odd_rank(name);
  BOOST_TEST_MESSAGE("case " << name << ": seed " << kSeed << ", rank " << odd << " deviates");
  on_ranks(kDeadline, [&](Communicator& comm, testing::FailureLog& log) {
    const auto where =
        fmt::format("case {} (seed {}, rank {} deviates) on {} rank {}", name, kSeed, odd, comm.backend(), comm.rank());
    DeviceMesh mesh(comm, {kRanks});
    try {
      FromLocalArgs a = args(comm.rank(), odd);
      DTensor t = DTensor::from_local(a.local, mesh, a.placements, a.global_shape);
      log.add(fmt::format("{}: from_local passed (global shape {})", where, fmt::join(t.shape(), "x")));
    } catch (const E& e) {
      for (const auto& n : expected)
        if (!contains(e.what(), n)) log.add(fmt::format("{}: the message does not say '{}': '{}'", where, n, e.what()));
    } catch (const std::exception& e) {
      log.add(
          fmt::format("{}: expected a {} naming {}, got '{}'", where, typeid(E).name(), expected.front(), e.what()));
    }
  });
}

BOOST_AUTO_TEST_CASE(dtype_differs) {
  const int odd = odd_rank("dtype_differs");
  expect_from_local_error<DTypeError>("dtype_differs",
                                      [](int rank, int odd) {
                                        return FromLocalArgs{Tensor::ones({2, 3}, rank == odd ? DType::Float64
                                                                                              : DType::Float32),
                                                             Layout::parse("S(0)"), std::nullopt};
                                      },
                                      {"[from_local]", "dtype", "rank 0 passes f32",
                                       fmt::format("rank {} passes f64", odd)});
}

BOOST_AUTO_TEST_CASE(number_of_dims_differs) {
  const int odd = odd_rank("number_of_dims_differs");
  expect_from_local_error<ShapeError>("number_of_dims_differs",
                                      [](int rank, int odd) {
                                        return FromLocalArgs{rank == odd ? Tensor::ones({2, 3, 1})
                                                                         : Tensor::ones({2, 3}),
                                                             Layout::parse("S(0)"), std::nullopt};
                                      },
                                      {"[from_local]", "dims", "rank 0 passes a 2-dim",
                                       fmt::format("rank {} passes a 3-dim", odd)});
}

BOOST_AUTO_TEST_CASE(many_dims_agree) {
  // More dims than the shape exchange carries inline: still inferred.
  on_ranks(kDeadline, [&](Communicator& comm, testing::FailureLog& log) {
    DeviceMesh mesh(comm, {kRanks});
    const Shape local{2, 1, 1, 1, 1, 1, 1, 1, 1, 3};
    DTensor t = DTensor::from_local(Tensor::ones(local), mesh, Layout::parse("S(0)"));
    const Shape want{8, 1, 1, 1, 1, 1, 1, 1, 1, 3};
    if (t.shape() != want)
      log.add(fmt::format("rank {}: global shape {}, expected {}", comm.rank(), fmt::join(t.shape(), "x"),
                          fmt::join(want, "x")));
  });
}

BOOST_AUTO_TEST_CASE(many_dims_differ) {
  const int odd = odd_rank("many_dims_differ");
  expect_from_local_error<ShapeError>("many_dims_differ",
                                      [](int rank, int odd) {
                                        return FromLocalArgs{rank == odd
                                                                 ? Tensor::ones({2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3})
                                                                 : Tensor::ones({2, 1, 1, 1, 1, 1, 1, 1, 1, 3}),
                                                             Layout::parse("S(0)"), std::nullopt};
                                      },
                                      {"[from_local]", "rank 0 passes a 10-dim",
                                       fmt::format("rank {} passes a 11-dim", odd)});
}

// With a global shape given, the ranks are still checked against each other.
BOOST_AUTO_TEST_CASE(given_global_shape_differs) {
  const int odd = odd_rank("given_global_shape_differs");
  expect_from_local_error<ShapeError>(
      "given_global_shape_differs",
      [](int rank, int odd) {
        return FromLocalArgs{Tensor::ones({2, 3}), Layout::parse("S(0)"), rank == odd ? Shape{8, 4} : Shape{8, 3}};
      },
      {"[from_local]", "global_shape", "rank 0 passes 8x3", fmt::format("rank {} passes 8x4", odd)});
}

BOOST_AUTO_TEST_CASE(given_dtype_differs) {
  const int odd = odd_rank("given_dtype_differs");
  expect_from_local_error<DTypeError>("given_dtype_differs",
                                      [](int rank, int odd) {
                                        return FromLocalArgs{Tensor::ones({2, 3},
                                                                          rank == odd ? DType::Int64 : DType::Float32),
                                                             Layout::parse("S(0)"), Shape{8, 3}};
                                      },
                                      {"[from_local]", "dtype", "rank 0 passes f32",
                                       fmt::format("rank {} passes i64", odd)});
}

BOOST_AUTO_TEST_CASE(given_number_of_dims_differs) {
  const int odd = odd_rank("given_number_of_dims_differs");
  expect_from_local_error<ShapeError>("given_number_of_dims_differs",
                                      [](int rank, int odd) {
                                        return rank == odd ? FromLocalArgs{Tensor::ones({2, 3, 1}),
                                                                           Layout::parse("S(0)"), Shape{8, 3, 1}}
                                                           : FromLocalArgs{Tensor::ones({2, 3}), Layout::parse("S(0)"),
                                                                           Shape{8, 3}};
                                      },
                                      {"[from_local]", "dims", "rank 0 passes a 2-dim",
                                       fmt::format("rank {} passes a 3-dim", odd)});
}

BOOST_AUTO_TEST_CASE(placements_differ) {
  const int odd = odd_rank("placements_differ");
  expect_from_local_error<LayoutError>(
      "placements_differ",
      [](int rank, int odd) {
        return FromLocalArgs{Tensor::ones({8, 3}), Layout::parse(rank == odd ? "R" : "P(sum)"), Shape{8, 3}};
      },
      {"[from_local]", "placements", "rank 0 passes P(sum)", fmt::format("rank {} passes R", odd)});
}

// One rank's shard is not its box: every rank names it, not only that one.
BOOST_AUTO_TEST_CASE(one_local_shape_is_not_its_box) {
  const int odd = odd_rank("one_local_shape_is_not_its_box");
  expect_from_local_error<
      ShapeError>("one_local_shape_is_not_its_box",
                  [](int rank, int odd) {
                    return FromLocalArgs{Tensor::ones({rank == odd ? 3 : 2, 3}), Layout::parse("S(0)"), Shape{8, 3}};
                  },
                  {"[from_local]", "S(0) of a 8x3 tensor",
                   fmt::format("rank {} holds a 3x3 shard where it should hold 2x3", odd)});
}

BOOST_AUTO_TEST_CASE(given_and_agreeing) {
  on_ranks(kDeadline, [&](Communicator& comm, testing::FailureLog& log) {
    DeviceMesh mesh(comm, {kRanks});
    const std::int64_t rows = comm.rank() < 3 ? 3 : 1;  // torch.chunk of 10 rows in 4: 3, 3, 3, 1
    for (auto check : {FromLocalCheck::RanksAgree, FromLocalCheck::Trust}) {
      DTensor t = DTensor::from_local(Tensor::ones({rows, 5}), mesh, Layout::parse("S(0)"), Shape{10, 5}, check);
      if (t.shape() != Shape{10, 5}) log.add(fmt::format("rank {}: {}", comm.rank(), t));
    }
  });
}

BOOST_AUTO_TEST_SUITE_END()
