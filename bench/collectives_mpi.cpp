// The MPI mode of bench/collectives: under mpirun, each collective of the
// dtensor MPI communicator is timed next to the bare MPI call it stands for,
// on the same buffers:
//   all_gather      MPI_Allgather (in place)
//   all_reduce      MPI_Allreduce
//   reduce_scatter  MPI_Reduce_scatter_block
//   all_to_all      MPI_Alltoall
// With --variants two more columns time the backend's first design, kept to
// show why it changed: the nonblocking call (MPI_Iallgatherv,
// MPI_Iallreduce, MPI_Ireduce_scatter, MPI_Ialltoallv) completed by MPI_Wait,
// and the same call polled by MPI_Test with a sched_yield after 64 spins. A
// gap between the blocking call and "I+wait" is MPI's slower nonblocking
// algorithm; a gap between "I+wait" and "I+poll" is the cost of yielding.
// The backend now takes the blocking call after a polled barrier for calls
// of 64 KiB and more, and yields only when ranks outnumber cores.
//
// Each repetition runs every variant once, in an order that rotates from one
// repetition to the next, so that all see the same machine load and none is
// always first after the barrier. A variant's time in a repetition is the
// slowest rank's, from leaving a barrier to the return of its call; the
// table shows the median (or with --best the fastest) over the repetitions
// after warm-up. Bandwidth is nccl-tests' bus bandwidth, as in threads mode.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "collective_table.h"
#include "collectives_mpi.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/backends.h"

namespace dtensor::bench {
namespace {

using Clock = std::chrono::steady_clock;

using dtensor::bench::bus_factor;
using dtensor::bench::Coll;
using dtensor::bench::kColls;
using dtensor::bench::name;

void check_mpi(int rc, std::string_view call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw CommError(
      fmt::format("[collectives] {} failed: {}", call, std::string_view(text, static_cast<std::size_t>(len))));
}

// The backend's completion loop (mesh/src/mpi/mpi_communicator.cpp, wait/idle)
// without its deadline check, which costs a clock read every 64 spins only.
void poll_like_backend(MPI_Request& req) {
  for (int spins = 0;; ++spins) {
    int flag = 0;
    check_mpi(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) return;
    if (spins >= 64) sched_yield();
  }
}

struct Buffer {
  explicit Buffer(std::size_t bytes) : data(new std::byte[std::max<std::size_t>(bytes, 64)]) {
    std::memset(data.get(), 0, std::max<std::size_t>(bytes, 64));  // first touch before timing
  }
  std::unique_ptr<std::byte[]> data;
  std::byte* get() { return data.get(); }
};

// One collective at one size, in every variant, over the same buffers.
struct Case {
  std::function<void()> bare;                 // the blocking MPI call
  std::function<void(MPI_Request&)> start;    // the backend's nonblocking call
  std::function<void()> after_start = [] {};  // the backend's work between start and wait
  std::function<void()> dtensor;              // the communicator call
};

struct Row {
  Coll coll;
  int n;
  std::size_t bytes;
  std::vector<double> seconds;  // per variant: bare, dtensor, arrival[, I+wait, I+poll]
};

class Bench {
 public:
  Bench(Communicator& comm, MPI_Comm bare_comm, const MpiCollectivesOptions& opt)
      : comm_(comm), bare_comm_(bare_comm), opt_(opt), n_(comm.size()), rank_(comm.rank()) {}

  std::vector<Row> run() {
    std::vector<Row> rows;
    for (std::size_t mib = 1; mib <= opt_.max_mib; mib *= 4)
      for (Coll c : kColls) rows.push_back(measure(c, mib << 20));
    return rows;
  }

 private:
  // One collective at `s` bytes, every variant timed on the same buffers.
  Row measure(Coll c, std::size_t s) {
    const auto n = static_cast<std::size_t>(n_);
    const std::size_t block = s / n / 4 * 4;  // whole f32 elements per rank
    const std::size_t total = block * n;
    Buffer send(total), recv(total);
    const Case k = make_case(c, block, send.get(), recv.get());
    const std::vector<std::function<void()>> variants = variants_of(k);
    const int reps = opt_.reps > 0 ? opt_.reps : (s >= (64u << 20) ? 5 : 9);
    const int warmup = s >= (64u << 20) ? 1 : 2;
    const std::vector<double> times = time_variants(variants, warmup, reps);
    return summarize(c, total, times, variants.size(), reps);
  }

  // The calls of one collective, `block` bytes per rank, on `send` and
  // `recv` (each n * block bytes).
  Case make_case(Coll c, std::size_t block, std::byte* send, std::byte* recv) {
    switch (c) {
      case Coll::AllGather: return all_gather_case(block, recv);
      case Coll::AllReduce: return all_reduce_case(block, send, recv);
      case Coll::ReduceScatter: return reduce_scatter_case(block, send, recv);
      case Coll::AllToAll: return all_to_all_case(block, send, recv);
    }
    throw ValueError("[collectives] unknown collective");
  }

  Case all_gather_case(std::size_t block, std::byte* recv) {
    const auto n = static_cast<std::size_t>(n_);
    Case k;
    // In place, as DTensor's all-gathers are: this rank's block already
    // sits in its slot of the output.
    std::byte* mine = recv + block * static_cast<std::size_t>(rank_);
    const int count = static_cast<int>(block);
    std::vector<int> counts(n, count), displs(n);
    for (std::size_t p = 0; p < n; ++p) displs[p] = static_cast<int>(block * p);
    k.bare = [=, this] {
      check_mpi(MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, recv, count, MPI_BYTE, bare_comm_), "MPI_Allgather");
    };
    k.start = [=, this](MPI_Request& req) {
      check_mpi(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, recv, counts.data(), displs.data(), MPI_BYTE, bare_comm_,
                                &req),
                "MPI_Iallgatherv");
    };
    k.dtensor = [=, this] { comm_.all_gather(mine, recv, block); };
    return k;
  }

  Case all_reduce_case(std::size_t block, std::byte* send, std::byte* recv) {
    const std::size_t total = block * static_cast<std::size_t>(n_);
    Case k;
    const int count = static_cast<int>(total / 4);
    k.bare = [=, this] {
      check_mpi(MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, bare_comm_), "MPI_Allreduce");
    };
    k.start = [=, this](MPI_Request& req) {
      check_mpi(MPI_Iallreduce(send, recv, count, MPI_FLOAT, MPI_SUM, bare_comm_, &req), "MPI_Iallreduce");
    };
    k.dtensor = [=, this] { comm_.all_reduce(send, recv, total / 4, DType::Float32, ReduceOp::Sum); };
    return k;
  }

  Case reduce_scatter_case(std::size_t block, std::byte* send, std::byte* recv) {
    const auto n = static_cast<std::size_t>(n_);
    Case k;
    const int count = static_cast<int>(block / 4);
    std::vector<int> counts(n, count);
    std::vector<std::size_t> elems(n, block / 4);
    k.bare = [=, this] {
      check_mpi(MPI_Reduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM, bare_comm_),
                "MPI_Reduce_scatter_block");
    };
    k.start = [=, this](MPI_Request& req) {
      check_mpi(MPI_Ireduce_scatter(send, recv, counts.data(), MPI_FLOAT, MPI_SUM, bare_comm_, &req),
                "MPI_Ireduce_scatter");
    };
    k.dtensor = [=, this] { comm_.reduce_scatter(send, recv, elems, DType::Float32, ReduceOp::Sum); };
    return k;
  }

  Case all_to_all_case(std::size_t block, std::byte* send, std::byte* recv) {
    const auto n = static_cast<std::size_t>(n_);
    Case k;
    const int count = static_cast<int>(block);
    // The backend leaves its own block out of MPI and copies it itself.
    std::vector<int> counts(n, count), displs(n);
    for (std::size_t p = 0; p < n; ++p) displs[p] = static_cast<int>(block * p);
    counts[static_cast<std::size_t>(rank_)] = 0;
    std::vector<std::size_t> bytes(n, block), offsets(n);
    for (std::size_t p = 0; p < n; ++p) offsets[p] = block * p;
    const std::size_t self = block * static_cast<std::size_t>(rank_);
    k.bare = [=, this] {
      check_mpi(MPI_Alltoall(send, count, MPI_BYTE, recv, count, MPI_BYTE, bare_comm_), "MPI_Alltoall");
    };
    k.start = [=, this](MPI_Request& req) {
      check_mpi(MPI_Ialltoallv(send, counts.data(), displs.data(), MPI_BYTE, recv, counts.data(), displs.data(),
                               MPI_BYTE, bare_comm_, &req),
                "MPI_Ialltoallv");
    };
    k.after_start = [=] { std::memcpy(recv + self, send + self, block); };
    k.dtensor = [=, this] { comm_.all_to_all(send, bytes, offsets, recv, bytes, offsets); };
    return k;
  }

  // What is timed for one case: the bare call, the communicator's call, its
  // barrier and (with --variants) the nonblocking call completed by MPI_Wait
  // and by the backend's polling loop. They refer to `k`, which must outlive
  // them.
  std::vector<std::function<void()>> variants_of(const Case& k) {
    // The communicator's barrier is one arrival and nothing else: the most
    // the mismatch check can add to a call (the arrival's signature table
    // is the check; large calls paid the same round trip before, as their
    // deadline barrier).
    std::vector<std::function<void()>> variants = {k.bare, k.dtensor, [this] { comm_.barrier(); }};
    if (opt_.variants) {
      variants.push_back([&k] {
        MPI_Request req;
        k.start(req);
        k.after_start();
        check_mpi(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
      });
      variants.push_back([&k] {
        MPI_Request req;
        k.start(req);
        k.after_start();
        poll_like_backend(req);
      });
    }
    return variants;
  }

  // Runs every variant warmup + reps times, in an order that rotates from
  // one repetition to the next, each after a barrier. Returns the slowest
  // rank's seconds of each timed repetition r and variant v at r * nv + v.
  std::vector<double> time_variants(const std::vector<std::function<void()>>& variants, int warmup, int reps) {
    const std::size_t nv = variants.size();
    std::vector<double> times(static_cast<std::size_t>(reps) * nv);
    for (int i = 0; i < warmup + reps; ++i) {
      for (std::size_t j = 0; j < nv; ++j) {
        const std::size_t v = (j + static_cast<std::size_t>(i)) % nv;
        check_mpi(MPI_Barrier(bare_comm_), "MPI_Barrier");
        const auto t0 = Clock::now();
        variants[v]();
        const double t = std::chrono::duration<double>(Clock::now() - t0).count();
        if (i >= warmup) times[static_cast<std::size_t>(i - warmup) * nv + v] = t;
      }
    }
    // The slowest rank decides when a collective is done.
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, times.data(), static_cast<int>(times.size()), MPI_DOUBLE, MPI_MAX,
                            bare_comm_),
              "MPI_Allreduce");
    return times;
  }

  // The table's row: per variant the median (or with --best the fastest)
  // of its repetitions.
  Row summarize(Coll c, std::size_t total, const std::vector<double>& times, std::size_t nv, int reps) const {
    Row row{c, n_, total, {}};
    for (std::size_t v = 0; v < nv; ++v) {
      std::vector<double> per_variant;
      for (int r = 0; r < reps; ++r) per_variant.push_back(times[static_cast<std::size_t>(r) * nv + v]);
      std::sort(per_variant.begin(), per_variant.end());
      row.seconds.push_back(opt_.best ? per_variant.front() : per_variant[per_variant.size() / 2]);
    }
    return row;
  }

  Communicator& comm_;
  MPI_Comm bare_comm_;
  const MpiCollectivesOptions& opt_;
  int n_;
  int rank_;
};

void print(const std::vector<Row>& rows, bool variants) {
  fmt::print("{:<15} {:>5} {:>6} {:>9} {:>9} {:>8} {:>5} {:>8} {:>5}", "collective", "ranks", "size", "MPI", "dtensor",
             "dtensor/", "goal", "arrival/", "goal");
  if (variants) fmt::print(" {:>9} {:>9}", "I+wait", "I+poll");
  fmt::print("\n{:<15} {:>5} {:>6} {:>9} {:>9} {:>8} {:>5} {:>8} {:>5}", "", "", "MiB", "GB/s", "GB/s", "MPI", ">=.95",
             "call", "<.05");
  if (variants) fmt::print(" {:>9} {:>9}", "GB/s", "GB/s");
  fmt::print("\n");
  for (Coll c : kColls) {
    for (const Row& row : rows) {
      if (row.coll != c) continue;
      const double s = static_cast<double>(row.bytes);
      auto busbw = [&](double t) { return s / t / 1e9 * bus_factor(c, row.n); };
      const double ratio = row.seconds[0] / row.seconds[1];
      const double check_share = row.seconds[2] / row.seconds[1];
      fmt::print("{:<15} {:>5} {:>6.0f} {:>9.2f} {:>9.2f} {:>8.3f} {:>5} {:>8.3f} {:>5}", name(c), row.n, s / (1 << 20),
                 busbw(row.seconds[0]), busbw(row.seconds[1]), ratio, ratio >= 0.95 ? "yes" : "MISS", check_share,
                 check_share < 0.05 ? "yes" : "MISS");
      if (variants) fmt::print(" {:>9.2f} {:>9.2f}", busbw(row.seconds[3]), busbw(row.seconds[4]));
      fmt::print("\n");
    }
  }
}

}  // namespace

int run_mpi_collectives(const MpiCollectivesOptions& options) {
  std::unique_ptr<Communicator> world;
  try {
    world = mpi_world();
  } catch (const std::exception& e) {
    fmt::print(stderr, "[collectives] cannot start MPI: {}\n", e.what());
    return 2;
  }
  try {
    // A separate communicator for the bare calls, so that their traffic can
    // never match the backend's.
    MPI_Comm bare_comm;
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &bare_comm), "MPI_Comm_dup");
    int processor_len = 0;
    char processor[MPI_MAX_PROCESSOR_NAME];
    MPI_Get_processor_name(processor, &processor_len);
    if (world->rank() == 0) {
      fmt::print("MPI backend collectives: {} processes on {}, dtensor communicator vs bare MPI on the same buffers\n",
                 world->size(), std::string_view(processor, static_cast<std::size_t>(processor_len)));
      fmt::print(
          "S: all_gather output (in place), reduce_scatter input, all_reduce buffer, all_to_all per-rank send; "
          "f32 sum\n");
      fmt::print("MPI: MPI_Allgather, MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Alltoall (blocking)\n");
      if (options.variants)
        fmt::print(
            "I+wait / I+poll: the backend's nonblocking call (Iallgatherv, Iallreduce, Ireduce_scatter, "
            "Ialltoallv) completed by MPI_Wait / by an MPI_Test+sched_yield loop (the backend's first design)\n");
      fmt::print(
          "bus bandwidth = S/t * (n-1)/n (all_gather, reduce_scatter, all_to_all), S/t * 2(n-1)/n (all_reduce)\n");
      fmt::print(
          "arrival/call: the communicator's barrier (one arrival, the signature exchange that checks every call) "
          "over the dtensor call: the most the mismatch check can cost it\n");
      fmt::print("times: {} of the repetitions, slowest rank, variants alternating in rotating order\n\n",
                 options.best ? "best" : "median");
    }
    Bench bench(*world, bare_comm, options);
    const std::vector<Row> rows = bench.run();
    if (world->rank() == 0) print(rows, options.variants);
    MPI_Comm_free(&bare_comm);
  } catch (const std::exception& e) {
    fmt::print(stderr, "[collectives] rank {} of {} failed: {}\n", world->rank(), world->size(), e.what());
    std::fflush(stderr);
    mpi_abort(1);  // peers may be blocked in a collective: only MPI_Abort releases them
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace dtensor::bench
