// Pipeline schedules measured against their simulation: the GPT (8 layers,
// d_model 256, 8 heads, seq 64, 4 sequences a microbatch, f32) on p = 4
// thread ranks with m = 8 microbatches under every schedule (gpipe, 1f1b,
// interleaved with 2 stages a rank, zb-h1, zbv, dualpipev), each step's
// makespan and bubble as run_step's timelines measure them next to what
// nn::pipeline::simulate predicts from costs calibrated in a short run.
//
// Calibration, per placement: the schedules with one stage per rank share
// p stages of layers/p blocks, the others (interleaved, zbv, dualpipev) 2p
// stages of half as many. Each placement's stages are calibrated on their
// own rather than per block and scaled: the first stage also embeds and the
// last also runs the lm_head and the loss, which per-block scaling cannot
// separate from the blocks at p = 2 (no middle stage), and a block does not
// cost the same in every schedule when ranks share cores. For p stages a
// 1f1b run gives F and B, a zb-h1 run I and W; for 2p stages an interleaved
// run F and B, a zbv run I and W (F: the mean over both runs). Each is one
// warm-up and --calibration-steps (1) timed step in every round, before and
// apart from that round's measured steps, pooled over the rounds (the VM's
// speed drifts over minutes; calibrating once at the start put some runs
// 20% off). So 1f1b, zb-h1, interleaved and zbv are predicted from short
// runs of their own, gpipe and dualpipev from the others'. simulate() has one backward cost, B = I + W: a
// schedule whose backwards are mostly full B (gpipe, 1f1b, interleaved,
// dualpipev) gets each stage's I and W scaled to sum to its measured B; the
// split schedules (zb-h1, zbv) get I and W as measured. The message cost is
// a ping-pong between two idle thread ranks (8 bytes and the activation's
// bytes, half the median round trip) fitted to latency + bytes / bandwidth.
//
// Measurement: --rounds (3) rounds, each running every schedule in turn (so
// that they see the same machine load) for --warmup (1) untimed and --steps
// (3) timed steps; every rank reads steady_clock after a barrier just before
// run_step, which puts the ranks' timelines on one clock. A step's makespan
// runs from the earliest rank's start to the latest rank's last action; its
// bubble is simulate()'s: per rank (makespan - compute time) / makespan,
// averaged over ranks. Medians over all timed steps. `error`: measured over
// simulated - 1. `busy x`: the measured compute time (all ranks) over the
// simulated: how far the actions themselves ran from their calibration.
// `others`: the CPU share other processes took meanwhile (OthersLoad);
// `maps`: host blocks mapped afresh a step (the host cache's misses).
//
// Thread ranks share the machine's cores: with more ranks than cores a rank
// computes at a fraction of a core while others compute, and an idle rank
// lends its core to the others, which simulate()'s p independent ranks do
// not see. The `shared` columns are simulate() with PipelineCosts::cores =
// --cores (default: the hardware threads): the computing ranks share the
// cores, each action's work being its CPU time in the calibration runs
// under the same sharing (pipeline_shared.h). Where p <= cores it is the
// plain simulate() again.
//
// Run (OPENBLAS_CORETYPE unset for figures you quote):
//   env -u OPENBLAS_CORETYPE build/bench/pipeline                 # p = 4, m = 8, every schedule
//   env -u OPENBLAS_CORETYPE build/bench/pipeline --ranks 2       # one rank per core on a 2-core machine
//   build/bench/pipeline --schedules 1f1b,zb-h1 --json rows.json --svg zb_h1.svg
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include <dtensor/pictures/svg.h>
#include <dtensor/train/pipeline_picture.h>

#include "pipeline_measure.h"
#include "pipeline_shared.h"

using namespace dtensor;
using namespace dtensor::bench::pipeline;

namespace {

struct Options {
  ModelSpec spec{.model = {.vocab = 256, .seq = 64, .layers = 8, .d_model = 256, .heads = 8, .dtype = DType::Float32},
                 .batch = 4,
                 .seed = 1};
  int ranks = 4, microbatches = 8, warmup = 1, steps = 3, rounds = 3, calibration_steps = 1, round_trips = 50;
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::int64_t host_cache_mb = -1;  // -1: the library's limit
  std::vector<std::string> schedules = pipe::schedule_names();
  std::string json, svg, svg_schedule = "zb-h1";
};

// One placement's calibration runs, their steps pooled over the rounds.
struct CalibrationRuns {
  pipe::Schedule full, split;  // full backwards (F, B), split ones (I, W)
  std::vector<MeasuredStep> full_steps, split_steps;
  double others_load = 0;  // the mean over the rounds
};

// Per placement (by stage count): each stage's measured times (wall) and
// their CPU time under the calibration runs' sharing of the cores (work).
struct Calibration {
  std::map<int, CalibrationRuns> runs;
  std::map<int, std::vector<StageTimes>> wall, work;
  LinkFit link;
  std::int64_t message_bytes = 0;
};

struct Row {
  pipe::Schedule schedule;
  pipe::PipelineCosts costs, work;
  pipe::SimulationResult simulated, shared;
  std::vector<MeasuredStep> steps;  // every round's timed steps
  std::vector<StepFigures> figures;
  StepFigures measured;  // medians over the steps
  std::size_t median_step = 0;
  double others_load = 0, host_misses = 0;  // means over the rounds
  double error() const { return measured.makespan / simulated.makespan - 1; }
  double shared_error() const { return measured.makespan / shared.makespan - 1; }
  double busy_ratio() const {
    double sim = 0;
    for (double b : simulated.busy) sim += b;
    return measured.busy / sim;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

pipe::Schedule lowered(const std::string& name, const Options& o) {
  pipe::Schedule s = pipe::make_schedule(name, o.ranks, o.microbatches, name == "interleaved" ? 2 : 1);
  return o.ranks > 1 ? pipe::lower(s) : s;
}

// The schedules that calibrate a placement of `stages` stages: one with
// full backwards (F, B) and one with split ones (I, W).
std::pair<pipe::Schedule, pipe::Schedule> calibration_runs(const Options& o, int stages) {
  if (stages == o.ranks) return {lowered("1f1b", o), lowered("zb-h1", o)};
  return {lowered("interleaved", o), lowered("zbv", o)};
}

// F and B of `full`'s stages with I and W of `split`'s; F the mean of both.
std::vector<StageTimes> combine(const std::vector<StageTimes>& full, const std::vector<StageTimes>& split) {
  std::vector<StageTimes> out(full.size());
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = {(full[i].forward + split[i].forward) / 2, full[i].backward, split[i].input_backward,
              split[i].weight_backward};
  return out;
}

void print_calibration(const std::vector<StageTimes>& wall, const std::vector<StageTimes>& work) {
  fmt::print("  {:>5} {:>7} {:>7} {:>7} {:>7} {:>8} | {:>6} {:>6} {:>6} {:>6}\n", "stage", "F", "B", "I", "W",
             "(I+W)/B", "F cpu", "B cpu", "I cpu", "W cpu");
  for (std::size_t i = 0; i < wall.size(); ++i) {
    const StageTimes &t = wall[i], &c = work[i];
    fmt::print("  {:>5} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>8.2f} | {:>6.2f} {:>6.2f} {:>6.2f} {:>6.2f}\n", i,
               1e3 * t.forward, 1e3 * t.backward, 1e3 * t.input_backward, 1e3 * t.weight_backward,
               (t.input_backward + t.weight_backward) / t.backward, 1e3 * c.forward, 1e3 * c.backward,
               1e3 * c.input_backward, 1e3 * c.weight_backward);
  }
}

// One round's calibration steps of a placement, added to its runs.
void calibration_round(const Options& o, CalibrationRuns& runs) {
  const OthersLoad load;
  for (MeasuredStep& step : run_steps(o.spec, runs.full, 1, o.calibration_steps).steps)
    runs.full_steps.push_back(std::move(step));
  for (MeasuredStep& step : run_steps(o.spec, runs.split, 1, o.calibration_steps).steps)
    runs.split_steps.push_back(std::move(step));
  runs.others_load += load.share() / o.rounds;
}

// The placement of `stages` stages' times from its pooled calibration steps.
void calibrate(const Options& o, int stages, Calibration& cal) {
  const CalibrationRuns& runs = cal.runs.at(stages);
  cal.wall[stages] = combine(stage_means(runs.full_steps, stages), stage_means(runs.split_steps, stages));
  cal.work[stages] =
      combine(stage_work(runs.full_steps, stages, o.cores), stage_work(runs.split_steps, stages, o.cores));
  fmt::print(
      "calibration of {} stages ({} and {}, {} step(s) each after a warm-up one in each round; other processes "
      "{:.0f}% of the CPUs), ms:\n",
      stages, runs.full.name, runs.split.name, o.calibration_steps, 100 * runs.others_load);
  print_calibration(cal.wall[stages], cal.work[stages]);
  // The shared model's reading of the CPU time against the threads' own clocks
  // (which also count the messages' copies and the step's bookkeeping).
  double model = 0, threads = 0;
  for (const auto* steps : {&runs.full_steps, &runs.split_steps})
    for (const MeasuredStep& step : *steps) {
      for (double w : action_work(step, o.cores)) model += w;
      for (const RankStep& r : step) threads += r.cpu;
    }
  fmt::print(
      "  CPU time of these steps: {:.0f} ms as the shared model reads the timelines, {:.0f} ms by the threads' "
      "clocks\n",
      1e3 * model, 1e3 * threads);
}

// simulate()'s costs for `schedule` from its placement's stage times.
pipe::PipelineCosts costs_for(const pipe::Schedule& schedule, const std::vector<StageTimes>& times,
                              const Calibration& cal) {
  int full = 0, split = 0;
  for (const auto& list : schedule.actions)
    for (const pipe::Action& a : list) {
      full += a.kind == pipe::ActionKind::Backward;
      split += a.kind == pipe::ActionKind::BackwardInput;
    }
  pipe::PipelineCosts costs;
  for (const StageTimes& t : times) {
    const double iw = t.input_backward + t.weight_backward;
    const double scale = full > split && iw > 0 ? t.backward / iw : 1.0;
    costs.per_stage.push_back({t.forward, scale * t.input_backward, scale * t.weight_backward});
  }
  costs.link = cal.link.link;
  costs.message_bytes = cal.message_bytes;
  return costs;
}

void predict(const Options& o, const Calibration& cal, Row& row) {
  row.costs = costs_for(row.schedule, cal.wall.at(row.schedule.stages), cal);
  row.work = costs_for(row.schedule, cal.work.at(row.schedule.stages), cal);
  row.simulated = pipe::simulate(row.schedule, row.costs);
  pipe::PipelineCosts shared = row.work;
  shared.cores = o.cores;
  row.shared = pipe::simulate(row.schedule, shared);
}

// One round's steps of `row`'s schedule, added to it.
void measure_round(const Options& o, Row& row) {
  const OthersLoad load;
  Run run = run_steps(o.spec, row.schedule, o.warmup, o.steps);
  row.others_load += load.share() / o.rounds;
  row.host_misses += static_cast<double>(run.host_misses) / o.steps / o.rounds;
  for (MeasuredStep& s : run.steps) {
    row.figures.push_back(figures(s));
    row.steps.push_back(std::move(s));
  }
}

void summarize(Row& row) {
  std::vector<double> makespans, bubbles, own, busy;
  for (const StepFigures& f : row.figures) {
    makespans.push_back(f.makespan);
    bubbles.push_back(f.bubble);
    own.push_back(f.own_span_bubble);
    busy.push_back(f.busy);
  }
  row.measured = {median(makespans), median(bubbles), median(own), median(busy)};
  for (std::size_t i = 0; i < makespans.size(); ++i)  // the step nearest the median, for the picture
    if (std::abs(makespans[i] - row.measured.makespan) < std::abs(makespans[row.median_step] - row.measured.makespan))
      row.median_step = i;
}

void print_table_header() {
  fmt::print("{:<12} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>7} {:>6}\n", "schedule", "stages",
             "sim ms", "meas ms", "error", "sim bub", "meas bub", "shared", "sh err", "sh bub", "busy x", "others",
             "maps");
}

void print_row(const Row& r) {
  fmt::print(
      "{:<12} {:>6} {:>8.1f} {:>8.1f} {:>+7.1f}% {:>7.1f}% {:>7.1f}% {:>8.1f} {:>+7.1f}% {:>7.1f}% {:>7.2f} {:>6.0f}% "
      "{:>6.0f}\n",
      r.schedule.name, r.schedule.stages, 1e3 * r.simulated.makespan, 1e3 * r.measured.makespan, 100 * r.error(),
      100 * r.simulated.bubble_fraction, 100 * r.measured.bubble, 1e3 * r.shared.makespan, 100 * r.shared_error(),
      100 * r.shared.bubble_fraction, r.busy_ratio(), 100 * r.others_load, r.host_misses);
  std::fflush(stdout);
}

const Row* find(const std::vector<Row>& rows, const std::string& name) {
  for (const Row& r : rows)
    if (r.schedule.name == name) return &r;
  return nullptr;
}

// 1F1B's step less ZB-H1's in each round (their medians there): the two
// run one after the other, so each difference sees one state of the machine.
std::vector<double> round_savings(const Row& one, const Row& zb, int steps_per_round) {
  std::vector<double> out;
  const auto per_round = static_cast<std::size_t>(steps_per_round);
  for (std::size_t first = 0; first + per_round <= one.figures.size(); first += per_round) {
    std::vector<double> a, b;
    for (std::size_t i = first; i < first + per_round; ++i) {
      a.push_back(one.figures[i].makespan);
      b.push_back(zb.figures[i].makespan);
    }
    out.push_back(median(a) - median(b));
  }
  return out;
}

std::vector<double> scaled(std::vector<double> v, double by) {
  for (double& x : v) x *= by;
  return v;
}

// The median absolute errors, and ZB-H1's saving over 1F1B predicted and measured.
nlohmann::json print_summary(const std::vector<Row>& rows, int steps_per_round) {
  std::vector<double> errors, shared;
  for (const Row& r : rows) {
    errors.push_back(std::abs(r.error()));
    shared.push_back(std::abs(r.shared_error()));
  }
  nlohmann::json summary{{"median_abs_error", median(errors)}, {"median_abs_error_shared", median(shared)}};
  fmt::print("median |error| over {} schedules: simulate() {:.1f}%, shared cores {:.1f}% (goal < 10%)\n", rows.size(),
             100 * median(errors), 100 * median(shared));
  const Row *one = find(rows, "1f1b"), *zb = find(rows, "zb-h1");
  if (!one || !zb) return summary;
  const double sim = one->simulated.makespan - zb->simulated.makespan;
  const double sh = one->shared.makespan - zb->shared.makespan;
  const double meas = one->measured.makespan - zb->measured.makespan;
  const std::vector<double> paired = round_savings(*one, *zb, steps_per_round);
  const std::string ratio =
      sim > 0 ? fmt::format("{:.2f} of it; goal >= 0.5", meas / sim) : "the simulation predicts no saving";
  fmt::print("ZB-H1 vs 1F1B: simulated saving {:.1f} ms, measured {:.1f} ms ({}); shared cores predict {:.1f} ms\n",
             1e3 * sim, 1e3 * meas, ratio, 1e3 * sh);
  fmt::print("  measured saving round by round (medians of each round's steps): {:.1f} ms\n",
             fmt::join(scaled(paired, 1e3), ", "));
  summary["zb_h1_saving"] = {{"simulated_seconds", sim},
                             {"shared_seconds", sh},
                             {"measured_seconds", meas},
                             {"ratio", meas / sim},
                             {"measured_by_round_seconds", paired}};
  return summary;
}

// The measured step of the median makespan as a picture, in milliseconds.
void write_svg(const Options& o, const Row& r) {
  std::vector<pictures::ScheduleRow> rows(static_cast<std::size_t>(r.schedule.ranks()));
  for (int rank = 0; rank < r.schedule.ranks(); ++rank) rows[rank].name = fmt::format("rank {}", rank);
  for (const pipe::TimedAction& t : aligned_actions(r.steps.at(r.median_step)))
    rows[t.rank].boxes.push_back(
        {pipe::action_text(t.action), train::box_kind(t.action.kind), 1e3 * t.start, 1e3 * t.end,
         fmt::format("{}: {:.2f} to {:.2f} ms", pipe::action_text(t.action), 1e3 * t.start, 1e3 * t.end)});
  pictures::SchedulePictureOptions options;
  options.title = fmt::format("{}, measured: {} thread ranks on {} cores, {} stages, {} microbatches", r.schedule.name,
                              r.schedule.ranks(), o.cores, r.schedule.stages, r.schedule.microbatches);
  options.subtitle = fmt::format(
      "GPT {} layers, d_model {}, seq {}, batch {} a microbatch, {}; time in ms; makespan {:.1f} (simulated {:.1f}), "
      "bubble {:.1f}% (simulated {:.1f}%)",
      o.spec.model.layers, o.spec.model.d_model, o.spec.model.seq, o.spec.batch, dtype_name(o.spec.model.dtype),
      1e3 * r.figures.at(r.median_step).makespan, 1e3 * r.simulated.makespan, 100 * r.figures.at(r.median_step).bubble,
      100 * r.simulated.bubble_fraction);
  std::ofstream out(o.svg);
  out << pictures::schedule_svg(rows, options);
  if (!out) throw ValueError(fmt::format("[pipeline] --svg {}: cannot be written", o.svg));
}

nlohmann::json row_json(const Row& r) {
  nlohmann::json costs = nlohmann::json::array(), work = nlohmann::json::array(), makespans = nlohmann::json::array();
  for (const auto& c : r.costs.per_stage)
    costs.push_back({{"F", c.forward}, {"I", c.input_backward}, {"W", c.weight_backward}});
  for (const auto& c : r.work.per_stage)
    work.push_back({{"F", c.forward}, {"I", c.input_backward}, {"W", c.weight_backward}});
  for (const StepFigures& s : r.figures) makespans.push_back(s.makespan);
  return {{"schedule", r.schedule.name},
          {"ranks", r.schedule.ranks()},
          {"stages", r.schedule.stages},
          {"microbatches", r.schedule.microbatches},
          {"simulated_makespan", r.simulated.makespan},
          {"measured_makespan", r.measured.makespan},
          {"error", r.error()},
          {"simulated_bubble", r.simulated.bubble_fraction},
          {"measured_bubble", r.measured.bubble},
          {"measured_bubble_own_span", r.measured.own_span_bubble},
          {"shared_makespan", r.shared.makespan},
          {"shared_error", r.shared_error()},
          {"shared_bubble", r.shared.bubble_fraction},
          {"busy_ratio", r.busy_ratio()},
          {"measured_makespans", makespans},
          {"costs_seconds", costs},
          {"work_seconds", work},
          {"message_seconds", r.costs.message_seconds()},
          {"others_load", r.others_load},
          {"host_misses_per_step", r.host_misses}};
}

nlohmann::json stage_json(const std::vector<StageTimes>& times) {
  nlohmann::json out = nlohmann::json::array();
  for (const StageTimes& t : times)
    out.push_back({{"F", t.forward}, {"B", t.backward}, {"I", t.input_backward}, {"W", t.weight_backward}});
  return out;
}

nlohmann::json calibration_json(const Calibration& cal) {
  nlohmann::json out{{"message_bytes", cal.message_bytes},
                     {"message_seconds", cal.link.message_seconds},
                     {"small_message_seconds", cal.link.small_seconds},
                     {"placements", nlohmann::json::array()}};
  for (const auto& [stages, wall] : cal.wall)
    out["placements"].push_back({{"stages", stages},
                                 {"seconds", stage_json(wall)},
                                 {"work_seconds", stage_json(cal.work.at(stages))},
                                 {"others_load", cal.runs.at(stages).others_load}});
  return out;
}

void write_json(const Options& o, const Calibration& cal, const std::vector<Row>& rows, nlohmann::json summary) {
  nlohmann::json doc{{"ranks", o.ranks},
                     {"microbatches", o.microbatches},
                     {"layers", o.spec.model.layers},
                     {"d_model", o.spec.model.d_model},
                     {"seq", o.spec.model.seq},
                     {"batch", o.spec.batch},
                     {"cores", o.cores},
                     {"steps", o.steps},
                     {"rounds", o.rounds},
                     {"host_cache_limit", host_memory_stats().limit},
                     {"calibration", calibration_json(cal)},
                     {"summary", std::move(summary)},
                     {"rows", nlohmann::json::array()}};
  for (const Row& r : rows) doc["rows"].push_back(row_json(r));
  std::ofstream out(o.json);
  out << doc.dump(2) << "\n";
  if (!out) throw ValueError(fmt::format("[pipeline] --json {}: cannot be written", o.json));
}

// The message cost, and the calibration runs each placement needs.
Calibration start_calibration(const Options& o) {
  const auto& m = o.spec.model;
  Calibration cal;
  cal.message_bytes = o.spec.batch * m.seq * m.d_model * static_cast<std::int64_t>(itemsize(m.dtype));
  cal.link = measure_link(static_cast<std::size_t>(cal.message_bytes), o.round_trips);
  fmt::print("message: {} bytes, {:.1f} us one way (8 bytes: {:.1f} us; {:.2f} GB/s)\n", cal.message_bytes,
             1e6 * cal.link.message_seconds, 1e6 * cal.link.small_seconds, cal.link.link.bandwidth_Bps / 1e9);
  for (const std::string& name : o.schedules) {
    const int stages = lowered(name, o).stages;
    if (cal.runs.count(stages)) continue;
    auto [full, split] = calibration_runs(o, stages);
    cal.runs[stages] = {std::move(full), std::move(split), {}, {}, 0};
  }
  return cal;
}

int run(const Options& o) {
  const auto& m = o.spec.model;
  if (o.host_cache_mb >= 0) set_host_cache_limit(static_cast<std::size_t>(o.host_cache_mb) << 20);
  fmt::print(
      "pipeline: GPT {} layers, d_model {}, {} heads, seq {}, batch {} a microbatch, {}; p = {} thread ranks on {} "
      "cores{}, m = {}; {} round(s) of {} warm-up + {} timed steps a schedule; host cache {} MiB\n",
      m.layers, m.d_model, m.heads, m.seq, o.spec.batch, dtype_name(m.dtype), o.ranks, o.cores,
      o.ranks > o.cores ? " (ranks share cores)" : "", o.microbatches, o.rounds, o.warmup, o.steps,
      host_memory_stats().limit >> 20);
  Calibration cal = start_calibration(o);
  std::vector<Row> rows;
  for (const std::string& name : o.schedules) {
    rows.emplace_back();
    rows.back().schedule = lowered(name, o);
  }
  // Each round calibrates again before it measures: the calibration sees the
  // same machine as the steps it predicts (a VM's speed drifts over minutes).
  for (int round = 0; round < o.rounds; ++round) {
    for (auto& [stages, runs] : cal.runs) calibration_round(o, runs);
    for (Row& row : rows) measure_round(o, row);
  }
  for (const auto& [stages, runs] : cal.runs) calibrate(o, stages, cal);
  for (Row& row : rows) predict(o, cal, row);
  print_table_header();
  for (Row& row : rows) {
    summarize(row);
    print_row(row);
  }
  nlohmann::json summary = print_summary(rows, o.steps);
  if (!o.json.empty()) write_json(o, cal, rows, std::move(summary));
  if (!o.svg.empty()) {
    const Row* r = find(rows, o.svg_schedule);
    if (!r) throw ValueError(fmt::format("[pipeline] --svg-schedule {}: not among the schedules run", o.svg_schedule));
    write_svg(o, *r);
  }
  return 0;
}

void add_options(CLI::App& app, Options& o) {
  app.add_option("--ranks", o.ranks, "pipeline ranks p (thread ranks)")->check(CLI::Range(2, 64));
  app.add_option("--microbatches", o.microbatches, "microbatches m")->check(CLI::PositiveNumber);
  app.add_option("--schedules", o.schedules, "gpipe, 1f1b, interleaved, zb-h1, zbv, dualpipev")->delimiter(',');
  app.add_option("--steps", o.steps, "timed steps a schedule in each round")->check(CLI::PositiveNumber);
  app.add_option("--rounds", o.rounds, "rounds over the schedules")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps before each round's timed ones")->check(CLI::NonNegativeNumber);
  app.add_option("--calibration-steps", o.calibration_steps, "timed steps of each calibration run in each round")
      ->check(CLI::PositiveNumber);
  app.add_option("--cores", o.cores, "cores the shared model gives the ranks (default: the hardware threads)")
      ->check(CLI::PositiveNumber);
  app.add_option("--host-cache-mb", o.host_cache_mb, "the host cache's limit (default: the library's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--layers", o.spec.model.layers)->check(CLI::PositiveNumber);
  app.add_option("--d-model", o.spec.model.d_model)->check(CLI::PositiveNumber);
  app.add_option("--heads", o.spec.model.heads)->check(CLI::PositiveNumber);
  app.add_option("--seq", o.spec.model.seq)->check(CLI::PositiveNumber);
  app.add_option("--batch", o.spec.batch, "sequences a microbatch")->check(CLI::PositiveNumber);
  app.add_option("--json", o.json, "write the rows to FILE");
  app.add_option("--svg", o.svg, "draw a measured step (of --svg-schedule) to FILE");
  app.add_option("--svg-schedule", o.svg_schedule, "the schedule --svg draws (default zb-h1)");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pipeline: each schedule's measured step against its simulation from calibrated costs"};
  Options o;
  add_options(app, o);
  try {
    app.parse(argc, argv);
    o.spec.model.check();
    for (const std::string& name : o.schedules) {  // refused here, before any rank runs
      const int stages = lowered(name, o).stages;
      (void)pipe::split_layers(o.spec.model.layers, stages);
      (void)calibration_runs(o, stages);
    }
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "pipeline: {}\n", e.what());
    return 2;
  } catch (const Error& e) {
    fmt::print(stderr, "pipeline: {}\n", e.what());
    return 2;
  }
  try {
    return run(o);
  } catch (const Error& e) {
    fmt::print(stderr, "pipeline: {}\n", e.what());
    return 1;
  }
}
