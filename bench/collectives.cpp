// Bandwidth of the threads backend's collectives: all_gather, all_reduce,
// reduce_scatter and all_to_all on 2, 4 and 8 ranks, 1 to 256 MiB.
//
//   collectives [--quick] [--ranks=2,4,8] [--max-mib=N] [--reps=N] [--best]
//   DTENSOR_BENCH_QUICK=1 acts as --quick (sizes up to 16 MiB).
//
// Under mpirun the MPI backend instead, against bare MPI on the same buffers
// (collectives_mpi.cpp; sizes up to 64 MiB unless --max-mib says otherwise;
// the job's size is the rank count; --variants adds the diagnostic columns):
//   mpirun -np 4 collectives [--quick] [--max-mib=N] [--reps=N] [--best] [--variants]
//
// S is the nccl-tests size: the output of all_gather, the input of
// reduce_scatter, the buffer of all_reduce, the send (= recv) buffer of one
// rank for all_to_all. algbw = S/t; busbw = algbw * (n-1)/n for all_gather,
// reduce_scatter and all_to_all, algbw * 2(n-1)/n for all_reduce.
//
// Memory traffic: the bytes a shared-memory algorithm must read plus write,
// summed over the n ranks (a rank's own block is not counted where it needs
// no copy, as in place):
//   all_gather      (in place) each rank reads (n-1)/n S from peers and
//                   writes it:                                           2(n-1) S
//   all_to_all      (cannot be in place) each rank reads S and writes S,
//                   its own block included:                              2n S
//   reduce_scatter  each rank reads its block from all n ranks (S) and writes
//                   S/n:                                                 (n+1) S
//   all_reduce      reduce-scatter (S read, S/n written) then all-gather
//                   ((n-1)/n S read and written) per rank:               (3n-1) S
// efficiency = (traffic / t) / memcpy bandwidth, where the memcpy bandwidth is
// measured in the same run: n threads each memcpy S bytes between their own
// buffers at once (read + write = 2nS bytes), so that the working set and
// thread count match the collective's; its repetitions alternate with the
// collective's, so both see the same load on a shared machine. Timings are
// the median of several repetitions after warm-up, taken on rank 0 from a
// barrier to the return of the call (every collective ends with a closing
// barrier).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "collective_table.h"
#include "collectives_mpi.h"
#include "dtensor/mesh/backends.h"
#include "dtensor/mesh/threads.h"

using namespace dtensor;

namespace {

using Clock = std::chrono::steady_clock;

using dtensor::bench::bus_factor;
using dtensor::bench::Coll;
using dtensor::bench::kColls;
using dtensor::bench::name;

double traffic(Coll c, int n, double s) {
  switch (c) {
    case Coll::AllGather: return 2.0 * (n - 1) * s;
    case Coll::AllToAll: return 2.0 * n * s;
    case Coll::ReduceScatter: return (n + 1) * s;
    case Coll::AllReduce: return (3.0 * n - 1) * s;
  }
  return 0;
}

struct Options {
  std::vector<int> ranks{2, 4, 8};
  std::size_t max_mib = 256;
  int reps = 0;       // 0: by size
  bool best = false;  // the fastest repetition instead of the median
};

struct Buffer {
  explicit Buffer(std::size_t bytes) : data(new std::byte[std::max<std::size_t>(bytes, 64)]), size(bytes) {
    std::memset(data.get(), 1, std::max<std::size_t>(bytes, 64));  // first touch by the owning rank
  }
  std::unique_ptr<std::byte[]> data;
  std::size_t size;
  std::byte* get() { return data.get(); }
};

bool g_best = false;

// The median, or with --best the fastest repetition (less sensitive to other
// processes on a shared machine).
double summary(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return g_best ? v.front() : v[v.size() / 2];
}

struct Row {
  Coll coll;
  int n;
  std::size_t bytes;
  double seconds;
  double memcpy_bw;
};

// Times `fn` and, interleaved with it, the memcpy baseline (each rank copies
// S bytes between its own buffers), so that both see the same machine load.
// Returns the summaries {collective, memcpy}.
template <class Fn>
std::pair<double, double> time_it(Communicator& comm, int warmup, int reps, Buffer& src, Buffer& dst, Fn&& fn) {
  std::vector<double> times, copy_times;
  for (int i = 0; i < warmup + reps; ++i) {
    comm.barrier();
    const auto t0 = Clock::now();
    std::memcpy(dst.get(), src.get(), src.size);
    comm.barrier();
    const auto t1 = Clock::now();
    fn();
    const auto t2 = Clock::now();
    if (i >= warmup) {
      copy_times.push_back(std::chrono::duration<double>(t1 - t0).count());
      times.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
  }
  return {summary(std::move(times)), summary(std::move(copy_times))};
}

void run_ranks(int n, const std::vector<std::size_t>& sizes, const Options& opt, std::vector<Row>& rows) {
  std::vector<Row> local;
  run_threads(n, [&](Communicator& comm) {
    const int r = comm.rank();
    for (std::size_t s : sizes) {
      const int reps = opt.reps > 0 ? opt.reps : (s >= (64u << 20) ? 5 : 9);
      const int warmup = s >= (64u << 20) ? 1 : 2;
      const std::size_t block = s / static_cast<std::size_t>(n);
      Buffer copy_src(s), copy_dst(s);
      for (Coll c : kColls) {
        std::pair<double, double> t;
        switch (c) {
          case Coll::AllGather: {
            Buffer recv(block * n);  // in place: this rank's block is its input
            std::byte* send = recv.get() + block * static_cast<std::size_t>(r);
            t = time_it(comm, warmup, reps, copy_src, copy_dst, [&] { comm.all_gather(send, recv.get(), block); });
            break;
          }
          case Coll::AllReduce: {
            Buffer send(s), recv(s);
            std::memset(send.get(), 0, s);
            t = time_it(comm, warmup, reps, copy_src, copy_dst,
                        [&] { comm.all_reduce(send.get(), recv.get(), s / 4, DType::Float32, ReduceOp::Sum); });
            break;
          }
          case Coll::ReduceScatter: {
            Buffer send(block * n), recv(block);
            std::memset(send.get(), 0, block * n);
            std::vector<std::size_t> counts(static_cast<std::size_t>(n), block / 4);
            t = time_it(comm, warmup, reps, copy_src, copy_dst,
                        [&] { comm.reduce_scatter(send.get(), recv.get(), counts, DType::Float32, ReduceOp::Sum); });
            break;
          }
          case Coll::AllToAll: {
            Buffer send(block * n), recv(block * n);
            std::vector<std::size_t> bytes(static_cast<std::size_t>(n), block), offsets(static_cast<std::size_t>(n));
            for (int p = 0; p < n; ++p) offsets[static_cast<std::size_t>(p)] = block * static_cast<std::size_t>(p);
            t = time_it(comm, warmup, reps, copy_src, copy_dst,
                        [&] { comm.all_to_all(send.get(), bytes, offsets, recv.get(), bytes, offsets); });
            break;
          }
        }
        if (r == 0)
          local.push_back(
              {c, n, block * static_cast<std::size_t>(n), t.first, 2.0 * n * static_cast<double>(s) / t.second});
      }
    }
  });
  rows.insert(rows.end(), local.begin(), local.end());
}

void print(const std::vector<Row>& rows) {
  fmt::print("{:<15} {:>5} {:>9} {:>10} {:>9} {:>9} {:>10} {:>10} {:>6}\n", "collective", "ranks", "size", "time_ms",
             "algbw", "busbw", "traffic", "memcpy", "eff");
  fmt::print("{:<15} {:>5} {:>9} {:>10} {:>9} {:>9} {:>10} {:>10} {:>6}\n", "", "", "MiB", "", "GB/s", "GB/s", "GB/s",
             "GB/s", "");
  for (Coll c : kColls) {
    for (const Row& row : rows) {
      if (row.coll != c) continue;
      const double s = static_cast<double>(row.bytes);
      const double algbw = s / row.seconds / 1e9;
      const double traffic_bw = traffic(c, row.n, s) / row.seconds / 1e9;
      fmt::print("{:<15} {:>5} {:>9.0f} {:>10.3f} {:>9.2f} {:>9.2f} {:>10.2f} {:>10.2f} {:>6.2f}\n", name(c), row.n,
                 s / (1 << 20), row.seconds * 1e3, algbw, algbw * bus_factor(c, row.n), traffic_bw, row.memcpy_bw / 1e9,
                 traffic_bw / (row.memcpy_bw / 1e9));
    }
  }
}

std::vector<int> parse_list(std::string_view text) {
  std::vector<int> out;
  while (!text.empty()) {
    const auto comma = text.find(',');
    out.push_back(std::atoi(std::string(text.substr(0, comma)).c_str()));
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  std::optional<std::size_t> max_mib;  // the default differs per mode
  bool variants = false;
  if (const char* q = std::getenv("DTENSOR_BENCH_QUICK"); q && *q && std::string_view(q) != "0") max_mib = 16;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--quick") {
      max_mib = 16;
    } else if (arg.starts_with("--ranks=")) {
      opt.ranks = parse_list(arg.substr(8));
    } else if (arg.starts_with("--max-mib=")) {
      max_mib = static_cast<std::size_t>(std::atoi(std::string(arg.substr(10)).c_str()));
    } else if (arg == "--variants") {
      variants = true;
    } else if (arg == "--best") {
      opt.best = true;
    } else if (arg.starts_with("--reps=")) {
      opt.reps = std::atoi(std::string(arg.substr(7)).c_str());
    } else {
      fmt::print(stderr,
                 "[collectives] unknown argument '{}'; expected --quick, --ranks=2,4,8, --max-mib=N, --reps=N, --best, "
                 "--variants (MPI)\n",
                 arg);
      return 2;
    }
  }
  g_best = opt.best;
  // Under MPI every process holds its own buffers: 64 MiB by default.
  if (launched_under_mpi()) return bench::run_mpi_collectives({max_mib.value_or(64), opt.reps, opt.best, variants});
  opt.max_mib = max_mib.value_or(opt.max_mib);
  std::vector<std::size_t> sizes;
  for (std::size_t mib = 1; mib <= opt.max_mib; mib *= 4) sizes.push_back(mib << 20);

  fmt::print("threads backend collectives ({} hardware threads)\n", std::thread::hardware_concurrency());
  fmt::print("S: all_gather output, reduce_scatter input, all_reduce buffer, all_to_all per-rank send; f32 sum\n");
  fmt::print(
      "algbw = S/t; busbw = algbw*(n-1)/n (all_gather, reduce_scatter, all_to_all), algbw*2(n-1)/n (all_reduce)\n");
  fmt::print(
      "traffic (bytes read+written by all ranks): all_gather (in place) 2(n-1)S; all_to_all 2nS; "
      "reduce_scatter (n+1)S; all_reduce (3n-1)S\n");
  fmt::print("eff = traffic bandwidth / memcpy bandwidth of n threads each copying S bytes (2nS bytes moved)\n");
  fmt::print("times: {} of the repetitions, memcpy and collective alternating\n\n", opt.best ? "best" : "median");
  std::vector<Row> rows;
  for (int n : opt.ranks) run_ranks(n, sizes, opt, rows);
  print(rows);
  return 0;
}
