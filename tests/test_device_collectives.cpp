// Collectives on device buffers: every collective of the interface, with
// values staged through device memory, the exact byte accounting of
// communicator.h, point to point with tags, split and the argument checks,
// run twice: over an NCCL local group of all visible GPUs (one thread per
// device; one GPU gives a group of one), and over four simulated GPU ranks
// (the threads backend sharing one GPU). Also NCCL's own: its bootstraps'
// checks and a timeout that breaks the communicator (two GPUs or more).
// Cases that need a GPU are skipped, and counted as skipped, in a build
// without CUDA/NCCL or on a machine without a device; what the build says
// about NCCL is checked everywhere.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <exception>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include <fmt/ranges.h>

#include "comm_checks.h"
#include "dtensor/core/cuda.h"
#include "dtensor/core/half.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/threads.h"
#include "support.h"

using namespace dtensor;
using namespace comm_test;
namespace utf = boost::unit_test;

namespace nccl_test {

boost::test_tools::assertion_result has_nccl_device(utf::test_unit_id) {
  boost::test_tools::assertion_result ok(nccl_available() && cuda::device_count() > 0);
  if (!nccl_available())
    ok.message() << "this build has no NCCL";
  else if (cuda::device_count() == 0)
    ok.message() << "no CUDA device";
  return ok;
}

boost::test_tools::assertion_result has_two_devices(utf::test_unit_id id) {
  auto ok = has_nccl_device(id);
  if (ok && cuda::device_count() < 2) {
    ok = false;
    ok.message() << "needs two CUDA devices, found " << cuda::device_count();
  }
  return ok;
}

std::vector<int> all_devices() {
  std::vector<int> devices(static_cast<std::size_t>(cuda::device_count()));
  std::iota(devices.begin(), devices.end(), 0);
  return devices;
}

// Runs fn(comm) on one thread per communicator of `comms`, each on its own
// device, and ends each communicator on its thread (the ranks finalize
// together); an exception on a rank becomes a failure of that rank.
void run_on(std::vector<std::unique_ptr<Communicator>>& comms, const std::vector<int>& devices, Failures& failures,
            const std::function<void(Communicator&)>& fn) {
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < comms.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        cuda::set_device(devices[i]);
        fn(*comms[i]);
        comms[i].reset();
      } catch (const std::exception& e) {
        failures.add(static_cast<int>(i), fmt::format("threw: {}", e.what()));
      }
    });
  for (auto& t : threads) t.join();
}

// fn over a fresh local group of every device.
void run_group(Failures& failures, const std::function<void(Communicator&)>& fn,
               std::chrono::milliseconds timeout = std::chrono::milliseconds(60'000)) {
  const auto devices = all_devices();
  auto comms = nccl_local_group(devices, NcclOptions{timeout});
  run_on(comms, devices, failures, fn);
}

// Where the device-buffer collective checks run: an NCCL local group of
// every GPU, or four simulated GPU ranks (threads sharing device 0).
struct Engine {
  std::string backend;
  int n;
  std::function<void(Failures&, const std::function<void(Communicator&)>&)> run;
};

Engine nccl_engine() {
  return {"nccl", cuda::device_count(),
          [](Failures& failures, const std::function<void(Communicator&)>& fn) { run_group(failures, fn); }};
}

Engine simulated_engine() {
  return {"threads", 4, [](Failures& failures, const std::function<void(Communicator&)>& fn) {
            ThreadsOptions options;
            options.device = Device::CUDA;
            try {
              run_threads(
                  4,
                  [&](Communicator& comm) {
                    try {
                      fn(comm);
                    } catch (const std::exception& e) {
                      failures.add(comm.rank(), fmt::format("threw: {}", e.what()));
                      throw;
                    }
                  },
                  options);
            } catch (const RankFailed&) {
              // recorded on the rank above
            }
          }};
}

// Device memory with host staging.
struct DeviceBuffer {
  std::shared_ptr<std::byte[]> mem;
  std::size_t bytes = 0;
  explicit DeviceBuffer(std::size_t n) : mem(cuda::allocate(std::max<std::size_t>(n, 1))), bytes(n) {}
  std::byte* data() { return mem.get(); }
  void upload(const void* src, std::size_t n, std::size_t offset = 0) {
    if (n > 0) cuda::copy(mem.get() + offset, Device::CUDA, src, Device::CPU, n);
  }
  template <class T>
  std::vector<T> download(std::size_t offset_bytes, std::size_t count) {
    std::vector<T> out(count);
    if (count > 0) cuda::copy(out.data(), Device::CPU, mem.get() + offset_bytes, Device::CUDA, count * sizeof(T));
    return out;
  }
};

template <class T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer d(v.size() * sizeof(T));
  d.upload(v.data(), d.bytes);
  return d;
}

}  // namespace nccl_test

using namespace nccl_test;

// The checks both engines run, each a function of the engine.
namespace device_collectives {

void all_reduce_values_and_bytes(const Engine& engine) {
  const int n = engine.n;
  Failures failures(n);
  engine.run(failures, [&](Communicator& comm) {
    const int rank = comm.rank();
    EXPECT_R(comm.size() == n && comm.backend() == engine.backend, "size {} backend {}", comm.size(), comm.backend());
    std::uint64_t seed = 7000;
    const auto odd = static_cast<std::size_t>(3 * n + 1);
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, odd, std::size_t{25000}}) {
      for (DType dtype : {DType::Float32, DType::Float64, DType::Int64, DType::BFloat16, DType::Float16}) {
        for (ReduceOp op : kOps) {
          const bool half = dtype == DType::BFloat16 || dtype == DType::Float16;
          if (half && op == ReduceOp::Avg) continue;  // rounding of the division is the kernel's
          for (bool in_place : {false, true}) {
            ++seed;
            visit_any_dtype(dtype, [&](auto zero) {
              using T = decltype(zero);
              std::vector<T> host(count);
              for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<T>(value(seed, rank, i));
              DeviceBuffer send = upload(host);
              DeviceBuffer recv(count * sizeof(T));
              const CommStats before = comm.stats();
              std::byte* out = in_place ? send.data() : recv.data();
              comm.all_reduce(send.data(), out, count, dtype, op);
              const CommStats diff = comm.stats() - before;
              const auto got = (in_place ? send : recv).template download<T>(0, count);
              const std::string what =
                  fmt::format("all_reduce count {} {} {} in_place {} seed {}", count, dtype, op, in_place, seed);
              for (std::size_t i = 0; i < count; ++i) {
                // Small integers: exact in every dtype.
                double want = 0;
                if constexpr (std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>)
                  want = reduce_expected<double>(op, n, seed, i);
                else
                  want = static_cast<double>(reduce_expected<T>(op, n, seed, i));
                const double have = static_cast<double>(static_cast<float>(got[i]));
                if (have != want) {
                  failures.add(rank, fmt::format("{}: element {} is {}, expected {}", what, i, have, want));
                  break;
                }
              }
              const std::size_t seg = seg_size(count, n, rank);
              const std::uint64_t bytes = n == 1 ? 0 : ((n - 1) * seg + (count - seg)) * sizeof(T);
              EXPECT_R(diff.recv_bytes == bytes && diff.count(CollectiveKind::AllReduce) == 1 &&
                           diff.data_collectives() == 1,
                       "{}: recv_bytes {} expected {}", what, diff.recv_bytes, bytes);
            });
          }
        }
      }
    }
  });
  failures.report();
}

void all_gather_uneven_equal_and_in_place(const Engine& engine) {
  const int n = engine.n;
  Failures failures(n);
  std::mt19937_64 rng(8000);
  std::vector<std::vector<std::size_t>> cases;
  for (int c = 0; c < 6; ++c) cases.push_back(random_sizes(rng, n, 64));
  cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 0));
  cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 40000));
  cases.push_back(random_sizes(rng, n, 90000));
  engine.run(failures, [&](Communicator& comm) {
    const int rank = comm.rank();
    for (std::size_t c = 0; c < cases.size(); ++c) {
      const auto& sizes = cases[c];
      std::vector<std::uint8_t> mine(sizes[static_cast<std::size_t>(rank)]);
      for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<std::uint8_t>(rank * 37 + i + c);
      DeviceBuffer send = upload(mine);
      const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
      DeviceBuffer recv(total);
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
    DeviceBuffer buf = upload(host);
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

void reduce_scatter_values_and_bytes(const Engine& engine) {
  const int n = engine.n;
  Failures failures(n);
  std::mt19937_64 rng(9000);
  std::vector<std::vector<std::size_t>> cases;
  for (int c = 0; c < 3; ++c) cases.push_back(random_sizes(rng, n, 50));
  cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 0));
  cases.push_back(std::vector<std::size_t>(static_cast<std::size_t>(n), 20000));
  cases.push_back(random_sizes(rng, n, 30000));
  engine.run(failures, [&](Communicator& comm) {
    const int rank = comm.rank();
    std::uint64_t seed = 9000;
    for (std::size_t c = 0; c < cases.size(); ++c) {
      const auto& counts = cases[c];
      const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
      std::size_t my_off = 0;
      for (int p = 0; p < rank; ++p) my_off += counts[static_cast<std::size_t>(p)];
      const std::size_t mine = counts[static_cast<std::size_t>(rank)];
      for (DType dtype : kDTypes) {
        for (ReduceOp op : kOps) {
          for (bool alias : {false, true}) {
            ++seed;
            visit_any_dtype(dtype, [&](auto zero) {
              using T = decltype(zero);
              std::vector<T> host(total);
              for (std::size_t i = 0; i < total; ++i) host[i] = static_cast<T>(value(seed, rank, i));
              DeviceBuffer send = upload(host);
              DeviceBuffer recv(mine * sizeof(T));
              // alias: recv is this rank's own block of send.
              std::byte* out = alias ? send.data() + my_off * sizeof(T) : recv.data();
              const CommStats before = comm.stats();
              comm.reduce_scatter(send.data(), out, counts, dtype, op);
              const CommStats diff = comm.stats() - before;
              const auto got = alias ? send.download<T>(my_off * sizeof(T), mine) : recv.download<T>(0, mine);
              const std::string what = fmt::format("case {} {} {} alias {} seed {}", c, dtype, op, alias, seed);
              for (std::size_t i = 0; i < mine; ++i) {
                const T want = reduce_expected<T>(op, n, seed, my_off + i);
                if (!same_value(got[i], want)) {
                  failures.add(rank, fmt::format("{}: element {} is {}, expected {}", what, i, shown(got[i]),
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

void all_to_all_broadcast_scatter_barrier(const Engine& engine) {
  const int n = engine.n;
  Failures failures(n);
  std::mt19937_64 rng(10000);
  std::vector<std::vector<std::vector<std::size_t>>> a2a;  // [case][src][dst] bytes
  for (int c = 0; c < 4; ++c) {
    std::vector<std::vector<std::size_t>> m;
    for (int p = 0; p < n; ++p) m.push_back(random_sizes(rng, n, c == 3 ? 40000 : 40));
    a2a.push_back(std::move(m));
  }
  std::vector<std::vector<std::size_t>> scatter_cases;
  for (int c = 0; c < 3; ++c) scatter_cases.push_back(random_sizes(rng, n, c == 2 ? 50000 : 30));
  auto byte_of = [](int src, int dst, std::size_t i, std::size_t c) {
    return static_cast<std::uint8_t>(src * 53 + dst * 11 + i * 3 + c);
  };
  engine.run(failures, [&](Communicator& comm) {
    const int rank = comm.rank();
    const auto r = static_cast<std::size_t>(rank);
    for (std::size_t c = 0; c < a2a.size(); ++c) {
      const auto& m = a2a[c];
      const auto nn = static_cast<std::size_t>(n);
      std::vector<std::size_t> sb(nn), so(nn), rb(nn), ro(nn);
      std::size_t off = 0;
      for (int q = n - 1; q >= 0; --q) {  // reverse order with gaps
        const auto qq = static_cast<std::size_t>(q);
        sb[qq] = m[r][qq];
        so[qq] = off;
        off += sb[qq] + 1;
      }
      std::vector<std::uint8_t> host(off + 1);
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < sb[static_cast<std::size_t>(q)]; ++i)
          host[so[static_cast<std::size_t>(q)] + i] = byte_of(rank, q, i, c);
      DeviceBuffer send = upload(host);
      off = 0;
      std::size_t expected = 0;
      for (std::size_t p = 0; p < nn; ++p) {
        rb[p] = m[p][r];
        ro[p] = off;
        off += rb[p];
        if (p != r) expected += rb[p];
      }
      DeviceBuffer recv(off);
      const CommStats before = comm.stats();
      comm.all_to_all(send.data(), sb, so, recv.data(), rb, ro);
      const CommStats diff = comm.stats() - before;
      const auto got = recv.download<std::uint8_t>(0, off);
      for (int p = 0; p < n; ++p)
        for (std::size_t i = 0; i < rb[static_cast<std::size_t>(p)]; ++i)
          if (got[ro[static_cast<std::size_t>(p)] + i] != byte_of(p, rank, i, c)) {
            failures.add(rank, fmt::format("a2a case {} from {} byte {} wrong", c, p, i));
            break;
          }
      EXPECT_R(diff.recv_bytes == expected, "a2a case {} recv_bytes {} expected {}", c, diff.recv_bytes, expected);
    }
    for (int root = 0; root < n; ++root) {
      for (std::size_t bytes : {std::size_t{0}, std::size_t{13}, std::size_t{100000}}) {
        std::vector<std::uint8_t> host(bytes);
        for (std::size_t i = 0; i < bytes; ++i) host[i] = rank == root ? static_cast<std::uint8_t>(root + i * 7) : 0;
        DeviceBuffer buf = upload(host);
        const CommStats before = comm.stats();
        comm.broadcast(buf.data(), bytes, root);
        const CommStats diff = comm.stats() - before;
        const auto got = buf.download<std::uint8_t>(0, bytes);
        for (std::size_t i = 0; i < bytes; ++i)
          if (got[i] != static_cast<std::uint8_t>(root + i * 7)) {
            failures.add(rank, fmt::format("broadcast root {} bytes {}: byte {} wrong", root, bytes, i));
            break;
          }
        const std::uint64_t want = rank == root || n == 1 ? 0 : bytes;
        EXPECT_R(diff.recv_bytes == want, "broadcast root {} recv_bytes {} expected {}", root, diff.recv_bytes, want);
      }
      for (std::size_t c = 0; c < scatter_cases.size(); ++c) {
        const auto& sizes = scatter_cases[c];
        const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
        std::vector<std::uint8_t> host(rank == root ? total : 0);
        for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::uint8_t>(i * 5 + c + root);
        DeviceBuffer send = upload(host);
        DeviceBuffer recv(sizes[r]);
        std::size_t my_off = 0;
        for (int p = 0; p < rank; ++p) my_off += sizes[static_cast<std::size_t>(p)];
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

void send_recv_tags_and_size_mismatch(const Engine& engine) {
  const int n = engine.n;
  Failures failures(n);
  engine.run(failures, [&](Communicator& comm) {
    const int rank = comm.rank();
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    // A send is a rendezvous on NCCL: even ranks send first, odd ranks
    // receive first (a group of one sends to itself, which is buffered).
    const bool send_first = rank % 2 == 0;
    DeviceBuffer a = upload(std::vector<std::int64_t>(5, rank)), b = upload(std::vector<std::int64_t>(3, rank * 100));
    DeviceBuffer ra(5 * 8), rb(3 * 8);
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
    EXPECT_R(diff.recv_bytes == 64 && diff.count(CollectiveKind::SendRecv) == 2, "recv bytes {}", diff.recv_bytes);
    // A size mismatch names both sizes, and the message is consumed.
    auto mismatch = [&] {
      try {
        comm.recv(ra.data(), 24, prev, 7);
        failures.add(rank, "size mismatch did not throw");
      } catch (const CommError& e) {
        EXPECT_R(contains(e.what(), "24") && contains(e.what(), "16") && contains(e.what(), "[" + engine.backend + "]"), "message: {}",
                 e.what());
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

void argument_checks(const Engine& engine) {
  const int n = engine.n;
  Failures failures(n);
  engine.run(failures, [&](Communicator& comm) {
    const int rank = comm.rank();
    DeviceBuffer buf(64);
    const std::vector<std::size_t> wrong(static_cast<std::size_t>(n + 1), 0);
    auto expect_value_error = [&](std::string_view what, std::string_view needle, const std::function<void()>& fn) {
      try {
        fn();
        failures.add(rank, fmt::format("{} did not throw", what));
      } catch (const ValueError& e) {
        EXPECT_R(contains(e.what(), "[" + engine.backend + "]") && contains(e.what(), needle), "{}: {}", what, e.what());
      }
    };
    expect_value_error("all_gather entries", "recv_bytes has", [&] { comm.all_gather(buf.data(), buf.data(), wrong); });
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

void split_groups_and_shared_stats(const Engine& engine) {
  const int n = engine.n;
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
    EXPECT_R(sub->size() == static_cast<int>(members.size()) && sub->rank() == my_index, "sub rank {} of {}",
             sub->rank(), sub->size());
    EXPECT_R(&sub->stats() == &comm.stats(), "stats are shared per process rank");
    DeviceBuffer me = upload(std::vector<std::int64_t>{rank});
    DeviceBuffer all(members.size() * 8);
    sub->all_gather(me.data(), all.data(), 8);
    const auto got = all.download<std::int64_t>(0, members.size());
    EXPECT_R(std::equal(got.begin(), got.end(), members.begin()), "sub order {}", fmt::join(got, ","));
    comm.barrier();
    auto nested = sub->split(sub->rank() == 0 ? -1 : 0, 0);
    EXPECT_R((sub->rank() == 0) == (nested == nullptr), "opt-out gives nullptr");
    if (nested) nested->barrier();
    const CommStats before = comm.stats();
    auto solo = comm.split(rank, 0);
    DeviceBuffer y = upload(std::vector<double>{5.0}), z(8);
    solo->all_reduce(y.data(), z.data(), 1, DType::Float64, ReduceOp::Avg);
    const CommStats diff = comm.stats() - before;
    EXPECT_R(solo->size() == 1 && z.download<double>(0, 1)[0] == 5.0, "group of one");
    EXPECT_R(diff.recv_bytes == 0 && diff.count(CollectiveKind::Split) == 1 && diff.data_collectives() == 1,
             "group of one receives nothing");
  });
  failures.report();
}

}  // namespace device_collectives

#define DEVICE_COLLECTIVE_CASES(make_engine)                                                          \
  BOOST_AUTO_TEST_CASE(all_reduce_values_and_bytes) {                                                 \
    device_collectives::all_reduce_values_and_bytes(make_engine());                                   \
  }                                                                                                   \
  BOOST_AUTO_TEST_CASE(all_gather_uneven_equal_and_in_place) {                                        \
    device_collectives::all_gather_uneven_equal_and_in_place(make_engine());                          \
  }                                                                                                   \
  BOOST_AUTO_TEST_CASE(reduce_scatter_values_and_bytes) {                                             \
    device_collectives::reduce_scatter_values_and_bytes(make_engine());                               \
  }                                                                                                   \
  BOOST_AUTO_TEST_CASE(all_to_all_broadcast_scatter_barrier) {                                        \
    device_collectives::all_to_all_broadcast_scatter_barrier(make_engine());                          \
  }                                                                                                   \
  BOOST_AUTO_TEST_CASE(send_recv_tags_and_size_mismatch) {                                            \
    device_collectives::send_recv_tags_and_size_mismatch(make_engine());                              \
  }                                                                                                   \
  BOOST_AUTO_TEST_CASE(argument_checks) { device_collectives::argument_checks(make_engine()); }       \
  BOOST_AUTO_TEST_CASE(split_groups_and_shared_stats) {                                               \
    device_collectives::split_groups_and_shared_stats(make_engine());                                 \
  }

BOOST_AUTO_TEST_SUITE(nccl)

BOOST_AUTO_TEST_CASE(availability_matches_the_build) {
  if (!nccl_available()) {
    BOOST_TEST(nccl_version() == 0);
    BOOST_CHECK_EXCEPTION(nccl_world(), UnsupportedError,
                          [](const UnsupportedError& e) { return contains(e.what(), "[nccl] nccl_world"); });
    const std::vector<int> devices{0};
    BOOST_CHECK_EXCEPTION(nccl_local_group(devices), UnsupportedError,
                          [](const UnsupportedError& e) { return contains(e.what(), "[nccl] nccl_local_group"); });
    return;
  }
  BOOST_TEST(cuda::built());
  BOOST_TEST(nccl_version() > 0);
  if (cuda::device_count() == 0) {
    const std::vector<int> devices{0};
    BOOST_CHECK_THROW(nccl_local_group(devices), Error);
  }
}

BOOST_AUTO_TEST_CASE(local_group_argument_checks, *utf::precondition(has_nccl_device)) {
  const int count = cuda::device_count();
  BOOST_CHECK_EXCEPTION(nccl_local_group(std::vector<int>{}), ValueError,
                        [](const ValueError& e) { return contains(e.what(), "no devices"); });
  BOOST_CHECK_EXCEPTION(nccl_local_group(std::vector<int>{count}), ValueError, [&](const ValueError& e) {
    return contains(e.what(), fmt::format("device {} is not one of the {}", count, count));
  });
  BOOST_CHECK_EXCEPTION(nccl_local_group(std::vector<int>{0, 0}), ValueError,
                        [](const ValueError& e) { return contains(e.what(), "listed twice"); });
}

BOOST_AUTO_TEST_CASE(timeout_breaks_the_communicator, *utf::precondition(has_two_devices)) {
  const int n = cuda::device_count();
  Failures failures(n);
  const auto devices = all_devices();
  auto comms = nccl_local_group(devices, NcclOptions{std::chrono::milliseconds(2000)});
  run_on(comms, devices, failures, [&](Communicator& comm) {
    const int rank = comm.rank();
    if (rank != 0) return;  // rank 0 waits for peers that never come
    try {
      comm.barrier();
      failures.add(rank, "a barrier without peers did not time out");
    } catch (const CommTimeout& e) {
      EXPECT_R(contains(e.what(), "[nccl] barrier on rank 0") && contains(e.what(), "2000 ms"), "message: {}",
               e.what());
    }
    try {
      comm.barrier();
      failures.add(rank, "a broken communicator accepted a call");
    } catch (const CommError& e) {
      EXPECT_R(contains(e.what(), "unusable"), "message: {}", e.what());
    }
  });
  failures.report();
}

BOOST_AUTO_TEST_SUITE(local_group, *utf::precondition(has_nccl_device))
DEVICE_COLLECTIVE_CASES(nccl_engine)
BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE_END()

// The same checks on four simulated GPU ranks (the threads backend on device
// buffers): the reference semantics, on the GPU.
BOOST_AUTO_TEST_SUITE(simulated_gpu_ranks, *utf::precondition(testing::needs_gpu))
DEVICE_COLLECTIVE_CASES(simulated_engine)
BOOST_AUTO_TEST_SUITE_END()

