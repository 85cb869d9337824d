// Every collective of the Communicator interface, on whatever Engine a test
// file gives (see collective_cases.h): values over uneven and zero sizes,
// every dtype and reduce op, in place; the exact byte accounting of the
// interface's contract (communicator.h); point to point with tags; the
// argument checks; sub-groups via split.
#include "collective_cases.h"
#include "support.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include <fmt/ranges.h>

#include "dtensor/core/cuda.h"
#include "dtensor/core/half.h"

namespace comm_test {

Buffer::Buffer(Buffers kind, std::size_t bytes) : kind_(kind), bytes_(bytes) {
  const std::size_t size = std::max<std::size_t>(bytes, 1);
  if (kind == Buffers::Host) {
    mem_ = std::shared_ptr<std::byte[]>(new std::byte[size]);
    std::memset(mem_.get(), 0xee, size);
  } else {
    mem_ = cuda::allocate(size);
    const std::vector<std::byte> pattern(size, std::byte{0xee});
    cuda::copy(mem_.get(), Device::CUDA, pattern.data(), Device::CPU, size);
  }
}

void Buffer::upload(const void* src, std::size_t n, std::size_t offset) {
  if (n == 0) return;
  if (kind_ == Buffers::Host)
    std::memcpy(mem_.get() + offset, src, n);
  else
    cuda::copy(mem_.get() + offset, Device::CUDA, src, Device::CPU, n);
}

void Buffer::read(void* dst, std::size_t offset, std::size_t n) const {
  if (n == 0) return;
  if (kind_ == Buffers::Host)
    std::memcpy(dst, mem_.get() + offset, n);
  else
    cuda::copy(dst, Device::CPU, mem_.get() + offset, Device::CUDA, n);
}

namespace {

// Device reductions of the 16-bit types divide in the kernel's own rounding:
// Avg on them is exact only where the host reduces (in float, rounded once).
bool avg_is_exact(const Engine& engine, DType dtype) {
  const bool half = dtype == DType::BFloat16 || dtype == DType::Float16;
  return !half || engine.buffers == Buffers::Host;
}

std::string where(const Engine& engine) {
  return fmt::format("{} on {} buffers, world {}", engine.backend, engine.buffers == Buffers::Host ? "host" : "device",
                     engine.n);
}

}  // namespace

void all_reduce_values_and_bytes(const Engine& engine) {
  const int n = engine.n;
  const std::uint64_t seed = testing::seeded(1000 + static_cast<std::uint64_t>(n));
  BOOST_TEST_CONTEXT(where(engine) << " seed " << seed) {
    Failures failures(n);
    engine.run(failures, [&](Communicator& comm) {
      const int rank = comm.rank();
      EXPECT_R(comm.size() == n, "size {}", comm.size());
      EXPECT_R(comm.backend() == engine.backend, "backend {}", comm.backend());
      std::uint64_t case_seed = seed;
      // 25000 spans several reduce blocks per segment: on the host only a
      // few cases (time), on the device every one (the kernels' block paths).
      constexpr std::size_t kLarge = 25000;
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, static_cast<std::size_t>(n - 1),
                                static_cast<std::size_t>(3 * n + 1), std::size_t{1000}, kLarge}) {
        for (DType dtype : kDTypes) {
          for (ReduceOp op : kOps) {
            if (count == kLarge && engine.buffers == Buffers::Host &&
                (dtype != DType::Float64 || op == ReduceOp::Min || op == ReduceOp::Avg))
              continue;
            if (op == ReduceOp::Avg && !avg_is_exact(engine, dtype)) continue;
            for (bool in_place : {false, true}) {
              ++case_seed;
              visit_any_dtype(dtype, [&](auto zero) {
                using T = decltype(zero);
                std::vector<T> host(count);
                for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<T>(value(case_seed, rank, i));
                Buffer send = upload(engine.buffers, host);
                Buffer recv(engine.buffers, count * sizeof(T));
                const CommStats before = comm.stats();
                std::byte* out = in_place ? send.data() : recv.data();
                comm.all_reduce(send.data(), out, count, dtype, op);
                const CommStats diff = comm.stats() - before;
                const auto got = (in_place ? send : recv).template download<T>(0, count);
                const std::string what =
                    fmt::format("all_reduce count {} {} {} in_place {} seed {}", count, dtype, op, in_place, case_seed);
                for (std::size_t i = 0; i < count; ++i) {
                  const T want = reduce_expected<T>(op, n, case_seed, i);
                  if (!same_value(got[i], want)) {
                    failures.add(rank,
                                 fmt::format("{}: element {} is {}, expected {}", what, i, shown(got[i]), shown(want)));
                    break;
                  }
                }
                // An int64 Avg moves the pairs (x / n, x % n): twice the elements.
                const std::size_t wire = dtype == DType::Int64 && op == ReduceOp::Avg && n > 1 ? 2 * count : count;
                const std::size_t seg = seg_size(wire, n, rank);
                const std::uint64_t bytes = ((n - 1) * seg + (wire - seg)) * sizeof(T);
                EXPECT_R(diff.recv_bytes == bytes, "{}: recv_bytes {} expected {}", what, diff.recv_bytes, bytes);
                EXPECT_R(diff.count(CollectiveKind::AllReduce) == 1 && diff.data_collectives() == 1, "{}: calls", what);
              });
            }
          }
        }
      }
      // The typed form deduces the dtype from the span: an in-place int64 Sum.
      std::vector<std::int64_t> mine(3, rank + 1);
      Buffer typed = upload(engine.buffers, mine);
      const CommStats before = comm.stats();
      comm.all_reduce(std::span(reinterpret_cast<std::int64_t*>(typed.data()), mine.size()), ReduceOp::Sum);
      const CommStats diff = comm.stats() - before;
      const auto got = typed.download<std::int64_t>(0, mine.size());
      const std::int64_t want = static_cast<std::int64_t>(n) * (n + 1) / 2;
      EXPECT_R(got == std::vector<std::int64_t>(3, want), "typed all_reduce: {} expected {}", got[0], want);
      const std::size_t seg = seg_size(3, n, rank);
      const std::uint64_t bytes = ((n - 1) * seg + (3 - seg)) * sizeof(std::int64_t);
      EXPECT_R(diff.count(CollectiveKind::AllReduce) == 1 && diff.recv_bytes == bytes,
               "typed all_reduce: {} calls, {} bytes, expected 1 and {}", diff.count(CollectiveKind::AllReduce),
               diff.recv_bytes, bytes);
    });
    failures.report();
  }
}

void all_gather_uneven_equal_and_in_place(const Engine& engine) {
  const int n = engine.n;
  const std::uint64_t seed = testing::seeded(2000 + static_cast<std::uint64_t>(n));
  BOOST_TEST_CONTEXT(where(engine) << " seed " << seed) {
    Failures failures(n);
    std::mt19937_64 rng(seed);
    std::vector<std::vector<std::size_t>> cases;
    for (int c = 0; c < 12; ++c) cases.push_back(random_sizes(rng, n, 64));
    cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 0));
    // Large calls take another path on MPI (a barrier, then the blocking
    // call; equal blocks as MPI_Allgather).
    cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 40000));
    cases.push_back(random_sizes(rng, n, 90000));
    engine.run(failures, [&](Communicator& comm) {
      const int rank = comm.rank();
      for (std::size_t c = 0; c < cases.size(); ++c) {
        const auto& sizes = cases[c];
        std::vector<std::uint8_t> mine(sizes[static_cast<std::size_t>(rank)]);
        for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<std::uint8_t>(rank * 37 + i + c);
        Buffer send = upload(engine.buffers, mine);
        const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
        Buffer recv(engine.buffers, total);
        const CommStats before = comm.stats();
        comm.all_gather(send.data(), recv.data(), sizes);
        const CommStats diff = comm.stats() - before;
        const auto got = recv.download<std::uint8_t>(0, total);
        std::size_t off = 0;
        for (int p = 0; p < n; ++p) {
          for (std::size_t i = 0; i < sizes[static_cast<std::size_t>(p)]; ++i)
            if (got[off + i] != static_cast<std::uint8_t>(p * 37 + i + c)) {
              failures.add(rank, fmt::format("case {} from rank {} byte {} wrong", c, p, i));
              break;
            }
          off += sizes[static_cast<std::size_t>(p)];
        }
        const std::size_t expected = total - sizes[static_cast<std::size_t>(rank)];
        EXPECT_R(diff.recv_bytes == expected, "case {} recv_bytes {} expected {}", c, diff.recv_bytes, expected);
      }
      // Equal-size overload, in place: send is this rank's block of recv.
      std::vector<double> host(static_cast<std::size_t>(3 * n), -1.0);
      for (int i = 0; i < 3; ++i) host[static_cast<std::size_t>(3 * rank + i)] = rank * 10 + i;
      Buffer buf = upload(engine.buffers, host);
      const CommStats before = comm.stats();
      comm.all_gather(buf.data() + 3 * rank * sizeof(double), buf.data(), 3 * sizeof(double));
      const auto got = buf.download<double>(0, host.size());
      for (int p = 0; p < n; ++p)
        for (int i = 0; i < 3; ++i)
          EXPECT_R(got[static_cast<std::size_t>(3 * p + i)] == p * 10 + i, "equal-size block {} {}", p, i);
      EXPECT_R((comm.stats() - before).recv_bytes == (n - 1) * 3 * sizeof(double), "equal-size bytes");
    });
    failures.report();
  }
}

void reduce_scatter_values_and_bytes(const Engine& engine) {
  const int n = engine.n;
  const std::uint64_t seed = testing::seeded(3000 + static_cast<std::uint64_t>(n));
  BOOST_TEST_CONTEXT(where(engine) << " seed " << seed) {
    Failures failures(n);
    std::mt19937_64 rng(seed);
    std::vector<std::vector<std::size_t>> cases;
    for (int c = 0; c < 4; ++c) cases.push_back(random_sizes(rng, n, 50));
    cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 0));
    cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 20000));  // several reduce blocks
    cases.push_back(random_sizes(rng, n, 30000));                                   // large and uneven
    engine.run(failures, [&](Communicator& comm) {
      const int rank = comm.rank();
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
                std::vector<T> host(total);
                for (std::size_t i = 0; i < total; ++i) host[i] = static_cast<T>(value(case_seed, rank, i));
                Buffer send = upload(engine.buffers, host);
                Buffer recv(engine.buffers, mine * sizeof(T));
                // alias: recv is this rank's own block of send.
                std::byte* out = alias ? send.data() + my_off * sizeof(T) : recv.data();
                const CommStats before = comm.stats();
                comm.reduce_scatter(send.data(), out, counts, dtype, op);
                const CommStats diff = comm.stats() - before;
                const auto got = alias ? send.download<T>(my_off * sizeof(T), mine) : recv.download<T>(0, mine);
                const std::string what = fmt::format("case {} {} {} alias {} seed {}", c, dtype, op, alias, case_seed);
                for (std::size_t i = 0; i < mine; ++i) {
                  const T want = reduce_expected<T>(op, n, case_seed, my_off + i);
                  if (!same_value(got[i], want)) {
                    failures.add(rank,
                                 fmt::format("{}: element {} is {}, expected {}", what, i, shown(got[i]), shown(want)));
                    break;
                  }
                }
                const std::size_t pairs = dtype == DType::Int64 && op == ReduceOp::Avg && n > 1 ? 2 : 1;
                const std::uint64_t bytes = (n - 1) * mine * pairs * sizeof(T);
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

namespace {

// all_to_all with blocks sent in reverse rank order with gaps, to exercise
// the offsets. m[p][q]: bytes rank p sends to rank q.
void check_all_to_all(const Engine& engine, Communicator& comm, Failures& failures,
                      const std::vector<std::vector<std::size_t>>& m, std::size_t c) {
  auto byte_of = [](int src, int dst, std::size_t i, std::size_t cc) {
    return static_cast<std::uint8_t>(src * 53 + dst * 11 + i * 3 + cc);
  };
  const int n = engine.n, rank = comm.rank();
  const auto r = static_cast<std::size_t>(rank), nn = static_cast<std::size_t>(n);
  std::vector<std::size_t> sb(nn), so(nn), rb(nn), ro(nn);
  std::size_t off = 0;
  for (int q = n - 1; q >= 0; --q) {
    const auto qq = static_cast<std::size_t>(q);
    sb[qq] = m[r][qq];
    so[qq] = off;
    off += sb[qq] + 1;
  }
  std::vector<std::uint8_t> host(off + 1);
  for (std::size_t q = 0; q < nn; ++q)
    for (std::size_t i = 0; i < sb[q]; ++i) host[so[q] + i] = byte_of(rank, static_cast<int>(q), i, c);
  Buffer send = upload(engine.buffers, host);
  off = 0;
  std::size_t expected = 0;
  for (std::size_t p = 0; p < nn; ++p) {
    rb[p] = m[p][r];
    ro[p] = off;
    off += rb[p];
    if (p != r) expected += rb[p];
  }
  Buffer recv(engine.buffers, off + 1);
  const CommStats before = comm.stats();
  comm.all_to_all(send.data(), sb, so, recv.data(), rb, ro);
  const CommStats diff = comm.stats() - before;
  const auto got = recv.download<std::uint8_t>(0, off);
  for (std::size_t p = 0; p < nn; ++p)
    for (std::size_t i = 0; i < rb[p]; ++i)
      if (got[ro[p] + i] != byte_of(static_cast<int>(p), rank, i, c)) {
        failures.add(rank, fmt::format("a2a case {} from {} byte {} wrong", c, p, i));
        break;
      }
  EXPECT_R(diff.recv_bytes == expected, "a2a case {} recv_bytes {} expected {}", c, diff.recv_bytes, expected);
}

void check_broadcast(const Engine& engine, Communicator& comm, Failures& failures, int root, std::size_t bytes) {
  const int rank = comm.rank();
  std::vector<std::uint8_t> host(bytes);
  for (std::size_t i = 0; i < bytes; ++i) host[i] = rank == root ? static_cast<std::uint8_t>(root + i * 7) : 0;
  Buffer buf = upload(engine.buffers, host);
  const CommStats before = comm.stats();
  comm.broadcast(buf.data(), bytes, root);
  const CommStats diff = comm.stats() - before;
  const auto got = buf.download<std::uint8_t>(0, bytes);
  for (std::size_t i = 0; i < bytes; ++i)
    if (got[i] != static_cast<std::uint8_t>(root + i * 7)) {
      failures.add(rank, fmt::format("broadcast root {} bytes {}: byte {} wrong", root, bytes, i));
      break;
    }
  const std::uint64_t want = rank == root ? 0 : bytes;
  EXPECT_R(diff.recv_bytes == want, "broadcast root {} recv_bytes {} expected {}", root, diff.recv_bytes, want);
}

void check_scatter(const Engine& engine, Communicator& comm, Failures& failures, int root,
                   const std::vector<std::size_t>& sizes, std::size_t c) {
  const int rank = comm.rank();
  const auto r = static_cast<std::size_t>(rank);
  const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
  std::vector<std::uint8_t> host(rank == root ? total : 0);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::uint8_t>(i * 5 + c + root);
  Buffer send = upload(engine.buffers, host);
  Buffer recv(engine.buffers, sizes[r]);
  std::size_t my_off = 0;
  for (std::size_t p = 0; p < r; ++p) my_off += sizes[p];
  const CommStats before = comm.stats();
  comm.scatter(rank == root ? send.data() : nullptr, sizes, recv.data(), root);
  const CommStats diff = comm.stats() - before;
  const auto got = recv.download<std::uint8_t>(0, sizes[r]);
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != static_cast<std::uint8_t>((my_off + i) * 5 + c + root)) {
      failures.add(rank, fmt::format("scatter root {} case {} byte {} wrong", root, c, i));
      break;
    }
  const std::uint64_t want = rank == root ? 0 : sizes[r];
  EXPECT_R(diff.recv_bytes == want, "scatter root {} case {} recv_bytes {} expected {}", root, c, diff.recv_bytes,
           want);
}

}  // namespace

void all_to_all_broadcast_scatter_barrier(const Engine& engine) {
  const int n = engine.n;
  const std::uint64_t seed = testing::seeded(4000 + static_cast<std::uint64_t>(n));
  BOOST_TEST_CONTEXT(where(engine) << " seed " << seed) {
    Failures failures(n);
    std::mt19937_64 rng(seed);
    std::vector<std::vector<std::vector<std::size_t>>> a2a;  // [case][src][dst] bytes
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
    engine.run(failures, [&](Communicator& comm) {
      const int rank = comm.rank();
      for (std::size_t c = 0; c < a2a.size(); ++c) check_all_to_all(engine, comm, failures, a2a[c], c);
      for (int root = 0; root < n; ++root) {
        for (std::size_t bytes : {std::size_t{0}, std::size_t{13}, std::size_t{100000}})
          check_broadcast(engine, comm, failures, root, bytes);
        for (std::size_t c = 0; c < scatter_cases.size(); ++c)
          check_scatter(engine, comm, failures, root, scatter_cases[c], c);
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

void send_recv_tags_and_size_mismatch(const Engine& engine) {
  const int n = engine.n;
  BOOST_TEST_CONTEXT(where(engine)) {
    Failures failures(n);
    engine.run(failures, [&](Communicator& comm) {
      const int rank = comm.rank();
      const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      // Where sends are buffered (threads, MPI) every rank sends both
      // messages before it receives. Where a send is a rendezvous (NCCL),
      // even ranks send first and odd ranks receive first (a group of one
      // sends to itself, which is buffered).
      const bool send_first = !engine.rendezvous_sends || rank % 2 == 0;
      Buffer a = upload(engine.buffers, std::vector<std::int64_t>(5, rank));
      Buffer b = upload(engine.buffers, std::vector<std::int64_t>(3, rank * 100));
      Buffer ra(engine.buffers, 5 * 8), rb(engine.buffers, 3 * 8);
      CommStats diff;
      auto sends = [&] {
        comm.send(a.data(), 5 * 8, next, 1);
        comm.send(b.data(), 3 * 8, next, 2);
      };
      auto recvs = [&] {
        // Tags received in the other order than sent.
        const CommStats before = comm.stats();
        comm.recv(rb.data(), 3 * 8, prev, 2);
        comm.recv(ra.data(), 5 * 8, prev, 1);
        diff = comm.stats() - before;
      };
      if (send_first) {
        sends();
        recvs();
      } else {
        recvs();
        sends();
      }
      EXPECT_R(ra.download<std::int64_t>(0, 5) == std::vector<std::int64_t>(5, prev), "tag 1 payload");
      EXPECT_R(rb.download<std::int64_t>(0, 3) == std::vector<std::int64_t>(3, prev * 100), "tag 2 payload");
      EXPECT_R(diff.recv_bytes == 64 && diff.count(CollectiveKind::Recv) == 2 &&
                   diff.count(CollectiveKind::Send) == 0 &&
                   diff.bytes_by_kind[static_cast<int>(CollectiveKind::Recv)] == 64,
               "recvs: {}", diff);
      // A size mismatch names both sizes and the backend, and the message is
      // consumed.
      auto mismatch = [&] {
        try {
          comm.recv(ra.data(), 24, prev, 7);
          failures.add(rank, "size mismatch did not throw");
        } catch (const CommError& e) {
          EXPECT_R(contains(e.what(), "24") && contains(e.what(), "16") &&
                       contains(e.what(), "[" + engine.backend + "]"),
                   "message: {}", e.what());
        }
      };
      if (send_first) {
        comm.send(a.data(), 16, next, 7);
        mismatch();
      } else {
        mismatch();
        comm.send(a.data(), 16, next, 7);
      }
      comm.barrier();
    });
    failures.report();
  }
}

void argument_checks(const Engine& engine) {
  const int n = engine.n;
  BOOST_TEST_CONTEXT(where(engine)) {
    Failures failures(n);
    engine.run(failures, [&](Communicator& comm) {
      const int rank = comm.rank();
      Buffer buf(engine.buffers, 64);
      const std::vector<std::size_t> wrong(static_cast<std::size_t>(n + 1), 0);
      auto expect_value_error = [&](std::string_view what, std::string_view needle, const std::function<void()>& fn) {
        try {
          fn();
          failures.add(rank, fmt::format("{} did not throw", what));
        } catch (const ValueError& e) {
          EXPECT_R(contains(e.what(), "[" + engine.backend + "]") && contains(e.what(), needle), "{}: {}", what,
                   e.what());
        }
      };
      const auto unknown = static_cast<DType>(42);
      expect_value_error("all_reduce dtype", "unknown dtype code 42",
                         [&] { comm.all_reduce(buf.data(), buf.data(), 1, unknown, ReduceOp::Sum); });
      expect_value_error("reduce_scatter dtype", "unknown dtype code 42", [&] {
        comm.reduce_scatter(buf.data(), buf.data(), std::vector<std::size_t>(static_cast<std::size_t>(n), 0), unknown,
                            ReduceOp::Sum);
      });
      expect_value_error("all_gather entries", "recv_bytes has",
                         [&] { comm.all_gather(buf.data(), buf.data(), wrong); });
      expect_value_error("reduce_scatter entries", "counts has",
                         [&] { comm.reduce_scatter(buf.data(), buf.data(), wrong, DType::Float32, ReduceOp::Sum); });
      expect_value_error("broadcast root", "root", [&] { comm.broadcast(buf.data(), 8, n); });
      expect_value_error("scatter root", "root", [&] {
        comm.scatter(buf.data(), std::vector<std::size_t>(static_cast<std::size_t>(n), 0), buf.data(), -1);
      });
      expect_value_error("send peer", "send to rank", [&] { comm.send(buf.data(), 8, n, 0); });
      expect_value_error("recv peer", "recv from rank", [&] { comm.recv(buf.data(), 8, -1, 0); });
      std::vector<std::size_t> sb(static_cast<std::size_t>(n), 0), rb(sb.size(), 0), offs(sb.size(), 0);
      sb[static_cast<std::size_t>(rank)] = 8;
      expect_value_error("all_to_all self", "to itself",
                         [&] { comm.all_to_all(buf.data(), sb, offs, buf.data(), rb, offs); });
      // The communicator still works after rejected arguments.
      comm.barrier();
    });
    failures.report();
  }
}

void split_groups_and_shared_stats(const Engine& engine) {
  const int n = engine.n;
  BOOST_TEST_CONTEXT(where(engine)) {
    Failures failures(n);
    engine.run(failures, [&](Communicator& comm) {
      const int rank = comm.rank();
      auto sub = comm.split(rank % 2, -rank);  // colors rank % 2, descending rank
      std::vector<int> members;
      for (int p = n - 1; p >= 0; --p)
        if (p % 2 == rank % 2) members.push_back(p);
      const int my_index = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
      if (!sub) {
        failures.add(rank, "split gave nullptr");
        return;
      }
      EXPECT_R(sub->size() == static_cast<int>(members.size()), "sub size {}", sub->size());
      EXPECT_R(sub->rank() == my_index, "sub rank {} expected {}", sub->rank(), my_index);
      EXPECT_R(&sub->stats() == &comm.stats(), "stats are shared per process rank");
      const CommStats world_own_before = comm.own_stats();
      // all_gather of world ranks gives the members in key order.
      Buffer me = upload(engine.buffers, std::vector<std::int64_t>{rank});
      Buffer all(engine.buffers, members.size() * 8);
      sub->all_gather(me.data(), all.data(), 8);
      const auto got = all.download<std::int64_t>(0, members.size());
      EXPECT_R(std::equal(got.begin(), got.end(), members.begin()), "sub order {}", fmt::join(got, ","));
      // Collectives on the two halves interleave with the world's.
      Buffer x = upload(engine.buffers, std::vector<double>{static_cast<double>(rank)}), sum(engine.buffers, 8);
      sub->all_reduce(x.data(), sum.data(), 1, DType::Float64, ReduceOp::Sum);
      comm.barrier();
      const double total = sum.download<double>(0, 1)[0];
      EXPECT_R(total == std::accumulate(members.begin(), members.end(), 0.0), "sub sum {}", total);
      // Each communicator also counts its own calls apart: the sub's two
      // collectives are not the world's, whose own counters saw the barrier.
      const CommStats& sub_own = sub->own_stats();
      const CommStats world_own = comm.own_stats() - world_own_before;
      EXPECT_R(sub_own.count(CollectiveKind::AllGather) == 1 && sub_own.count(CollectiveKind::AllReduce) == 1 &&
                   sub_own.data_collectives() == 2,
               "sub's own: {}", sub_own);
      EXPECT_R(world_own.data_collectives() == 0 && world_own.count(CollectiveKind::Barrier) == 1, "world's own: {}",
               world_own);
      // A nested split, and a rank that opts out.
      auto nested = sub->split(sub->rank() == 0 ? -1 : 0, 0);
      EXPECT_R((sub->rank() == 0) == (nested == nullptr), "opt-out gives nullptr");
      if (nested) {
        EXPECT_R(nested->size() == sub->size() - 1, "nested size");
        nested->barrier();
      }
      const CommStats before = comm.stats();
      auto solo = comm.split(rank, 0);
      Buffer y = upload(engine.buffers, std::vector<double>{5.0}), z(engine.buffers, 8);
      solo->all_reduce(y.data(), z.data(), 1, DType::Float64, ReduceOp::Avg);
      Buffer g(engine.buffers, 8);
      solo->all_gather(me.data(), g.data(), 8);
      const CommStats diff = comm.stats() - before;
      EXPECT_R(solo->size() == 1 && z.download<double>(0, 1)[0] == 5.0 && g.download<std::int64_t>(0, 1)[0] == rank,
               "group of one");
      EXPECT_R(diff.recv_bytes == 0 && diff.count(CollectiveKind::Split) == 1 && diff.data_collectives() == 2,
               "group of one receives nothing");
    });
    failures.report();
  }
}

}  // namespace comm_test
