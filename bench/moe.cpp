// Expert parallelism (issue 30): the exchange an MoE layer makes, and the
// MoE GPT's training throughput against a dense GPT.
//
//   moe [--quick] [--ranks=2,4,8] [--max-mib=N] [--reps=N] [--steps=N]
//   DTENSOR_BENCH_QUICK=1 acts as --quick (exchange sizes up to 4 MiB, 4 steps).
//   mpirun -np 4 moe [--quick] [--max-mib=N] [--reps=N] [--steps=N]
//
// Table 1, the dispatch + combine exchange. Each rank routes T tokens to
// their top-2 of E = 8 experts (expert e on rank e * n / E); the choice is
// drawn from mt19937_64 seeded by the source rank, with expert e's weight
// 1/sqrt(e+1): every rank prefers the same experts, as a router with
// favourites does, so the ranks holding them receive more (`recv max/mean`:
// the busiest rank's dispatch bytes from peers over the mean). Rows are 1 KiB
// (d_model 256 in f32) and `size` is what one rank sends in the dispatch (T * 2
// rows), 64 KiB to --max-mib (64; quick 4). One repetition is the layer's
// pair: the dispatch all_to_allv (Communicator::all_to_all with per-peer byte
// counts and offsets, nn/src/moe_parallel.cpp's exchange_rows) and the
// combine, the same splits reversed. GB/s counts as CommStats does: the
// bytes a rank receives from other ranks in both calls (checked against
// CommStats on the first call), averaged over the ranks, over the slowest
// rank's time from a barrier to the return of the combine.
//   threads (2, 4, 8 thread ranks): there is no bare MPI to compare with;
//     the reference is each rank memcpy'ing, all at once, the bytes it
//     receives from its peers between buffers of its own: the one copy a
//     shared-memory exchange cannot avoid (`dtensor/memcpy` about 1 at best).
//   mpirun (the job's processes; --ranks is ignored): the reference is the
//     bare MPI_Alltoallv pair on MPI_COMM_WORLD with the same splits and the
//     same buffers (MPI_BYTE; built only where the build has MPI).
// The variants alternate in rotating order within each repetition, so that
// both see the same machine load; the table shows the median repetition.
// 8 thread ranks at 64 MiB hold about 1.6 GiB.
//
// Table 2, training: train::train on the byte-level GPT (2 layers, d_model
// 64, 4 heads, seq 64, batch 8 sequences, f32, AdamW) for --steps steps;
// tokens/s is the trainer's, over the steps after the first. `dense`: every
// block's MLP (width 4D) under ddp; `moe top-1` and `moe top-2`: 8 experts
// of the same MLP each, dropless, under the ep plan. Top-1 runs the same
// MLP FLOPs per token as dense (plus the router and the exchanges); top-2
// twice as many (`active MLP`). On 2 thread ranks (ep = 2); under mpirun on
// the job's processes (ep = the job's size, which must divide the batch and
// the experts, both 8; other sizes print `skipped`).
//
// Figures live in bench/README.md. Run with OPENBLAS_CORETYPE unset for
// figures you quote: env -u OPENBLAS_CORETYPE build/bench/moe
#ifdef DTENSOR_BENCH_MPI
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

#include <dtensor/dtensor.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "dtensor/train/trainer.h"

using namespace dtensor;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kExperts = 8;
constexpr int kTopK = 2;
constexpr std::size_t kRowBytes = 1024;

struct Options {
  std::vector<int> ranks{2, 4, 8};
  std::size_t max_mib = 64;
  int reps = 0;  // 0: by size
  std::int64_t steps = 10;
};

// rows[src][dst]: the rows rank src sends to rank dst in the dispatch.
using Routing = std::vector<std::vector<std::size_t>>;

// Every rank's routing of `tokens` tokens, the same on every rank: drawn from
// mt19937_64 (whose output the standard fixes) by inverse CDF, not from
// std::discrete_distribution (which differs between standard libraries).
Routing route(int n, std::int64_t tokens) {
  std::array<double, kExperts> weight{};
  for (int e = 0; e < kExperts; ++e) weight[e] = 1.0 / std::sqrt(e + 1.0);
  Routing rows(static_cast<std::size_t>(n), std::vector<std::size_t>(static_cast<std::size_t>(n)));
  for (int src = 0; src < n; ++src) {
    std::mt19937_64 rng(0x30 + static_cast<std::uint64_t>(src));
    for (std::int64_t t = 0; t < tokens; ++t) {
      int first = -1;
      for (int k = 0; k < kTopK; ++k) {  // k distinct experts: drop the first from the second draw
        double total = 0;
        for (int e = 0; e < kExperts; ++e) total += e == first ? 0 : weight[e];
        double u = static_cast<double>(rng() >> 11) * 0x1p-53 * total;
        int pick = 0;
        for (; pick < kExperts - 1; ++pick) {
          if (pick == first) continue;
          if (u < weight[pick]) break;
          u -= weight[pick];
        }
        if (pick == first) --pick;  // rounding left u past the last expert, which was the first pick
        first = pick;
        ++rows[static_cast<std::size_t>(src)][static_cast<std::size_t>(pick * n / kExperts)];
      }
    }
  }
  return rows;
}

// One rank's all_to_allv arguments, in bytes, grouped by peer as
// exchange_rows lays them out.
struct Exchange {
  std::vector<std::size_t> send_bytes, send_offsets, recv_bytes, recv_offsets;
  std::size_t sent = 0, received = 0;
  std::size_t foreign_in = 0, foreign_out = 0;  // from / to other ranks

  Exchange reversed() const {
    return {recv_bytes, recv_offsets, send_bytes, send_offsets, received, sent, foreign_out, foreign_in};
  }
};

Exchange dispatch_of(const Routing& rows, int rank) {
  const auto n = rows.size(), r = static_cast<std::size_t>(rank);
  Exchange x;
  for (std::size_t p = 0; p < n; ++p) {
    x.send_offsets.push_back(x.sent);
    x.send_bytes.push_back(rows[r][p] * kRowBytes);
    x.sent += x.send_bytes.back();
    x.recv_offsets.push_back(x.received);
    x.recv_bytes.push_back(rows[p][r] * kRowBytes);
    x.received += x.recv_bytes.back();
    if (p != r) {
      x.foreign_in += x.recv_bytes.back();
      x.foreign_out += x.send_bytes.back();
    }
  }
  return x;
}

// The reference for one rank's dispatch + combine on `send` and `recv`.
using Reference = std::function<std::function<void()>(const Exchange&, std::byte* send, std::byte* recv)>;

// Threads: this rank copies the bytes it would receive from peers, in both
// directions, from a buffer of its own.
std::function<void()> memcpy_reference(const Exchange& x, std::byte* send, std::byte* recv) {
  auto scratch =
      std::make_shared<std::vector<std::byte>>(std::max<std::size_t>(std::max(x.foreign_in, x.foreign_out), 1));
  return [=] {
    std::memcpy(recv, scratch->data(), x.foreign_in);
    std::memcpy(send, scratch->data(), x.foreign_out);
  };
}

#ifdef DTENSOR_BENCH_MPI
void check_mpi(int rc, const char* call) {
  if (rc != MPI_SUCCESS) throw CommError(fmt::format("[moe] {} failed with code {}", call, rc));
}

// MPI: the bare MPI_Alltoallv pair. The backend's communicator is a private
// duplicate of MPI_COMM_WORLD, so the two never match each other's messages.
std::function<void()> mpi_reference(const Exchange& x, std::byte* send, std::byte* recv) {
  auto ints = [](const std::vector<std::size_t>& v) { return std::vector<int>(v.begin(), v.end()); };
  return [=, sb = ints(x.send_bytes), so = ints(x.send_offsets), rb = ints(x.recv_bytes), ro = ints(x.recv_offsets)] {
    check_mpi(MPI_Alltoallv(send, sb.data(), so.data(), MPI_BYTE, recv, rb.data(), ro.data(), MPI_BYTE, MPI_COMM_WORLD),
              "MPI_Alltoallv");
    check_mpi(MPI_Alltoallv(recv, rb.data(), ro.data(), MPI_BYTE, send, sb.data(), so.data(), MPI_BYTE, MPI_COMM_WORLD),
              "MPI_Alltoallv");
  };
}
#endif

struct ExchangeRow {
  int ranks = 0;
  std::size_t bytes = 0;              // sent in the dispatch by each rank
  double imbalance = 0;               // the largest rank's dispatch bytes from peers over the mean
  double per_rank = 0;                // bytes received from peers in dispatch + combine, mean over ranks
  double dtensor = 0, reference = 0;  // seconds
};

// Runs every variant warmup + reps times in rotating order, each after a
// barrier; returns per variant the median over the repetitions of the
// slowest rank's time.
std::vector<double> time_variants(Communicator& comm, const std::vector<std::function<void()>>& variants, int warmup,
                                  int reps) {
  const std::size_t nv = variants.size();
  std::vector<double> times(static_cast<std::size_t>(reps) * nv);
  for (int i = 0; i < warmup + reps; ++i) {
    for (std::size_t j = 0; j < nv; ++j) {
      const std::size_t v = (j + static_cast<std::size_t>(i)) % nv;
      comm.barrier();
      const auto t0 = Clock::now();
      variants[v]();
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      if (i >= warmup) times[static_cast<std::size_t>(i - warmup) * nv + v] = t;
    }
  }
  comm.all_reduce(std::span(times), ReduceOp::Max);  // a collective is done when its slowest rank is
  std::vector<double> out;
  for (std::size_t v = 0; v < nv; ++v) {
    std::vector<double> mine;
    for (int r = 0; r < reps; ++r) mine.push_back(times[static_cast<std::size_t>(r) * nv + v]);
    std::nth_element(mine.begin(), mine.begin() + reps / 2, mine.end());
    out.push_back(mine[static_cast<std::size_t>(reps / 2)]);
  }
  return out;
}

ExchangeRow measure_exchange(Communicator& comm, std::size_t bytes, int reps, const Reference& reference) {
  const int n = comm.size();
  const Routing rows = route(n, static_cast<std::int64_t>(bytes / (kTopK * kRowBytes)));
  const Exchange dispatch = dispatch_of(rows, comm.rank()), combine = dispatch.reversed();
  std::vector<std::byte> send(std::max<std::size_t>(dispatch.sent, 1)),
      recv(std::max<std::size_t>(dispatch.received, 1));

  auto exchange = [&comm](const Exchange& x, const std::byte* from, std::byte* to) {
    comm.all_to_all(from, x.send_bytes, x.send_offsets, to, x.recv_bytes, x.recv_offsets);
  };
  const std::function<void()> dtensor_pair = [&] {
    exchange(dispatch, send.data(), recv.data());
    exchange(combine, recv.data(), send.data());
  };
  // The table's bytes are CommStats': say so by checking them once.
  const CommStats before = comm.stats();
  dtensor_pair();
  const std::uint64_t counted = (comm.stats() - before).bytes_by_kind[static_cast<int>(CollectiveKind::AllToAll)];
  if (counted != dispatch.foreign_in + combine.foreign_in)
    throw Error(fmt::format("[moe] rank {}: CommStats counted {} bytes, the splits say {}", comm.rank(), counted,
                            dispatch.foreign_in + combine.foreign_in));

  const int warmup = bytes >= (16u << 20) ? 1 : 2;
  if (reps <= 0) reps = bytes >= (16u << 20) ? 5 : 9;
  const std::vector<double> t =
      time_variants(comm, {dtensor_pair, reference(dispatch, send.data(), recv.data())}, warmup, reps);

  ExchangeRow row{n, bytes, 0, 0, t[0], t[1]};
  std::size_t most = 0, total = 0;
  for (int r = 0; r < n; ++r) {
    const Exchange x = dispatch_of(rows, r);
    most = std::max(most, x.foreign_in);
    total += x.foreign_in + x.foreign_out;  // combine's foreign_in is dispatch's foreign_out
  }
  row.per_rank = static_cast<double>(total) / n;
  row.imbalance = static_cast<double>(most) / std::max(1.0, static_cast<double>(total) / 2 / n);
  return row;
}

std::vector<ExchangeRow> exchange_rows(Communicator& comm, const Options& o, const Reference& reference) {
  std::vector<ExchangeRow> out;
  for (std::size_t bytes = 64u << 10; bytes <= (o.max_mib << 20); bytes *= 4)
    out.push_back(measure_exchange(comm, bytes, o.reps, reference));
  return out;
}

void print_exchange_header(std::string_view where, std::string_view reference) {
  fmt::print("== dispatch + combine: all_to_allv pair of a top-{} routing over {} experts, {} KiB rows; {}\n", kTopK,
             kExperts, kRowBytes >> 10, where);
  fmt::print("GB/s: bytes each rank receives from peers (CommStats) per second, mean over ranks; median of the reps\n");
  fmt::print("{:>5} {:>9} {:>9} {:>10} {:>12} {:>12} {:>14}\n", "ranks", "size KiB", "recv max/", "from peers",
             "dtensor GB/s", fmt::format("{} GB/s", reference), fmt::format("dtensor/{}", reference));
  fmt::print("{:>5} {:>9} {:>9} {:>10}\n", "", "", "mean", "KiB/rank");
}

void print_exchange(const std::vector<ExchangeRow>& rows) {
  for (const ExchangeRow& r : rows) {
    const double ours = r.per_rank / r.dtensor / 1e9, ref = r.per_rank / r.reference / 1e9;
    fmt::print("{:>5} {:>9} {:>9.2f} {:>10.0f} {:>12.2f} {:>12.2f} {:>14.3f}\n", r.ranks, r.bytes >> 10, r.imbalance,
               r.per_rank / 1024, ours, ref, ours / ref);
  }
  std::fflush(stdout);
}

// --- Table 2: training --------------------------------------------------

struct Model {
  std::string name, plan, active;
  nn::MoEConfig moe;
};

const std::vector<Model>& models() {
  static const std::vector<Model> all{{"dense", "ddp", "1x", {}},
                                      {"moe top-1", "ep", "1x", {.experts = kExperts, .top_k = 1}},
                                      {"moe top-2", "ep", "2x", {.experts = kExperts, .top_k = 2}}};
  return all;
}

train::TrainOptions train_options(const Options& o, const Model& m, std::int64_t ranks) {
  train::TrainOptions t;
  t.model = {.vocab = 256, .seq = 64, .layers = 2, .d_model = 64, .heads = 4, .dtype = DType::Float32};
  t.model.moe = m.moe;
  t.batch = 8;
  t.steps = o.steps;
  t.val_batches = 0;
  t.mesh = {ranks};
  t.dims = {m.plan == "ep" ? "ep" : "dp"};
  t.plans = {m.plan};
  return t;
}

void print_train_header(const Options& o, std::int64_t ranks, std::string_view backend) {
  fmt::print(
      "\n== MoE GPT vs dense: 2 layers, d_model 64, 4 heads, seq 64, batch 8, f32, AdamW; {} steps (tokens/s over "
      "all but the first); {} {} ranks\n",
      o.steps, ranks, backend);
  fmt::print("{:<10} {:>4} {:>5} {:>7} {:>10} {:>9} {:>9} {:>8}\n", "model", "plan", "mesh", "experts", "active MLP",
             "step ms", "tokens/s", "vs dense");
}

// Prints one row; `dense` is the dense row's tokens/s.
void print_train_row(const Model& m, std::int64_t ranks, double tokens_per_second, double dense) {
  const double step_ms = 1e3 * 8 * 64 / tokens_per_second;
  fmt::print("{:<10} {:>4} {:>5} {:>7} {:>10} {:>9.1f} {:>9.0f} {:>8}\n", m.name, m.plan, ranks,
             m.moe.enabled() ? fmt::format("{}", m.moe.experts) : "-", m.active, step_ms, tokens_per_second,
             fmt::format("{:.2f}", tokens_per_second / dense));
  std::fflush(stdout);
}

// The CPU's model name and today's date, for figures copied elsewhere.
void print_banner() {
  std::string cpu = "unknown CPU";
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("model name")) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char date[16];
  std::strftime(date, sizeof date, "%Y-%m-%d", &tm);
  fmt::print("moe: {} ({} hardware threads), {}\n\n", cpu, std::thread::hardware_concurrency(), date);
}

#ifdef DTENSOR_BENCH_MPI
// Under mpirun: both tables on the job's processes.
int run_mpi(char** argv, const Options& o, const train::TextData& data) {
  int launch_argc = 1;  // launch() sees none of our flags
  return launch(launch_argc, argv, [&](Communicator& world) {
    const bool lead = world.rank() == 0;
    if (lead) {
      print_banner();
      print_exchange_header(fmt::format("{} MPI processes", world.size()), "MPI");
    }
    const std::vector<ExchangeRow> rows = exchange_rows(world, o, mpi_reference);
    if (lead) {
      print_exchange(rows);
      print_train_header(o, world.size(), "MPI");
    }
    double dense = 0;
    for (const Model& m : models()) {
      try {
        const double tps = train::train(train_options(o, m, world.size()), data, &world).tokens_per_second;
        if (!m.moe.enabled()) dense = tps;  // the first row
        if (lead) print_train_row(m, world.size(), tps, dense);
      } catch (const ValueError& e) {  // a mesh the experts do not split over: every rank throws it first
        if (lead) fmt::print("{:<10} skipped: {}\n", m.name, e.what());
      }
    }
  });
}
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moe: the MoE layer's all_to_allv exchange, and MoE GPT training against dense"};
  Options o;
  bool quick = false;
  if (const char* q = std::getenv("DTENSOR_BENCH_QUICK"); q && *q && std::string_view(q) != "0") quick = true;
  app.add_flag("--quick", quick, "exchange sizes up to 4 MiB, 4 training steps");
  app.add_option("--ranks", o.ranks, "thread rank counts of the exchange (under mpirun: ignored, the job's size)")
      ->delimiter(',')
      ->check(CLI::Range(2, 64));
  CLI::Option* max_mib = app.add_option("--max-mib", o.max_mib, "largest exchange, MiB sent per rank (64; quick 4)")
                             ->check(CLI::Range(1, 1024));
  app.add_option("--reps", o.reps, "timed repetitions per size (default: 9, 5 from 16 MiB)")
      ->check(CLI::PositiveNumber);
  CLI::Option* steps =
      app.add_option("--steps", o.steps, "training steps per row (10; quick 4)")->check(CLI::Range(2, 100000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "moe: {}\n", e.what());
    return 2;
  }
  if (quick && max_mib->count() == 0) o.max_mib = 4;
  if (quick && steps->count() == 0) o.steps = 4;
  const train::TextData data(train::find_text(std::nullopt));

  if (launch_backend() == "mpi") {
#ifdef DTENSOR_BENCH_MPI
    return run_mpi(argv, o, data);
#else
    fmt::print(stderr, "[moe] started under an MPI launcher, but this build has no MPI: run without mpirun\n");
    return 2;
#endif
  }

  print_banner();
  print_exchange_header("threads backend", "memcpy");
  for (const int n : o.ranks) {
    std::vector<ExchangeRow> rows;
    run_threads(n, [&](Communicator& comm) {
      std::vector<ExchangeRow> mine = exchange_rows(comm, o, memcpy_reference);
      if (comm.rank() == 0) rows = std::move(mine);
    });
    print_exchange(rows);
  }

  constexpr std::int64_t kTrainRanks = 2;  // ep = 2, the figure
  print_train_header(o, kTrainRanks, "thread");
  double dense = 0;
  for (const Model& m : models()) {
    double tps = 0;
    run_threads(kTrainRanks, [&](Communicator& world) {
      const double mine = train::train(train_options(o, m, kTrainRanks), data, &world).tokens_per_second;
      if (world.rank() == 0) tps = mine;
    });
    if (!m.moe.enabled()) dense = tps;  // the first row
    print_train_row(m, kTrainRanks, tps, dense);
  }
  return 0;
}
