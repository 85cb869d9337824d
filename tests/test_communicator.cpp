// What is particular to the threads backend and DeviceMesh: stats
// arithmetic, the failure modes (mismatch, a failing rank, timeouts) and
// meshes (groups, submeshes, bad shapes). The collectives' values and byte
// counts, common to every backend, are in test_collectives.cpp.
//
// Boost.Test assertions are not thread-safe, so ranks collect failures into a
// per-rank list and the test thread reports them after run_threads returns.
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "checks.h"
#include "comm_checks.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "dtensor/core/error.h"
#include "dtensor/core/shape.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/threads.h"

using namespace dtensor;
using dtensor::testing::check_throws;
using dtensor::testing::throw_problem;
namespace bdata = boost::unit_test::data;

using namespace comm_test;

BOOST_AUTO_TEST_SUITE(threads_communicator)

BOOST_AUTO_TEST_CASE(names_and_stats_arithmetic) {
  BOOST_TEST(collective_name(CollectiveKind::AllReduce) == "all_reduce");
  BOOST_TEST(collective_name(CollectiveKind::ReduceScatter) == "reduce_scatter");
  BOOST_TEST(fmt::format("{}", CollectiveKind::AllToAll) == "all_to_all");
  CommStats a;
  a.record(CollectiveKind::AllReduce, 10);
  a.record(CollectiveKind::Barrier, 0);
  a.record(CollectiveKind::Split, 0);
  CommStats b = a;
  b.record(CollectiveKind::AllGather, 5);
  b.record(CollectiveKind::AllReduce, 3);
  BOOST_TEST(a.data_collectives() == 1u);
  BOOST_TEST(b.data_collectives() == 3u);
  const CommStats d = b - a;
  BOOST_TEST(d.count(CollectiveKind::AllReduce) == 1u);
  BOOST_TEST(d.count(CollectiveKind::AllGather) == 1u);
  BOOST_TEST(d.count(CollectiveKind::Barrier) == 0u);
  BOOST_TEST(d.recv_bytes == 8u);
  BOOST_TEST(d.bytes_by_kind[static_cast<int>(CollectiveKind::AllReduce)] == 3u);
}

BOOST_AUTO_TEST_CASE(world_size_must_be_positive) {
  check_throws<ValueError>([] { run_threads(0, [](Communicator&) {}); }, "world_size 0");
  check_throws<ValueError>([] { run_threads(-2, [](Communicator&) {}); }, "world_size -2");
}

BOOST_AUTO_TEST_CASE(mismatch_fails_every_rank) {
  for (int n : {2, 4, 8}) {
    BOOST_TEST_CONTEXT("world " << n) {
      std::vector<std::string> messages(static_cast<std::size_t>(n));
      std::vector<int> kinds(static_cast<std::size_t>(n), 0);  // 1 mismatch, 2 other
      try {
        run_threads(n, [&](Communicator& comm) {
          const int rank = comm.rank();
          std::vector<float> buf(static_cast<std::size_t>(4 * n), 1.0f), out(buf.size());
          try {
            if (rank < (n == 2 ? 1 : 2))
              comm.all_reduce(buf.data(), out.data(), 4, DType::Float32, ReduceOp::Sum);
            else
              comm.all_gather(buf.data(), out.data(), 4 * sizeof(float));
          } catch (const CollectiveMismatch& e) {
            messages[static_cast<std::size_t>(rank)] = e.what();
            kinds[static_cast<std::size_t>(rank)] = 1;
            throw;
          } catch (const std::exception& e) {
            messages[static_cast<std::size_t>(rank)] = e.what();
            kinds[static_cast<std::size_t>(rank)] = 2;
            throw;
          }
        });
        BOOST_ERROR("run_threads did not throw");
      } catch (const RankFailed& e) {
        BOOST_TEST(contains(e.what(), "[run_threads] rank "));
        BOOST_TEST(contains(e.what(), "mismatch"), e.what());
      }
      for (int r = 0; r < n; ++r) {
        BOOST_TEST_CONTEXT("rank " << r << " message " << messages[static_cast<std::size_t>(r)]) {
          BOOST_TEST(kinds[static_cast<std::size_t>(r)] == 1);
          BOOST_TEST(contains(messages[static_cast<std::size_t>(r)], "all_reduce(count=4"));
          BOOST_TEST(contains(messages[static_cast<std::size_t>(r)], "all_gather("));
        }
      }
    }
  }
  // Same collective, different arguments.
  std::atomic<int> mismatches{0};
  run_threads(3, [&](Communicator& comm) {
    double x[4] = {}, y[4];
    try {
      comm.all_reduce(x, y, comm.rank() == 1 ? 3 : 4, DType::Float64, ReduceOp::Sum);
    } catch (const CollectiveMismatch& e) {
      if (contains(e.what(), "count=3") && contains(e.what(), "count=4")) ++mismatches;
    }
    try {
      comm.broadcast(x, 8, comm.rank() == 2 ? 1 : 0);
    } catch (const CollectiveMismatch& e) {
      if (contains(e.what(), "root=1") && contains(e.what(), "root=0")) ++mismatches;
    }
    try {
      comm.all_reduce(x, y, 4, DType::Float64, comm.rank() == 0 ? ReduceOp::Max : ReduceOp::Sum);
    } catch (const CollectiveMismatch& e) {
      if (contains(e.what(), "op=max")) ++mismatches;
    }
    // all_to_all sizes that do not pair up.
    std::size_t sb[3] = {1, 1, 1}, rb[3] = {1, 1, 1}, off[3] = {0, 1, 2};
    if (comm.rank() == 0) sb[2] = 2;
    std::uint8_t s[4] = {}, r[4];
    try {
      comm.all_to_all(s, sb, off, r, rb, off);
    } catch (const CollectiveMismatch& e) {
      if (contains(e.what(), "rank 0 sends 2 bytes to rank 2")) ++mismatches;
    }
    // The group still works after a mismatch.
    comm.all_reduce(x, y, 4, DType::Float64, ReduceOp::Sum);
  });
  BOOST_TEST(mismatches.load() == 12);
}

BOOST_AUTO_TEST_CASE(failing_rank_releases_peers_quickly) {
  for (int n : {2, 4, 8}) {
    BOOST_TEST_CONTEXT("world " << n) {
      const int bad = n - 1;
      std::vector<std::string> messages(static_cast<std::size_t>(n));
      const auto start = std::chrono::steady_clock::now();
      try {
        run_threads(n, [&](Communicator& comm) {
          const int rank = comm.rank();
          // Pairs that do not contain the failing rank keep working until
          // their next collective.
          auto pair = comm.split(rank / 2, rank);
          if (rank == bad) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            throw std::runtime_error("boom");
          }
          try {
            double x = 1, y;
            if (rank / 2 == bad / 2) {
              comm.all_reduce(&x, &y, 1, DType::Float64, ReduceOp::Sum);
            } else {
              for (;;) pair->all_reduce(&x, &y, 1, DType::Float64, ReduceOp::Sum);
            }
          } catch (const PeerFailed& e) {
            messages[static_cast<std::size_t>(rank)] = e.what();
            throw;
          }
        });  // default 60 s timeout
        BOOST_ERROR("run_threads did not throw");
      } catch (const RankFailed& e) {
        BOOST_TEST(e.rank() == bad);
        BOOST_TEST(std::string(e.what()) == fmt::format("[run_threads] rank {} failed: boom", bad));
      }
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      BOOST_TEST(testing::in_time(elapsed, 5.0), elapsed << " s");
      for (int r = 0; r < n; ++r)
        if (r != bad)
          BOOST_TEST(contains(messages[static_cast<std::size_t>(r)], fmt::format("rank {} failed: boom", bad)),
                     "rank " << r << ": '" << messages[static_cast<std::size_t>(r)] << "'");
    }
  }
}

BOOST_AUTO_TEST_CASE(timeout_when_a_rank_skips) {
  const int n = 4;
  std::vector<std::string> messages(n), later(n);
  const auto start = std::chrono::steady_clock::now();
  // Rank 3 skips the all_reduce and returns; the others time out, see the
  // group unusable afterwards, and return normally: run_threads ends cleanly.
  run_threads(
      n,
      [&](Communicator& comm) {
        const int rank = comm.rank();
        if (rank == 3) return;
        float x = 1, y;
        try {
          comm.all_reduce(&x, &y, 1, DType::Float32, ReduceOp::Sum);
        } catch (const CommTimeout& e) {
          messages[static_cast<std::size_t>(rank)] = e.what();
        }
        try {
          comm.barrier();
        } catch (const CommTimeout& e) {
          later[static_cast<std::size_t>(rank)] = e.what();
        }
        // Receiving from a rank that never sends times out too.
        try {
          comm.recv(&x, sizeof(x), 3, 0);
        } catch (const CommTimeout& e) {
          if (!contains(e.what(), "recv")) later[static_cast<std::size_t>(rank)] += " (bad recv message)";
        }
      },
      ThreadsOptions{std::chrono::milliseconds(200)});
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST(testing::in_time(elapsed, 3.0), elapsed << " s");
  for (int r = 0; r < 3; ++r) {
    BOOST_TEST_CONTEXT("rank " << r << ": '" << messages[r] << "' then '" << later[r] << "'") {
      BOOST_TEST(contains(messages[r], "all_reduce"));
      BOOST_TEST(contains(messages[r], fmt::format("rank {} of 4", r)));
      BOOST_TEST(contains(messages[r], "timed out after 200 ms"));
      BOOST_TEST(contains(later[r], "unusable"));
      BOOST_TEST(!contains(later[r], "bad recv"));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(started_calls)

// Several calls in flight at once on every rank, each of another kind, then
// waited in the reverse order: values as the blocking calls give them, and
// each call counted only once it has been waited for.
BOOST_AUTO_TEST_CASE(in_flight_together_and_waited_out_of_order) {
  const std::uint64_t seed = 20261207;
  for (int n : {2, 3, 4}) {
    BOOST_TEST_CONTEXT("world " << n << ", seed " << seed) {
      Failures failures(n);
      run_threads(n, [&](Communicator& comm) {
        const int rank = comm.rank();
        std::mt19937_64 rng(seed + static_cast<std::uint64_t>(n));  // the same sizes on every rank
        const std::size_t count = 1 + rng() % 5000;
        std::vector<double> reduced(count), gathered(count * static_cast<std::size_t>(n)), scattered(count);
        std::vector<double> mine(count), blocks(count * static_cast<std::size_t>(n));
        for (std::size_t i = 0; i < count; ++i) mine[i] = value(seed, rank, i);
        for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = value(seed + 1, rank, i);
        std::vector<std::size_t> counts(static_cast<std::size_t>(n), count);
        double token = rank, from_left = -1;
        const int right = (rank + 1) % n, left = (rank + n - 1) % n;

        const CommStats before = comm.own_stats();
        Work reduce = comm.start_all_reduce(mine.data(), reduced.data(), count, DType::Float64, ReduceOp::Sum);
        Work gather = comm.start_all_gather(mine.data(), gathered.data(), count * sizeof(double));
        Work scatter = comm.start_reduce_scatter(blocks.data(), scattered.data(), counts, DType::Float64, ReduceOp::Max);
        Work sent = comm.start_send(&token, sizeof(token), right, 7);
        Work got = comm.start_recv(&from_left, sizeof(from_left), left, 7);
        // Nothing counts before its wait, however far the worker has got.
        EXPECT_R((comm.own_stats() - before).data_collectives() == 0, "counted before any wait");

        got.wait();
        sent.wait();
        scatter.wait();
        gather.wait();
        reduce.wait();
        const CommStats d = comm.own_stats() - before;
        EXPECT_R(d.count(CollectiveKind::AllReduce) == 1 && d.count(CollectiveKind::AllGather) == 1 &&
                     d.count(CollectiveKind::ReduceScatter) == 1 && d.count(CollectiveKind::Send) == 1 &&
                     d.count(CollectiveKind::Recv) == 1,
                 "counts after the waits: {}", d);
        EXPECT_R(from_left == left, "recv got {} from rank {}", from_left, left);
        for (std::size_t i = 0; i < count; ++i) {
          double sum = 0, max = -1e300;
          for (int p = 0; p < n; ++p) {
            sum += value(seed, p, i);
            max = std::max(max, value(seed + 1, p, static_cast<std::size_t>(rank) * count + i));
            const double g = gathered[static_cast<std::size_t>(p) * count + i];
            EXPECT_R(g == value(seed, p, i), "gathered[{}][{}] = {}", p, i, g);
          }
          EXPECT_R(reduced[i] == sum, "reduced[{}] = {}, expected {}", i, reduced[i], sum);
          EXPECT_R(scattered[i] == max, "scattered[{}] = {}, expected {}", i, scattered[i], max);
        }
        // A blocking call runs after the started ones: when it returns they
        // have finished (test() is true without waiting).
        Work later = comm.start_broadcast(&token, sizeof(token), 0);
        double x = 1, y = 0;
        comm.all_reduce(&x, &y, 1, DType::Float64, ReduceOp::Sum);
        EXPECT_R(later.test(), "a started broadcast had not finished after a later blocking all_reduce");
        EXPECT_R(token == 0 && y == n, "token {} y {}", token, y);
        // A handle dropped unwaited still completes and counts.
        const CommStats before_drop = comm.own_stats();
        { Work dropped = comm.start_all_reduce(&x, &y, 1, DType::Float64, ReduceOp::Max); }
        EXPECT_R((comm.own_stats() - before_drop).count(CollectiveKind::AllReduce) == 1, "the dropped call");
      });
      failures.report();
    }
  }
}

BOOST_AUTO_TEST_CASE(mismatched_starts_fail_at_wait_on_every_rank) {
  std::atomic<int> caught{0};
  run_threads(2, [&](Communicator& comm) {
    std::vector<float> buf(8, 1.0f), out(16);
    Work w = comm.rank() == 0 ? comm.start_all_reduce(buf.data(), out.data(), 8, DType::Float32, ReduceOp::Sum)
                              : comm.start_all_gather(buf.data(), out.data(), 8 * sizeof(float));
    try {
      w.wait();
    } catch (const CollectiveMismatch& e) {
      if (contains(e.what(), "all_reduce(count=8") && contains(e.what(), "all_gather(")) ++caught;
    }
    // The group still works, through either form.
    float x = 1, y = 0;
    comm.start_all_reduce(&x, &y, 1, DType::Float32, ReduceOp::Sum).wait();
    if (y == 2) ++caught;
  });
  BOOST_TEST(caught.load() == 4);
}

BOOST_AUTO_TEST_CASE(a_started_call_that_no_peer_joins_times_out) {
  std::string message, again;
  run_threads(
      2,
      [&](Communicator& comm) {
        if (comm.rank() == 1) return;
        float x = 1, y;
        Work w = comm.start_all_reduce(&x, &y, 1, DType::Float32, ReduceOp::Sum);
        try {
          w.wait();
        } catch (const CommTimeout& e) {
          message = e.what();
        }
        try {  // every later wait says it again
          w.wait();
        } catch (const CommTimeout& e) {
          again = e.what();
        }
      },
      ThreadsOptions{std::chrono::milliseconds(200)});
  BOOST_TEST(contains(message, "all_reduce"), message);
  BOOST_TEST(contains(message, "timed out after 200 ms"), message);
  BOOST_TEST(again == message);
}

BOOST_AUTO_TEST_CASE(link_model_parses_prints_and_refuses) {
  const LinkModel a = LinkModel::parse("10us,5GB/s");
  BOOST_TEST(a.latency.count() == 10'000);
  BOOST_TEST(a.bytes_per_second == 5e9);
  BOOST_TEST(a.str() == "10us,5GB/s");
  BOOST_TEST(a.time_for(5'000'000'000ULL).count() == 1'000'010'000);
  const LinkModel b = LinkModel::parse("1.5ms,100MiB/s");
  BOOST_TEST(b.latency.count() == 1'500'000);
  BOOST_TEST(b.bytes_per_second == 100.0 * 1024 * 1024);
  BOOST_TEST(LinkModel::parse("0ns,1B/s").str() == "0s,1B/s");
  for (const char* bad : {"10us", "10,5GB/s", "10us,5", "-1us,5GB/s", "10us,0GB/s", "10us,5Gb/s", "x,y", ""})
    check_throws<ParseError>([&] { LinkModel::parse(bad); }, fmt::format("link '{}'", bad));
  check_throws<ParseError>([] { LinkModel::parse("10us,5Gb/s"); }, "bad bandwidth '5Gb/s'");
  check_throws<ParseError>([] { LinkModel::parse("-1us,5GB/s"); }, "a negative latency");
}

// A modelled link holds each call at least its alpha-beta time (a lower
// bound that sleeping guarantees, not a speed claim), the split groups
// inherit it, and nullopt lifts it.
BOOST_AUTO_TEST_CASE(a_modelled_link_holds_each_call_its_time) {
  Failures failures(2);
  run_threads(2, [&](Communicator& comm) {
    const int rank = comm.rank();
    const LinkModel link = LinkModel::parse("3ms,1MB/s");
    comm.model_link(link);
    EXPECT_R(comm.link_model() && comm.link_model()->str() == "3ms,1MB/s", "link_model()");
    std::vector<float> x(1000, 1.0f), y(1000);
    // all_reduce of 1000 floats on 2 ranks receives 2000 bytes: 3 ms + 2 ms.
    const auto expected = link.time_for(2000);
    auto t0 = std::chrono::steady_clock::now();
    Work w = comm.start_all_reduce(x.data(), y.data(), 1000, DType::Float32, ReduceOp::Sum);
    w.wait();
    const auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_R(took >= expected, "a started all_reduce took {} ns on a link that needs {} ns",
             std::chrono::nanoseconds(took).count(), expected.count());
    auto sub = comm.split(0, rank);
    EXPECT_R(sub->link_model() && sub->link_model()->str() == "3ms,1MB/s", "the split group's link");
    t0 = std::chrono::steady_clock::now();
    sub->barrier();
    EXPECT_R(std::chrono::steady_clock::now() - t0 >= link.latency, "a barrier on the link");
    comm.model_link(std::nullopt);
    EXPECT_R(!comm.link_model(), "link lifted");
    std::string refused;
    try {
      comm.model_link(LinkModel{std::chrono::nanoseconds(0), 0.0});
    } catch (const ValueError& e) {
      refused = e.what();
    }
    EXPECT_R(contains(refused, "expected a positive bandwidth"), "model_link with no bandwidth: '{}'", refused);
  });
  failures.report();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(device_mesh)

namespace mesh_test {

// Every ordered selection of distinct dims of an ndim mesh (including none).
void ordered_subsets(int ndim, std::vector<int>& cur, std::vector<std::vector<int>>& out) {
  out.push_back(cur);
  for (int d = 0; d < ndim; ++d) {
    if (std::find(cur.begin(), cur.end(), d) != cur.end()) continue;
    cur.push_back(d);
    ordered_subsets(ndim, cur, out);
    cur.pop_back();
  }
}

struct MeshCase {
  int world;
  Shape shape;
};

std::vector<MeshCase> mesh_cases() {
  return {{1, {1}},       {1, {1, 1}}, {2, {2}},    {2, {1, 2}},    {2, {2, 1}},       {3, {3}},
          {3, {1, 3}},    {4, {4}},    {4, {2, 2}}, {4, {1, 4}},    {6, {2, 3}},       {6, {3, 2}},
          {6, {1, 2, 3}}, {8, {8}},    {8, {2, 4}}, {8, {2, 2, 2}}, {8, {2, 2, 2, 1}}, {8, {1, 2, 2, 2}}};
}

}  // namespace mesh_test
using namespace mesh_test;

BOOST_AUTO_TEST_CASE(layout_groups_and_submeshes) {
  const std::vector<std::string> all_names{"a", "b", "c", "d"};
  for (const auto& mc : mesh_cases()) {
    const int n = mc.world;
    const Shape shape = mc.shape;
    const int ndim = static_cast<int>(shape.size());
    std::vector<std::string> names(all_names.begin(), all_names.begin() + ndim);
    std::vector<std::vector<int>> subsets;
    std::vector<int> cur;
    ordered_subsets(ndim, cur, subsets);
    BOOST_TEST_CONTEXT("mesh " << fmt::format("{}", fmt::join(shape, "x"))) {
      Failures failures(n);
      run_threads(n, [&](Communicator& world) {
        const int rank = world.rank();
        DeviceMesh mesh(world, shape, names);
        const Shape coord = unravel_index(rank, shape);
        EXPECT_R(mesh.rank() == rank && mesh.coordinate() == coord, "coordinate");
        EXPECT_R(mesh.size() == n && mesh.ndim() == ndim && &mesh.comm() == &world, "size");
        for (int p = 0; p < n; ++p) EXPECT_R(mesh.rank_of(mesh.coordinate_of(p)) == p, "round trip {}", p);
        const std::int64_t me = rank;
        for (const auto& dims : subsets) {
          // Expected members: vary `dims` (first listed most significant).
          std::int64_t gsize = 1;
          for (int d : dims) gsize *= shape[static_cast<std::size_t>(d)];
          std::vector<std::int64_t> expected;
          std::int64_t my_index = 0;
          for (std::int64_t i = 0; i < gsize; ++i) {
            Shape c = coord;
            std::int64_t rem = i;
            for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
              c[static_cast<std::size_t>(*it)] = rem % shape[static_cast<std::size_t>(*it)];
              rem /= shape[static_cast<std::size_t>(*it)];
            }
            if (c == coord) my_index = i;
            expected.push_back(ravel_index(c, shape));
          }
          Communicator& g = mesh.group_comm(dims);
          EXPECT_R(&mesh.group_comm(dims) == &g, "group_comm({}) is cached", fmt::join(dims, ","));
          EXPECT_R(g.size() == gsize && g.rank() == my_index, "group_comm({}) size {} rank {}", fmt::join(dims, ","),
                   g.size(), g.rank());
          std::vector<std::int64_t> got(static_cast<std::size_t>(g.size()));
          g.all_gather(&me, got.data(), sizeof(me));
          EXPECT_R(got == expected, "group_comm({}) members {} expected {}", fmt::join(dims, ","), fmt::join(got, ","),
                   fmt::join(expected, ","));
          if (dims.size() == 1) EXPECT_R(&mesh.dim_comm(dims[0]) == &g, "dim_comm is group_comm of one dim");
          if (!dims.empty()) {
            std::vector<std::string> sub_names;
            for (int d : dims) sub_names.push_back(names[static_cast<std::size_t>(d)]);
            DeviceMesh sub = mesh.submesh(sub_names);
            EXPECT_R(&sub.comm() == &g && sub.rank() == my_index, "submesh comm");
            EXPECT_R(sub.dim_names() == sub_names && sub.ndim() == static_cast<int>(dims.size()), "submesh names");
            for (std::size_t i = 0; i < dims.size(); ++i) {
              EXPECT_R(sub.size(static_cast<int>(i)) == shape[static_cast<std::size_t>(dims[i])], "submesh shape");
              EXPECT_R(sub.coordinate()[i] == coord[static_cast<std::size_t>(dims[i])], "submesh coordinate");
              EXPECT_R(&sub.dim_comm(static_cast<int>(i)) == &mesh.dim_comm(dims[i]), "submesh dim_comm");
            }
            EXPECT_R(sub.rank_of(sub.coordinate()) == sub.rank(), "submesh rank_of");
          }
        }
        DeviceMesh copy = mesh;
        EXPECT_R(copy == mesh && &copy.dim_comm(0) == &mesh.dim_comm(0), "copies share state");
        EXPECT_R(fmt::format("{}", mesh) ==
                     fmt::format("DeviceMesh({}, dims={})", fmt::join(shape, "x"), fmt::join(names, ",")),
                 "format {}", mesh);
        // Dim comms carry data: a sum along every dim.
        for (int m = 0; m < ndim; ++m) {
          std::int64_t x = rank, s = 0;
          mesh.dim_comm(m).all_reduce(&x, &s, 1, DType::Int64, ReduceOp::Sum);
          std::int64_t want = 0;
          for (std::int64_t i = 0; i < shape[static_cast<std::size_t>(m)]; ++i) {
            Shape c = coord;
            c[static_cast<std::size_t>(m)] = i;
            want += ravel_index(c, shape);
          }
          EXPECT_R(s == want, "dim {} sum {} expected {}", m, s, want);
        }
      });
      failures.report();
    }
  }
}

BOOST_AUTO_TEST_CASE(mesh_errors_name_the_bad_value) {
  Failures failures(8);
  run_threads(8, [&](Communicator& world) {
    const int rank = world.rank();
    auto expect_error = [&](auto&& fn, std::string_view needle) {
      if (auto problem = throw_problem<MeshError>(fn, {needle, "[mesh]"})) failures.add(rank, *problem);
    };
    expect_error([&] { DeviceMesh(world, {2, 3}); }, "shape 2x3 has 6 ranks but the world has 8");
    expect_error([&] { DeviceMesh(world, {}); }, "0 dims; expected 1 to 4");
    expect_error([&] { DeviceMesh(world, {1, 2, 1, 2, 2}); }, "5 dims; expected 1 to 4");
    expect_error([&] { DeviceMesh(world, {8, 0}); }, "size 0 in dim 1");
    expect_error([&] { DeviceMesh(world, {2, 4}, {"dp"}); }, "1 dim names (dp) for the 2-d shape 2x4");
    expect_error([&] { DeviceMesh(world, {2, 4}, {"dp", ""}); }, "dim name 1 of (dp,) is empty");
    expect_error([&] { DeviceMesh(world, {2, 4}, {"tp", "tp"}); }, "'tp' is repeated");
    DeviceMesh mesh(world, {2, 4}, {"dp", "tp"});
    expect_error([&] { mesh.dim_index("pp"); }, "no dim named 'pp'; the mesh has dims dp,tp");
    expect_error([&] { mesh.dim_comm(2); }, "mesh dim 2 out of range");
    expect_error([&] { mesh.size(-1); }, "mesh dim -1 out of range");
    expect_error([&] { mesh.group_comm(std::vector<int>{1, 1}); }, "mesh dim 1 is listed twice");
    expect_error([&] { mesh.coordinate_of(8); }, "rank 8 is not in the mesh 2x4");
    expect_error([&] { mesh.rank_of(std::vector<std::int64_t>{1, 4}); }, "outside the mesh 2x4 in dim 1");
    expect_error([&] { mesh.submesh({"tp", "pp"}); }, "no dim named 'pp'");
    expect_error([&] { DeviceMesh(world, {8}).dim_index("x"); }, "has no dim names");
    // The mesh is still usable, and a submesh formats with its own names.
    auto tp = mesh.submesh({"tp"});
    EXPECT_R(fmt::format("{}", tp) == "DeviceMesh(4, dims=tp)", "format {}", tp);
    EXPECT_R(fmt::format("{}", DeviceMesh(world, {8})) == "DeviceMesh(8)", "unnamed format");
    EXPECT_R(!(tp == mesh) && tp == mesh.submesh({"tp"}), "equality");
  });
  failures.report();
}

BOOST_AUTO_TEST_SUITE_END()
