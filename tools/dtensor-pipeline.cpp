// dtensor-pipeline: makes a pipeline schedule (or reads one from CSV),
// checks it, and prints its step-by-rank actions, its simulated timeline,
// makespan, bubble and peak activations per rank (nn/pipeline.h).
#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "dtensor/core/error.h"
#include "dtensor/nn/pipeline.h"
#include "dtensor/pictures/svg.h"
#include "dtensor/train/pipeline_picture.h"

namespace {

using namespace dtensor;
using namespace dtensor::nn::pipeline;

constexpr int kExitInvalid = 2;  // bad arguments, a schedule that cannot be made, an invalid --check file

struct Options {
  std::string schedule, costs = "1,1,1", check, svg;
  int ranks = 0, microbatches = 0, virtual_stages = 1, cores = 0;
  bool json = false;
};

PipelineCosts parse_costs(const std::string& text) {
  std::vector<double> values;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    double value = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (ec != std::errc() || end != item.data() + item.size() || !(value > 0))
      throw ValueError(fmt::format("[dtensor-pipeline] --costs '{}': '{}' is not a positive number", text, item));
    values.push_back(value);
  }
  if (values.size() != 3)
    throw ValueError(fmt::format("[dtensor-pipeline] --costs '{}': {} values; expected three, F,I,W (B = I + W)", text,
                                 values.size()));
  PipelineCosts costs;
  costs.forward = values[0];
  costs.input_backward = values[1];
  costs.weight_backward = values[2];
  return costs;
}

Schedule read_checked(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw ValueError(fmt::format("[dtensor-pipeline] --check {}: cannot be read", path));
  std::stringstream text;
  text << file.rdbuf();
  Schedule schedule = from_csv(text.str());
  // A compute-only file gets its messages (lower validates); a complete one is taken as it is.
  if (schedule.has_communication())
    validate(schedule);
  else
    lower(schedule);
  return schedule;
}

Schedule compute_only(Schedule schedule) {
  for (auto& list : schedule.actions) std::erase_if(list, [](const Action& a) { return !is_compute(a.kind); });
  return schedule;
}

void print_json(const Schedule& schedule, const SimulationResult& result) {
  nlohmann::ordered_json out;
  out["schedule"] = schedule.name;
  out["stages"] = schedule.stages;
  out["microbatches"] = schedule.microbatches;
  nlohmann::ordered_json actions = nlohmann::ordered_json::object();
  for (int rank = 0; rank < schedule.ranks(); ++rank) {
    std::vector<std::string> texts;
    for (const Action& a : schedule.actions[rank])
      if (is_compute(a.kind)) texts.push_back(action_text(a));
    actions[std::to_string(rank)] = texts;
  }
  out["actions"] = actions;
  out["makespan"] = result.makespan;
  out["bubble_fraction"] = result.bubble_fraction;
  out["peak_microbatches"] = result.peak_microbatches;
  fmt::print("{}\n", out.dump());
}

// How the ranks get their cores, where they share them.
std::string sharing(const PipelineCosts& costs, const Schedule& schedule) {
  return costs.cores > 0 && costs.cores < schedule.ranks() ? fmt::format("; the ranks sharing {} cores", costs.cores)
                                                           : "";
}

void print_text(const Schedule& schedule, const SimulationResult& result, const PipelineCosts& costs) {
  fmt::print("schedule {}: {} ranks, {} stages, {} microbatches\n", schedule.name, schedule.ranks(), schedule.stages,
             schedule.microbatches);
  fmt::print("\nactions, step by rank:\n{}", grid_text(compute_only(schedule)));
  const double unit = std::min({costs.forward, costs.input_backward, costs.weight_backward});
  fmt::print("\ntimeline (one column per time unit of {:g}; '.' idle):\n{}", unit,
             timeline_text(schedule, result, unit));
  fmt::print("\nmakespan {:g} (F={:g}, I={:g}, W={:g}, B=I+W; messages free{})\n", result.makespan, costs.forward,
             costs.input_backward, costs.weight_backward, sharing(costs, schedule));
  fmt::print("bubble fraction {:.4f} (idle over makespan, mean over ranks); idle over busy {:.4f}\n",
             result.bubble_fraction, result.bubble_ratio);
  std::vector<std::string> idle;
  for (double t : result.idle) idle.push_back(fmt::format("{:g}", t));
  fmt::print("idle per rank: {}\n", fmt::join(idle, " "));
  fmt::print("peak microbatches held per rank: {}\n", fmt::join(result.peak_microbatches, " "));
}

// The simulated timeline as a picture: one row per rank, the bubble hatched.
void write_svg(const std::string& path, const Schedule& schedule, const SimulationResult& result,
               const PipelineCosts& costs) {
  std::vector<pictures::ScheduleRow> rows(schedule.ranks());
  for (int rank = 0; rank < schedule.ranks(); ++rank) rows[rank].name = fmt::format("rank {}", rank);
  for (const TimedAction& t : result.timeline)
    rows[t.rank].boxes.push_back({action_text(t.action), train::box_kind(t.action.kind), t.start, t.end,
                                  fmt::format("{}: stage {}, microbatch {}, from {:g} to {:g}", action_text(t.action),
                                              t.action.stage, t.action.microbatch, t.start, t.end)});
  pictures::SchedulePictureOptions options;
  options.title = fmt::format("{}: {} ranks, {} stages, {} microbatches", schedule.name, schedule.ranks(),
                              schedule.stages, schedule.microbatches);
  options.subtitle =
      fmt::format("simulated (F={:g}, I={:g}, W={:g}{}): makespan {:g}, bubble {:.1f}% of the makespan", costs.forward,
                  costs.input_backward, costs.weight_backward, sharing(costs, schedule), result.makespan,
                  100 * result.bubble_fraction);
  std::ofstream out(path);
  out << pictures::schedule_svg(rows, options);
  if (!out) throw ValueError(fmt::format("[dtensor-pipeline] --svg {}: cannot be written", path));
}

int run(const Options& o) {
  PipelineCosts costs = parse_costs(o.costs);
  costs.cores = o.cores;
  if (!o.check.empty()) {
    Schedule schedule = read_checked(o.check);
    SimulationResult result = simulate(schedule, costs);
    if (o.json)
      print_json(schedule, result);
    else
      fmt::print("{}: valid ({} ranks, {} stages, {} microbatches); simulated makespan {:g}\n", o.check,
                 schedule.ranks(), schedule.stages, schedule.microbatches, result.makespan);
    return 0;
  }
  if (o.schedule.empty())
    throw ValueError(
        "[dtensor-pipeline] expected --schedule NAME (one of gpipe, 1f1b, interleaved, zb-h1, zbv, dualpipev) or "
        "--check");
  Schedule schedule = make_schedule(o.schedule, o.ranks, o.microbatches, o.virtual_stages);
  lower(schedule);  // proves it runs with blocking sends
  SimulationResult result = simulate(schedule, costs);
  if (!o.svg.empty()) write_svg(o.svg, schedule, result, costs);
  if (o.json)
    print_json(schedule, result);
  else
    print_text(schedule, result, costs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App
      app{"Makes, checks and simulates pipeline schedules: the actions of each rank, the timeline, the "
          "makespan, the bubble and the activations held.",
          "dtensor-pipeline"};
  app.add_option("--schedule", o.schedule, "gpipe, 1f1b, interleaved, zb-h1, zbv or dualpipev");
  app.add_option("--stages", o.ranks, "P: pipeline ranks (with --virtual V each holds V stages)");
  app.add_option("--microbatches", o.microbatches, "M: microbatches per step");
  app.add_option("--virtual", o.virtual_stages, "V: stages per rank (interleaved; zbv and dualpipev hold 2)")
      ->capture_default_str();
  app.add_option("--costs", o.costs, "F,I,W: time of a forward, input- and weight-gradient per stage")
      ->capture_default_str();
  app.add_option("--cores", o.cores,
                 "C: cores the ranks share, computing ranks taking equal turns (thread ranks on a small "
                 "machine); 0: a core per rank")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--json", o.json, "print one JSON object instead of the text");
  app.add_option("--svg", o.svg, "also draw the simulated timeline as an SVG picture in this file");
  app.add_option("--check", o.check, "validate a CSV schedule (one row of actions per rank)");
  app.footer(
      "Example: dtensor-pipeline --schedule 1f1b --stages 4 --microbatches 8\n"
      "Exit status: 0 ok, 2 bad arguments, a schedule that cannot be made, or an invalid --check file.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "dtensor-pipeline: {} (see --help)\n", e.what());
    return kExitInvalid;
  }
  try {
    return run(o);
  } catch (const ValueError& e) {
    fmt::print(stderr, "dtensor-pipeline: {}\n", e.what());
    return kExitInvalid;
  }
}
