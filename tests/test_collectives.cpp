// Every collective of the Communicator interface on the backend under test
// (thread ranks, or the processes of an MPI job: tests/meson.build runs this
// suite both ways): values over world sizes 1-8 with uneven and zero sizes,
// every dtype and reduce op, in place; the exact byte accounting of the
// interface's contract; point to point; sub-groups via split.
#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "comm_checks.h"
#include "support.h"

using namespace dtensor;
namespace bdata = boost::unit_test::data;
using namespace comm_test;

namespace {
// Under MPI only the job's own size runs.
std::vector<int> runnable_sizes() {
  std::vector<int> out;
  for (int n : kWorldSizes)
    if (testing::can_run(n)) out.push_back(n);
  return out;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(collectives)

BOOST_DATA_TEST_CASE(all_reduce_values_and_bytes, bdata::make(runnable_sizes()), n) {
  const std::uint64_t seed = 1000 + static_cast<std::uint64_t>(n);
  BOOST_TEST_CONTEXT("world " << n << " seed " << seed) {
    Failures failures(n);
    testing::run_ranks(n, [&](Communicator& comm) {
      const int rank = comm.rank();
      EXPECT_R(comm.size() == n, "size {}", comm.size());
      EXPECT_R(comm.backend() == testing::test_backend(), "backend {}", comm.backend());
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
              visit_any_dtype(dtype, [&](auto zero) {
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
                  if (!same_value(got[i], want)) {
                    failures.add(rank, fmt::format("{}: element {} is {}, expected {}", what, i, shown(got[i]),
                                                   shown(want)));
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

BOOST_DATA_TEST_CASE(all_gather_uneven_and_zero, bdata::make(runnable_sizes()), n) {
  const std::uint64_t seed = 2000 + static_cast<std::uint64_t>(n);
  BOOST_TEST_CONTEXT("world " << n << " seed " << seed) {
    Failures failures(n);
    std::mt19937_64 rng(seed);
    std::vector<std::vector<std::size_t>> cases;
    for (int c = 0; c < 12; ++c) cases.push_back(random_sizes(rng, n, 64));
    cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 0));
    // Large calls take another path on MPI (a barrier, then the blocking
    // call; equal blocks as MPI_Allgather).
    cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 40000));
    cases.push_back(random_sizes(rng, n, 90000));
    testing::run_ranks(n, [&](Communicator& comm) {
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

BOOST_DATA_TEST_CASE(reduce_scatter_values_and_bytes, bdata::make(runnable_sizes()), n) {
  const std::uint64_t seed = 3000 + static_cast<std::uint64_t>(n);
  BOOST_TEST_CONTEXT("world " << n << " seed " << seed) {
    Failures failures(n);
    std::mt19937_64 rng(seed);
    std::vector<std::vector<std::size_t>> cases;
    for (int c = 0; c < 4; ++c) cases.push_back(random_sizes(rng, n, 50));
    cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 0));
    cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 20000));  // several reduce blocks
    cases.push_back(random_sizes(rng, n, 30000));  // large and uneven
    testing::run_ranks(n, [&](Communicator& comm) {
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
              visit_any_dtype(dtype, [&](auto zero) {
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
                  if (!same_value(out[i], want)) {
                    failures.add(rank, fmt::format("{}: element {} is {}, expected {}", what, i, shown(out[i]),
                                                   shown(want)));
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

BOOST_DATA_TEST_CASE(all_to_all_broadcast_scatter, bdata::make(runnable_sizes()), n) {
  const std::uint64_t seed = 4000 + static_cast<std::uint64_t>(n);
  BOOST_TEST_CONTEXT("world " << n << " seed " << seed) {
    Failures failures(n);
    std::mt19937_64 rng(seed);
    // sizes[c][p][q]: bytes rank p sends to rank q in case c.
    std::vector<std::vector<std::vector<std::size_t>>> a2a;
    for (int c = 0; c < 6; ++c) {
      std::vector<std::vector<std::size_t>> m;
      // Case 4 is regular (equal blocks in rank order: MPI_Alltoall on MPI),
      // case 5 large.
      for (int p = 0; p < n; ++p)
        m.push_back(c == 4 ? std::vector<std::size_t>(static_cast<std::size_t>(n), 24)
                           : random_sizes(rng, n, c == 5 ? 40000 : 40));
      a2a.push_back(std::move(m));
    }
    std::vector<std::vector<std::size_t>> scatter_cases;
    for (int c = 0; c < 4; ++c) scatter_cases.push_back(random_sizes(rng, n, c == 3 ? 50000 : 30));
    auto byte_of = [](int src, int dst, std::size_t i, std::size_t c) {
      return static_cast<std::uint8_t>(src * 53 + dst * 11 + i * 3 + c);
    };
    testing::run_ranks(n, [&](Communicator& comm) {
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

BOOST_DATA_TEST_CASE(send_recv_ring, bdata::make(runnable_sizes()), n) {
  BOOST_TEST_CONTEXT("world " << n) {
    Failures failures(n);
    testing::run_ranks(n, [&](Communicator& comm) {
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

BOOST_DATA_TEST_CASE(split_groups_and_shared_stats, bdata::make(runnable_sizes()), n) {
  BOOST_TEST_CONTEXT("world " << n) {
    Failures failures(n);
    testing::run_ranks(n, [&](Communicator& comm) {
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
BOOST_AUTO_TEST_SUITE_END()
