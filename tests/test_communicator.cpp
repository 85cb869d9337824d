// The threads communicator and DeviceMesh: values of every collective over
// world sizes 1-8 (uneven and zero sizes, every dtype and reduce op, in
// place), the exact byte accounting of the header's contract, sub-groups via
// split and DeviceMesh, and the failure modes (mismatch, a failing rank,
// timeouts, bad meshes).
//
// Boost.Test assertions are not thread-safe, so ranks collect failures into a
// per-rank list and the test thread reports them after run_threads returns.
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "checks.h"

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
namespace bdata = boost::unit_test::data;

// Named (not anonymous) so that test-case lambdas may capture these types
// without -Wsubobject-linkage.
namespace comm_test {

const std::vector<int> kWorldSizes{1, 2, 3, 4, 6, 8};
constexpr DType kDTypes[] = {DType::Float32, DType::Float64, DType::Int64};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};

// Failures found on rank threads, reported on the test thread.
class Failures {
 public:
  explicit Failures(int n) : per_rank_(static_cast<std::size_t>(n)) {}
  void add(int rank, std::string msg) {
    auto& list = per_rank_[static_cast<std::size_t>(rank)];
    if (list.size() < 10) list.push_back(std::move(msg));
  }
  void report() const {
    for (std::size_t r = 0; r < per_rank_.size(); ++r)
      for (const auto& msg : per_rank_[r]) BOOST_ERROR("rank " << r << ": " << msg);
  }

 private:
  std::vector<std::vector<std::string>> per_rank_;
};

#define EXPECT_R(cond, ...)                                                                          \
  do {                                                                                               \
    if (!(cond)) failures.add(rank, fmt::format("{}:{}: {}: ", __FILE__, __LINE__, #cond) + fmt::format(__VA_ARGS__)); \
  } while (0)

// Small integers: sums are exact in every dtype and any order, so results
// compare bitwise.
double value(std::uint64_t seed, int rank, std::size_t i) {
  return static_cast<double>(static_cast<std::int64_t>((seed * 7919 + static_cast<std::uint64_t>(rank) * 131 + i * 31) % 19) - 9);
}

template <class T>
void fill(std::vector<std::byte>& buf, std::size_t count, std::uint64_t seed, int rank) {
  buf.resize(count * sizeof(T));
  auto* p = reinterpret_cast<T*>(buf.data());
  for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<T>(value(seed, rank, i));
}

template <class T>
T reduce_expected(ReduceOp op, int n, std::uint64_t seed, std::size_t i) {
  T acc = static_cast<T>(value(seed, 0, i));
  for (int r = 1; r < n; ++r) {
    const T v = static_cast<T>(value(seed, r, i));
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
    }
  }
  if (op == ReduceOp::Avg) acc /= static_cast<T>(n);
  return acc;
}

std::size_t seg_size(std::size_t count, int n, int r) {
  return count / static_cast<std::size_t>(n) + (static_cast<std::size_t>(r) < count % static_cast<std::size_t>(n) ? 1 : 0);
}


bool contains(std::string_view text, std::string_view needle) { return text.find(needle) != std::string_view::npos; }

std::vector<std::size_t> random_sizes(std::mt19937_64& rng, int n, std::size_t max) {
  std::vector<std::size_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = (rng() % 4 == 0) ? 0 : rng() % (max + 1);
  return v;
}

}  // namespace comm_test
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
  BOOST_TEST(d.recv_bytes_by_kind[static_cast<int>(CollectiveKind::AllReduce)] == 3u);
}

BOOST_AUTO_TEST_CASE(world_size_must_be_positive) {
  check_throws<ValueError>([] { run_threads(0, [](Communicator&) {}); }, "world_size 0");
  check_throws<ValueError>([] { run_threads(-2, [](Communicator&) {}); }, "world_size -2");
}

BOOST_DATA_TEST_CASE(all_reduce_values_and_bytes, bdata::make(kWorldSizes), n) {
  const std::uint64_t seed = 1000 + static_cast<std::uint64_t>(n);
  BOOST_TEST_CONTEXT("world " << n << " seed " << seed) {
    Failures failures(n);
    run_threads(n, [&](Communicator& comm) {
      const int rank = comm.rank();
      EXPECT_R(comm.size() == n, "size {}", comm.size());
      EXPECT_R(comm.backend() == "threads", "backend {}", comm.backend());
      std::vector<std::byte> send, recv;
      std::uint64_t case_seed = seed;
      // 25000 spans several reduce blocks per segment; only a few cases.
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(n - 1),
                                static_cast<std::size_t>(3 * n + 1), std::size_t{1000}, std::size_t{25000}}) {
        for (DType dtype : kDTypes) {
          for (ReduceOp op : kOps) {
            if (count == 25000 && (dtype != DType::Float64 || op == ReduceOp::Min || op == ReduceOp::Avg)) continue;
            for (bool in_place : {false, true}) {
              ++case_seed;
              visit_dtype(dtype, [&](auto zero) {
                using T = decltype(zero);
                fill<T>(send, count, case_seed, rank);
                recv.assign(count * sizeof(T), std::byte{0x7f});
                const CommStats before = comm.stats();
                void* out = in_place ? send.data() : recv.data();
                comm.all_reduce(send.data(), out, count, dtype, op);
                const CommStats diff = comm.stats() - before;
                const auto* got = static_cast<const T*>(out);
                const std::string what = fmt::format("all_reduce count {} {} {} in_place {} seed {}", count, dtype,
                                                     op, in_place, case_seed);
                for (std::size_t i = 0; i < count; ++i) {
                  const T want = reduce_expected<T>(op, n, case_seed, i);
                  if (got[i] != want) {
                    failures.add(rank, fmt::format("{}: element {} is {}, expected {}", what, i, got[i], want));
                    break;
                  }
                }
                const std::size_t seg = seg_size(count, n, rank);
                const std::uint64_t bytes = ((n - 1) * seg + (count - seg)) * sizeof(T);
                EXPECT_R(diff.recv_bytes == bytes, "{}: recv_bytes {} expected {}", what, diff.recv_bytes, bytes);
                EXPECT_R(diff.count(CollectiveKind::AllReduce) == 1 && diff.data_collectives() == 1, "{}: calls",
                         what);
              });
            }
          }
        }
      }
    });
    failures.report();
  }
}

BOOST_DATA_TEST_CASE(all_gather_uneven_and_zero, bdata::make(kWorldSizes), n) {
  const std::uint64_t seed = 2000 + static_cast<std::uint64_t>(n);
  BOOST_TEST_CONTEXT("world " << n << " seed " << seed) {
    Failures failures(n);
    std::mt19937_64 rng(seed);
    std::vector<std::vector<std::size_t>> cases;
    for (int c = 0; c < 12; ++c) cases.push_back(random_sizes(rng, n, 64));
    cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 0));
    run_threads(n, [&](Communicator& comm) {
      const int rank = comm.rank();
      for (std::size_t c = 0; c < cases.size(); ++c) {
        const auto& sizes = cases[c];
        std::vector<std::uint8_t> send(sizes[static_cast<std::size_t>(rank)]);
        for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<std::uint8_t>(rank * 37 + i + c);
        const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
        std::vector<std::uint8_t> recv(total, 0xee);
        const CommStats before = comm.stats();
        comm.all_gather(send.data(), recv.data(), sizes);
        const CommStats diff = comm.stats() - before;
        std::size_t off = 0;
        for (int p = 0; p < n; ++p) {
          for (std::size_t i = 0; i < sizes[static_cast<std::size_t>(p)]; ++i)
            EXPECT_R(recv[off + i] == static_cast<std::uint8_t>(p * 37 + i + c), "case {} from rank {} byte {}", c,
                     p, i);
          off += sizes[static_cast<std::size_t>(p)];
        }
        const std::size_t expected = total - sizes[static_cast<std::size_t>(rank)];
        EXPECT_R(diff.recv_bytes == expected, "case {} recv_bytes {} expected {}", c, diff.recv_bytes, expected);
      }
      // Equal-size overload, in place (send is this rank's block of recv).
      std::vector<double> recv(static_cast<std::size_t>(3 * n));
      for (int i = 0; i < 3; ++i) recv[static_cast<std::size_t>(3 * rank + i)] = rank * 10 + i;
      const CommStats before = comm.stats();
      comm.all_gather(recv.data() + 3 * rank, recv.data(), 3 * sizeof(double));
      for (int p = 0; p < n; ++p)
        for (int i = 0; i < 3; ++i)
          EXPECT_R(recv[static_cast<std::size_t>(3 * p + i)] == p * 10 + i, "equal-size block {} {}", p, i);
      EXPECT_R((comm.stats() - before).recv_bytes == (n - 1) * 3 * sizeof(double), "equal-size bytes");
    });
    failures.report();
  }
}

BOOST_DATA_TEST_CASE(reduce_scatter_values_and_bytes, bdata::make(kWorldSizes), n) {
  const std::uint64_t seed = 3000 + static_cast<std::uint64_t>(n);
  BOOST_TEST_CONTEXT("world " << n << " seed " << seed) {
    Failures failures(n);
    std::mt19937_64 rng(seed);
    std::vector<std::vector<std::size_t>> cases;
    for (int c = 0; c < 4; ++c) cases.push_back(random_sizes(rng, n, 50));
    cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 0));
    cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 20000));  // several reduce blocks
    run_threads(n, [&](Communicator& comm) {
      const int rank = comm.rank();
      std::vector<std::byte> send, recv;
      std::uint64_t case_seed = seed;
      for (std::size_t c = 0; c < cases.size(); ++c) {
        const auto& counts = cases[c];
        const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
        std::size_t my_off = 0;
        for (int p = 0; p < rank; ++p) my_off += counts[static_cast<std::size_t>(p)];
        const std::size_t mine = counts[static_cast<std::size_t>(rank)];
        for (DType dtype : kDTypes) {
          for (ReduceOp op : kOps) {
            for (bool alias : {false, true}) {
              ++case_seed;
              visit_dtype(dtype, [&](auto zero) {
                using T = decltype(zero);
                fill<T>(send, total, case_seed, rank);
                recv.assign(mine * sizeof(T), std::byte{0});
                // alias: recv is this rank's own block of send.
                T* out = alias ? reinterpret_cast<T*>(send.data()) + my_off : reinterpret_cast<T*>(recv.data());
                const CommStats before = comm.stats();
                comm.reduce_scatter(send.data(), out, counts, dtype, op);
                const CommStats diff = comm.stats() - before;
                const std::string what =
                    fmt::format("case {} {} {} alias {} seed {}", c, dtype, op, alias, case_seed);
                for (std::size_t i = 0; i < mine; ++i) {
                  const T want = reduce_expected<T>(op, n, case_seed, my_off + i);
                  if (out[i] != want) {
                    failures.add(rank, fmt::format("{}: element {} is {}, expected {}", what, i, out[i], want));
                    break;
                  }
                }
                const std::uint64_t bytes = (n - 1) * mine * sizeof(T);
                EXPECT_R(diff.recv_bytes == bytes, "{}: recv_bytes {} expected {}", what, diff.recv_bytes, bytes);
              });
            }
          }
        }
      }
    });
    failures.report();
  }
}

BOOST_DATA_TEST_CASE(all_to_all_broadcast_scatter, bdata::make(kWorldSizes), n) {
  const std::uint64_t seed = 4000 + static_cast<std::uint64_t>(n);
  BOOST_TEST_CONTEXT("world " << n << " seed " << seed) {
    Failures failures(n);
    std::mt19937_64 rng(seed);
    // sizes[c][p][q]: bytes rank p sends to rank q in case c.
    std::vector<std::vector<std::vector<std::size_t>>> a2a;
    for (int c = 0; c < 6; ++c) {
      std::vector<std::vector<std::size_t>> m;
      for (int p = 0; p < n; ++p) m.push_back(random_sizes(rng, n, 40));
      a2a.push_back(std::move(m));
    }
    std::vector<std::vector<std::size_t>> scatter_cases;
    for (int c = 0; c < 4; ++c) scatter_cases.push_back(random_sizes(rng, n, 30));
    auto byte_of = [](int src, int dst, std::size_t i, std::size_t c) {
      return static_cast<std::uint8_t>(src * 53 + dst * 11 + i * 3 + c);
    };
    run_threads(n, [&](Communicator& comm) {
      const int rank = comm.rank();
      const auto r = static_cast<std::size_t>(rank);
      for (std::size_t c = 0; c < a2a.size(); ++c) {
        const auto& m = a2a[c];
        std::vector<std::size_t> sb(static_cast<std::size_t>(n)), so(sb.size()), rb(sb.size()), ro(sb.size());
        // Send blocks in reverse rank order with gaps, to exercise offsets.
        std::size_t off = 0;
        for (int q = n - 1; q >= 0; --q) {
          const auto qq = static_cast<std::size_t>(q);
          sb[qq] = m[r][qq];
          so[qq] = off;
          off += sb[qq] + 1;
        }
        std::vector<std::uint8_t> send(off + 1);
        for (int q = 0; q < n; ++q)
          for (std::size_t i = 0; i < sb[static_cast<std::size_t>(q)]; ++i)
            send[so[static_cast<std::size_t>(q)] + i] = byte_of(rank, q, i, c);
        off = 0;
        std::size_t expected = 0;
        for (int p = 0; p < n; ++p) {
          const auto pp = static_cast<std::size_t>(p);
          rb[pp] = m[pp][r];
          ro[pp] = off;
          off += rb[pp];
          if (p != rank) expected += rb[pp];
        }
        std::vector<std::uint8_t> recv(off + 1, 0xee);
        const CommStats before = comm.stats();
        comm.all_to_all(send.data(), sb, so, recv.data(), rb, ro);
        const CommStats diff = comm.stats() - before;
        for (int p = 0; p < n; ++p)
          for (std::size_t i = 0; i < rb[static_cast<std::size_t>(p)]; ++i)
            EXPECT_R(recv[ro[static_cast<std::size_t>(p)] + i] == byte_of(p, rank, i, c), "a2a case {} from {} byte {}",
                     c, p, i);
        EXPECT_R(diff.recv_bytes == expected, "a2a case {} recv_bytes {} expected {}", c, diff.recv_bytes, expected);
      }
      for (int root = 0; root < n; ++root) {
        for (std::size_t bytes : {std::size_t{0}, std::size_t{13}, std::size_t{100000}}) {
          std::vector<std::uint8_t> buf(bytes);
          for (std::size_t i = 0; i < bytes; ++i)
            buf[i] = rank == root ? static_cast<std::uint8_t>(root + i * 7) : std::uint8_t{0};
          const CommStats before = comm.stats();
          comm.broadcast(buf.data(), bytes, root);
          const CommStats diff = comm.stats() - before;
          for (std::size_t i = 0; i < bytes; ++i)
            if (buf[i] != static_cast<std::uint8_t>(root + i * 7)) {
              failures.add(rank, fmt::format("broadcast root {} bytes {}: byte {} wrong", root, bytes, i));
              break;
            }
          const std::uint64_t want = rank == root ? 0 : bytes;
          EXPECT_R(diff.recv_bytes == want, "broadcast root {} recv_bytes {} expected {}", root, diff.recv_bytes, want);
        }
        for (std::size_t c = 0; c < scatter_cases.size(); ++c) {
          const auto& sizes = scatter_cases[c];
          const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
          std::vector<std::uint8_t> send;
          if (rank == root) {
            send.resize(total);
            for (std::size_t i = 0; i < total; ++i) send[i] = static_cast<std::uint8_t>(i * 5 + c + root);
          }
          std::vector<std::uint8_t> recv(sizes[r]);
          std::size_t my_off = 0;
          for (int p = 0; p < rank; ++p) my_off += sizes[static_cast<std::size_t>(p)];
          const CommStats before = comm.stats();
          comm.scatter(rank == root ? send.data() : nullptr, sizes, recv.data(), root);
          const CommStats diff = comm.stats() - before;
          for (std::size_t i = 0; i < recv.size(); ++i)
            EXPECT_R(recv[i] == static_cast<std::uint8_t>((my_off + i) * 5 + c + root), "scatter root {} case {}", root,
                     c);
          const std::uint64_t want = rank == root ? 0 : sizes[r];
          EXPECT_R(diff.recv_bytes == want, "scatter root {} case {} recv_bytes {} expected {}", root, c,
                   diff.recv_bytes, want);
        }
      }
      const CommStats before = comm.stats();
      comm.barrier();
      const CommStats diff = comm.stats() - before;
      EXPECT_R(diff.count(CollectiveKind::Barrier) == 1 && diff.recv_bytes == 0 && diff.data_collectives() == 0,
               "barrier stats");
    });
    failures.report();
  }
}

BOOST_DATA_TEST_CASE(send_recv_ring, bdata::make(kWorldSizes), n) {
  BOOST_TEST_CONTEXT("world " << n) {
    Failures failures(n);
    run_threads(n, [&](Communicator& comm) {
      const int rank = comm.rank();
      const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      // Two tags sent in one order, received in the other.
      std::vector<std::int64_t> a(5, rank), b(3, rank * 100);
      comm.send(a.data(), a.size() * 8, next, 1);
      comm.send(b.data(), b.size() * 8, next, 2);
      std::vector<std::int64_t> ra(5), rb(3);
      const CommStats before = comm.stats();
      comm.recv(rb.data(), rb.size() * 8, prev, 2);
      comm.recv(ra.data(), ra.size() * 8, prev, 1);
      const CommStats diff = comm.stats() - before;
      EXPECT_R(ra == std::vector<std::int64_t>(5, prev), "tag 1 payload");
      EXPECT_R(rb == std::vector<std::int64_t>(3, prev * 100), "tag 2 payload");
      EXPECT_R(diff.recv_bytes == 64 && diff.count(CollectiveKind::SendRecv) == 2, "recv bytes {}", diff.recv_bytes);
      // A size mismatch names both sizes.
      comm.send(a.data(), 16, next, 7);
      try {
        comm.recv(ra.data(), 24, prev, 7);
        failures.add(rank, "size mismatch did not throw");
      } catch (const CommError& e) {
        EXPECT_R(contains(e.what(), "24") && contains(e.what(), "16"), "message: {}", e.what());
      }
      comm.barrier();
    });
    failures.report();
  }
}

BOOST_DATA_TEST_CASE(split_groups_and_shared_stats, bdata::make(kWorldSizes), n) {
  BOOST_TEST_CONTEXT("world " << n) {
    Failures failures(n);
    run_threads(n, [&](Communicator& comm) {
      const int rank = comm.rank();
      // Colors rank % 2, ordered by descending rank.
      auto sub = comm.split(rank % 2, -rank);
      std::vector<int> members;
      for (int p = n - 1; p >= 0; --p)
        if (p % 2 == rank % 2) members.push_back(p);
      const int my_index = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
      EXPECT_R(sub && sub->size() == static_cast<int>(members.size()), "sub size");
      EXPECT_R(sub->rank() == my_index, "sub rank {} expected {}", sub->rank(), my_index);
      EXPECT_R(&sub->stats() == &comm.stats(), "stats are shared per process rank");
      // all_gather of world ranks gives the members in key order.
      std::vector<std::int64_t> got(members.size());
      const std::int64_t me = rank;
      sub->all_gather(&me, got.data(), sizeof(me));
      EXPECT_R(std::equal(got.begin(), got.end(), members.begin()), "sub order {}", fmt::join(got, ","));
      // Collectives on the two halves interleave with the world's.
      double x = rank, sum = 0;
      sub->all_reduce(&x, &sum, 1, DType::Float64, ReduceOp::Sum);
      comm.barrier();
      EXPECT_R(sum == std::accumulate(members.begin(), members.end(), 0.0), "sub sum {}", sum);
      // A nested split, and a rank that opts out.
      auto nested = sub->split(sub->rank() == 0 ? -1 : 0, 0);
      EXPECT_R((sub->rank() == 0) == (nested == nullptr), "opt-out gives nullptr");
      if (nested) {
        EXPECT_R(nested->size() == sub->size() - 1, "nested size");
        nested->barrier();
      }
      const CommStats before = comm.stats();
      auto solo = comm.split(rank, 0);
      double y = 5, z = 0;
      solo->all_reduce(&y, &z, 1, DType::Float64, ReduceOp::Avg);
      std::int64_t g = 0;
      solo->all_gather(&me, &g, sizeof(me));
      const CommStats diff = comm.stats() - before;
      EXPECT_R(solo->size() == 1 && z == 5 && g == rank, "group of one");
      EXPECT_R(diff.recv_bytes == 0 && diff.count(CollectiveKind::Split) == 1 && diff.data_collectives() == 2,
               "group of one receives nothing");
    });
    failures.report();
  }
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
      BOOST_TEST(elapsed < 5.0);
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
  BOOST_TEST(elapsed < 3.0);
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
  return {{1, {1}},       {1, {1, 1}},    {2, {2}},       {2, {1, 2}},    {2, {2, 1}},       {3, {3}},
          {3, {1, 3}},    {4, {4}},       {4, {2, 2}},    {4, {1, 4}},    {6, {2, 3}},       {6, {3, 2}},
          {6, {1, 2, 3}}, {8, {8}},       {8, {2, 4}},    {8, {2, 2, 2}}, {8, {2, 2, 2, 1}}, {8, {1, 2, 2, 2}}};
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
        for (int p = 0; p < n; ++p)
          EXPECT_R(mesh.rank_of(mesh.coordinate_of(p)) == p, "round trip {}", p);
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
          EXPECT_R(got == expected, "group_comm({}) members {} expected {}", fmt::join(dims, ","),
                   fmt::join(got, ","), fmt::join(expected, ","));
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
      try {
        fn();
        failures.add(rank, fmt::format("no MeshError for '{}'", needle));
      } catch (const MeshError& e) {
        EXPECT_R(contains(e.what(), needle), "message '{}' lacks '{}'", e.what(), needle);
        EXPECT_R(contains(e.what(), "[mesh]"), "message '{}' lacks the origin", e.what());
      }
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
