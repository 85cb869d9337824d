// Tokens per second of one training step of the byte-level GPT-2
// (train/ and nn::GPT: separate q, k, v, proj with biases, pre-LN, exact GELU MLP
// 4x, untied lm_head, AdamW) for each parallel plan on 1, 2, 4 and 8 ranks,
// with the share of the step spent inside collectives.
//
// Each row trains `warmup` steps and then `steps` timed ones with
// train::train; tokens/s is batch * seq * steps over the timed steps' wall time
// on rank 0 (every rank takes part in every step, so rank 0's wall time is
// the step's). `gemm` is rank 0's time inside the CPU GEMM backend
// (cpu::gemm_seconds_this_thread: every matmul, linear and einsum, forward
// and backward) over its step time: the part of the step that is GEMM, whose
// ceiling is 100%. The world communicator is wrapped in a TimedCommunicator
// (bench/timed_communicator.h): `comm wall` is rank 0's wall time inside
// collectives over its step time, which includes waiting for peers that
// are still computing; `comm cpu` is rank 0's thread CPU time inside them
// over its CPU time in the step: the copies and reductions themselves (MPI
// polls while it waits, so under MPI the two are close). `colls` and
// `MiB` are rank 0's collectives per step and the bytes it received
// (CommStats). The `plain` row is one rank on plain Tensors (no mesh); `vs
// plain` is a row's tokens/s over it, measured in the same run.
//
// With --link each row runs twice: first at the machine's own speed with
// every collective blocking, for the step's compute (t_compute: the median
// step less its time inside collectives), then on the modelled link;
// `hidden` is the share of the link's communication time the step hid
// under computation,
//   1 - (t_step - t_compute) / t_comm,
// with t_step that run's median step and t_comm the link's time for rank
// 0's calls of the step alone (a latency per call plus the bytes over the
// bandwidth, LinkModel::time_for). Blocking calls hide nothing (about 0);
// 1 is all of it hidden. Steps on a shared VM vary by several percent, so
// rows whose t_comm is a small part of the step read noisily.
//
// Run (OPENBLAS_CORETYPE unset for figures you quote):
//   env -u OPENBLAS_CORETYPE build/bench/train                 # thread ranks 1,2,4,8, every plan
//   env -u OPENBLAS_CORETYPE build/bench/train --ranks=2 --plans=tp --steps=5
//   env -u OPENBLAS_CORETYPE mpirun -np 2 build/bench/train    # the job's ranks, every plan
//   build/bench/train --json                                   # one JSON object per row (bench/train_torch.py)
// On a machine with fewer cores than ranks the ranks share cores: tokens/s
// cannot grow past the core count there.
#include <dtensor/dtensor.h>
#include <dtensor/nn/parallel_plan.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/ops/detail/gemm.h"
#include "dtensor/train/trainer.h"
#include "thread_timing.h"
#include "timed_communicator.h"

using namespace dtensor;

namespace {

// A plan on a mesh; an empty mesh is the plain one-rank row.
struct Config {
  std::string plan;  // "ddp" or "ddp,tp"
  Shape mesh;
  std::vector<std::string> dims;
};

struct Row {
  Config config;
  double step_seconds = 0;  // mean over the timed steps
  double tokens_per_second = 0;
  double comm_wall_share = 0, comm_cpu_share = 0;
  double gemm_share = 0;  // rank 0's time inside the CPU GEMM backend over its step time
  std::uint64_t collectives = 0, bytes = 0;  // rank 0's, the last step's
  double median_step = 0, median_compute = 0;  // seconds; compute: a step less its time in collectives
  double link_seconds = 0;                     // --link: the modelled time of those calls alone
  std::optional<double> hidden_fraction;       // --link: 1 - (step - compute) / link_seconds
};

struct Options {
  train::TrainOptions train;
  std::int64_t timed_steps = 5;
  std::optional<LinkModel> link;  // --link: every row's communicators model it
};

std::int64_t ranks_of(const Config& c) { return c.mesh.empty() ? 1 : numel(c.mesh); }

std::string mesh_text(const Config& c) { return c.mesh.empty() ? "-" : fmt::format("{}", fmt::join(c.mesh, "x")); }

// Per-step totals that rank 0's step callback adds up over the timed steps.
struct Totals {
  double wall = 0, cpu = 0, comm_wall = 0, comm_cpu = 0, gemm = 0;
  std::int64_t steps = 0;
  std::vector<double> step_walls, step_computes;  // per timed step: its wall time, less its time in collectives
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One rank's part of a row; `clock` is null on plain tensors. Fills `row`
// on rank 0.
void train_rank(const Options& o, const train::TextData& data, const Config& c, Communicator* world,
                const bench::CommClock* clock, Row& row) {
  train::TrainOptions t = o.train;
  t.steps = o.train.warmup + o.timed_steps;
  t.warmup = 0;  // the learning rate's warmup: irrelevant to the timing
  t.val_batches = 0;
  t.mesh = c.mesh;
  t.dims = c.dims;
  for (std::size_t start = 0; !c.mesh.empty() && start <= c.plan.size();) {
    const std::size_t end = std::min(c.plan.find(',', start), c.plan.size());
    t.plans.push_back(c.plan.substr(start, end - start));
    start = end + 1;
  }
  t.overlap_grad_reduce = o.train.overlap_grad_reduce && (c.plan == "ddp" || c.plan == "zero1" || c.plan == "ddp,tp");
  t.overlap_param_gather = o.train.overlap_param_gather && c.plan == "zero1";
  t.domino = o.train.domino && c.plan.find("tp") != std::string::npos;
  const bool lead = world == nullptr || world->rank() == 0;
  Totals totals;
  double cpu_mark = bench::thread_seconds(), gemm_mark = cpu::gemm_seconds_this_thread();
  bench::CommClock comm_mark = clock ? *clock : bench::CommClock{};
  const train::TrainResult r = train::train(t, data, world, [&](std::int64_t step, double, double seconds) {
    const double cpu_now = bench::thread_seconds(), gemm_now = cpu::gemm_seconds_this_thread();
    const bench::CommClock comm_now = clock ? *clock : bench::CommClock{};
    if (step >= o.train.warmup) {
      totals.wall += seconds;
      totals.cpu += cpu_now - cpu_mark;
      totals.comm_wall += comm_now.wall - comm_mark.wall;
      totals.comm_cpu += comm_now.cpu - comm_mark.cpu;
      totals.gemm += gemm_now - gemm_mark;
      ++totals.steps;
      totals.step_walls.push_back(seconds);
      totals.step_computes.push_back(seconds - (comm_now.wall - comm_mark.wall));
    }
    cpu_mark = cpu_now;
    gemm_mark = gemm_now;
    comm_mark = comm_now;
  });
  if (!lead) return;
  row.config = c;
  row.step_seconds = totals.wall / static_cast<double>(totals.steps);
  row.tokens_per_second = static_cast<double>(t.batch * t.model.seq * totals.steps) / totals.wall;
  row.comm_wall_share = totals.comm_wall / totals.wall;
  row.comm_cpu_share = totals.cpu > 0 ? totals.comm_cpu / totals.cpu : 0;
  row.gemm_share = totals.gemm / totals.wall;
  row.median_step = median(totals.step_walls);
  row.median_compute = median(totals.step_computes);
  const std::optional<LinkModel> link = world ? world->link_model() : std::nullopt;
  for (const train::PhaseComm& p : r.comm) {
    row.collectives += p.count;
    row.bytes += p.bytes;
    if (link && p.count > 0)  // the calls are counted together: one bandwidth term, a latency each
      row.link_seconds += std::chrono::duration<double>(link->time_for(p.bytes) +
                                                        (p.count - 1) * link->latency).count();
  }
}

// The row's hidden fraction, from its run on the link and its blocking run
// at the machine's speed (the compute).
void add_hidden_fraction(Row& on_link, const Row& blocking) {
  if (on_link.link_seconds > 0)
    on_link.hidden_fraction = 1 - (on_link.median_step - blocking.median_compute) / on_link.link_seconds;
}

// The options of a row's compute run: no overlap (its link is off too).
Options blocking(Options o) {
  o.train.overlap_grad_reduce = false;
  o.train.overlap_param_gather = false;
  o.train.prefetch_units = false;
  o.train.overlap_unit_reduce = false;
  o.train.domino = false;  // the unsplit step: Domino's smaller GEMMs count against its hidden fraction
  return o;
}

// A row on thread ranks (or plain tensors for an empty mesh); with a link,
// its compute-only run first.
Row measure_threads(const Options& o, const train::TextData& data, const Config& c) {
  Row row;
  if (c.mesh.empty()) {
    train_rank(o, data, c, nullptr, nullptr, row);
    return row;
  }
  auto measure = [&](const Options& run, std::optional<LinkModel> link) {
    Row out;
    run_threads(static_cast<int>(ranks_of(c)), [&](Communicator& world) {
      if (link) world.model_link(*link);
      bench::CommClock clock;
      bench::TimedCommunicator timed(world, clock);
      train_rank(run, data, c, &timed, &clock, out);
    });
    return out;
  };
  if (!o.link) return measure(o, std::nullopt);
  const Row compute = measure(blocking(o), std::nullopt);
  row = measure(o, o.link);
  add_hidden_fraction(row, compute);
  return row;
}

// The rows for `ranks`: every plan on a 1-D mesh, and dp x tp (ddp,tp) on
// 2 x ranks/2 when asked and ranks >= 4.
std::vector<Config> configs_for(std::int64_t ranks, const std::vector<std::string>& plans, bool two_d) {
  std::vector<Config> out;
  for (const std::string& p : plans) out.push_back({p, {ranks}, {p == "tp" || p == "tp_sp" ? "tp" : "dp"}});
  if (two_d && ranks >= 4 && ranks % 2 == 0) out.push_back({"ddp,tp", {2, ranks / 2}, {"dp", "tp"}});
  return out;
}

void print_header(const Options& o, std::string_view backend) {
  const auto& m = o.train.model;
  const std::int64_t D = m.d_model;
  const std::int64_t params =
      2 * m.vocab * D + m.seq * D + m.layers * (12 * D * D + 13 * D) + 2 * D;  // lm_head has no bias
  fmt::print(
      "train: GPT {} layers, d_model {}, {} heads, seq {}, batch {} ({:.1f}M parameters, {}), AdamW; "
      "{} warm-up + {} timed steps; {} ranks\n",
      m.layers, D, m.heads, m.seq, o.train.batch, static_cast<double>(params) / 1e6, dtype_name(m.dtype),
      o.train.warmup, o.timed_steps, backend);
  if (o.link || o.train.overlap_grad_reduce)
    fmt::print("link {}; the gradients' reduction (ddp, zero1) in buckets of {} MiB, {}; fsdp's units {} and {}\n",
               o.link ? o.link->str() : "as the machine is", o.train.gradient_buckets.bucket_mib,
               o.train.overlap_grad_reduce ? "started during the backward (--overlap)" : "after the backward",
               o.train.prefetch_units ? "prefetched" : "gathered when used (--no-prefetch)",
               o.train.overlap_unit_reduce ? "reduced under the block before's backward"
                                           : "reduced when their backward ends (--no-reduce-overlap)");
  fmt::print("{:<8} {:>6} {:>5} {:>9} {:>9} {:>8} {:>6} {:>10} {:>9} {:>6} {:>8}{}\n", "plan", "mesh", "ranks",
             "step ms", "tokens/s", "vs plain", "gemm", "comm wall", "comm cpu", "colls", "MiB",
             o.link ? fmt::format(" {:>8} {:>7}", "link ms", "hidden") : "");
}

void print_row(const Row& r, std::optional<double> plain, bool json) {
  const Config& c = r.config;
  if (json) {
    fmt::print(
        "{{\"plan\": \"{}\", \"mesh\": \"{}\", \"ranks\": {}, \"step_seconds\": {:.6f}, \"tokens_per_second\": {:.1f}, "
        "\"gemm_share\": {:.4f}, \"comm_wall_share\": {:.4f}, \"comm_cpu_share\": {:.4f}, \"collectives\": {}, "
        "\"bytes\": {}{}}}\n",
        c.mesh.empty() ? "plain" : c.plan, mesh_text(c), ranks_of(c), r.step_seconds, r.tokens_per_second,
        r.gemm_share, r.comm_wall_share, r.comm_cpu_share, r.collectives, r.bytes,
        r.hidden_fraction ? fmt::format(", \"link_seconds\": {:.6f}, \"hidden_fraction\": {:.4f}", r.link_seconds,
                                        *r.hidden_fraction)
                          : "");
  } else {
    const std::string vs = plain ? fmt::format("{:.2f}", r.tokens_per_second / *plain) : "-";
    const std::string hidden =
        r.hidden_fraction ? fmt::format(" {:>8.1f} {:>6.0f}%", 1e3 * r.link_seconds, 100 * *r.hidden_fraction) : "";
    fmt::print("{:<8} {:>6} {:>5} {:>9.1f} {:>9.0f} {:>8} {:>5.1f}% {:>9.1f}% {:>8.1f}% {:>6} {:>8.2f}{}\n",
               c.mesh.empty() ? "plain" : c.plan, mesh_text(c), ranks_of(c), 1e3 * r.step_seconds, r.tokens_per_second,
               vs, 100 * r.gemm_share, 100 * r.comm_wall_share, 100 * r.comm_cpu_share, r.collectives,
               static_cast<double>(r.bytes) / (1 << 20), hidden);
  }
  std::fflush(stdout);
}

void print_skip(const Config& c, const std::exception& e, bool json) {
  if (json)
    fmt::print("{{\"plan\": \"{}\", \"mesh\": \"{}\", \"ranks\": {}, \"skipped\": true}}\n", c.plan, mesh_text(c),
               ranks_of(c));
  else
    fmt::print("{:<8} {:>6} {:>5}  skipped: {}\n", c.plan, mesh_text(c), ranks_of(c), e.what());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"train: tokens per second of a GPT training step per parallel plan and rank count"};
  Options o;
  o.train.model = {.vocab = 256, .seq = 64, .layers = 6, .d_model = 384, .heads = 8, .dtype = DType::Float32};
  o.train.batch = 8;
  o.train.warmup = 1;
  std::vector<std::int64_t> ranks{1, 2, 4, 8};
  std::vector<std::string> plans{"ddp", "zero1", "fsdp", "tp", "tp_sp"};
  bool two_d = true, json = false, no_plain = false;
  app.add_option("--ranks", ranks, "thread rank counts (under mpirun: ignored, the job's size)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_option("--plans", plans, "1-D plans: ddp, zero1, fsdp, tp, tp_sp")->delimiter(',');
  app.add_option("--layers", o.train.model.layers)->check(CLI::PositiveNumber);
  app.add_option("--d-model", o.train.model.d_model)->check(CLI::PositiveNumber);
  app.add_option("--heads", o.train.model.heads)->check(CLI::PositiveNumber);
  app.add_option("--seq", o.train.model.seq)->check(CLI::PositiveNumber);
  app.add_option("--batch", o.train.batch, "sequences per step, all ranks together")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.train.warmup, "untimed steps first (at least 1)")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.timed_steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_flag("!--no-2d", two_d, "leave out the dp x tp rows (ddp,tp on 2 x ranks/2)");
  app.add_flag("--no-plain", no_plain, "leave out the plain one-rank row");
  app.add_flag("--json", json, "one JSON object per row instead of the table");
  app.add_flag("--overlap", o.train.overlap_grad_reduce,
               "ddp and zero1 rows: the gradients' all_reduce (reduce_scatter) started during the backward "
               "(nn::OverlappedGradientReduction); zero1's all_gather of the updated parameters under the next "
               "forward");
  bool no_param_overlap = false;
  app.add_flag("--no-param-overlap", no_param_overlap,
               "zero1 rows with --overlap: gather the updated parameters in the step, not under the next forward");
  app.add_flag("--domino", o.train.domino,
               "tp and tp_sp rows: each rank's batch rows in chunks whose tensor-parallel collectives run "
               "under each other's computation (nn::GPT::domino)");
  app.add_option("--domino-chunks", o.train.domino_chunks,
                 "with --domino: the chunks of each rank's rows; more hide a collective after a short stage "
                 "(tp_sp's all_gathers) under more computation, at smaller GEMMs (default: 2)");
  app.add_flag("!--no-prefetch", o.train.prefetch_units,
               "fsdp rows: gather each unit when its block runs, not during the block before");
  app.add_flag("!--no-reduce-overlap", o.train.overlap_unit_reduce,
               "fsdp rows: reduce each unit's gradient when its block's backward ends, not under the next block's");
  app.add_flag("!--no-reshard-after-forward", o.train.reshard_after_forward,
               "fsdp rows: keep each block's gathered unit for its backward (no second gather, no recomputation)");
  app.add_option_function<double>(
         "--bucket-mib", [&o](double mib) { o.train.gradient_buckets = nn::gradient_buckets(mib); },
         "the gradients' buckets (nn::gradient_buckets: 25, with a 1 MiB first one)")
      ->check(CLI::PositiveNumber);
  std::string link_text;
  app.add_option("--link", link_text,
                 "model a slower link on every row's ranks, e.g. 10us,5GB/s; each row also runs without it, for "
                 "the hidden column");
  try {
    app.parse(argc, argv);
    o.train.overlap_param_gather = o.train.overlap_grad_reduce && !no_param_overlap;
    if (!link_text.empty()) o.link = LinkModel::parse(link_text);
    o.train.model.check();
    for (const std::string& p : plans) (void)nn::plan_named(p);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "train: {}\n", e.what());
    return 2;
  } catch (const Error& e) {
    fmt::print(stderr, "train: {}\n", e.what());
    return 2;
  }
  const train::TextData data(train::find_text(std::nullopt));

  if (launch_backend() == "mpi") {
    // Every process runs every row on the job's ranks; launch() sees no
    // flags of ours.
    int launch_argc = 1;
    return launch(launch_argc, argv, [&](Communicator& world) {
      const bool lead = world.rank() == 0;
      if (lead && !json) print_header(o, "MPI");
      for (const Config& c : configs_for(world.size(), plans, two_d)) {
        auto measure = [&](const Options& run, std::optional<LinkModel> link) {
          world.model_link(link);
          bench::CommClock clock;
          bench::TimedCommunicator timed(world, clock);
          Row row;
          train_rank(run, data, c, &timed, &clock, row);
          return row;
        };
        Row row;
        try {
          const std::optional<Row> compute = o.link ? std::optional(measure(blocking(o), std::nullopt)) : std::nullopt;
          row = measure(o, o.link);
          if (compute) add_hidden_fraction(row, *compute);
        } catch (const ValueError& e) {  // a plan that does not fit: every rank throws it before any step
          if (lead) print_skip(c, e, json);
          continue;
        }
        if (lead) print_row(row, std::nullopt, json);
      }
    });
  }

  if (!json) print_header(o, "thread");
  std::optional<double> plain;
  if (!no_plain) {
    const Row row = measure_threads(o, data, {"plain", {}, {}});
    plain = row.tokens_per_second;
    print_row(row, plain, json);
  }
  for (const std::int64_t n : ranks) {
    for (const Config& c : configs_for(n, plans, two_d)) {
      try {
        print_row(measure_threads(o, data, c), plain, json);
      } catch (const Error& e) {
        print_skip(c, e, json);
      }
    }
  }
  return 0;
}
