// The timing simulation of a schedule: each rank runs its compute actions
// in order, each starting when its rank is free and its input is there.
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/nn/pipeline.h"

namespace dtensor::nn::pipeline {

PipelineCosts::StageCosts PipelineCosts::of_stage(int stage) const {
  if (stage >= 0 && stage < static_cast<int>(per_stage.size())) return per_stage[stage];
  return {forward, input_backward, weight_backward};
}

double PipelineCosts::message_seconds() const {
  if (!link) return 0;
  return link->hop_latency_s + static_cast<double>(message_bytes) / link->bandwidth_Bps;
}

namespace {

constexpr double kNotYet = std::numeric_limits<double>::quiet_NaN();

// End times of what later actions wait for, per (stage, microbatch).
struct Finished {
  std::vector<std::vector<double>> forward, input_gradient, weight_gradient;
  Finished(int stages, int microbatches)
      : forward(stages, std::vector<double>(microbatches, kNotYet)),
        input_gradient(forward),
        weight_gradient(forward) {}
};

double action_cost(const Action& a, const PipelineCosts& costs) {
  auto stage = costs.of_stage(a.stage);
  switch (a.kind) {
    case ActionKind::Forward: return stage.forward;
    case ActionKind::Backward: return stage.input_backward + stage.weight_backward;
    case ActionKind::BackwardInput: return stage.input_backward;
    case ActionKind::BackwardWeight: return stage.weight_backward;
    default: return 0;
  }
}

// When `a`'s inputs are there (NaN if not yet): the previous stage's
// forward output, the next stage's input gradient, this stage's own forward
// or I. Messages from another rank add their time.
double inputs_ready(const Schedule& schedule, const Action& a, const Finished& done, const PipelineCosts& costs) {
  const int mb = a.microbatch;
  auto from_stage = [&](int producer_stage, double end) {
    bool remote = schedule.rank_of_stage(producer_stage) != schedule.rank_of_stage(a.stage);
    return remote ? end + costs.message_seconds() : end;
  };
  switch (a.kind) {
    case ActionKind::Forward: return a.stage == 0 ? 0.0 : from_stage(a.stage - 1, done.forward[a.stage - 1][mb]);
    case ActionKind::Backward:
    case ActionKind::BackwardInput: {
      double own = done.forward[a.stage][mb];
      if (a.stage == schedule.stages - 1) return own;
      double gradient = from_stage(a.stage + 1, done.input_gradient[a.stage + 1][mb]);
      // std::max would drop a NaN (not yet) on one side.
      return std::isnan(own) || std::isnan(gradient) ? kNotYet : std::max(own, gradient);
    }
    case ActionKind::BackwardWeight: return done.input_gradient[a.stage][mb];
    default: return 0.0;
  }
}

void record(Finished& done, const Action& a, double end) {
  switch (a.kind) {
    case ActionKind::Forward: done.forward[a.stage][a.microbatch] = end; break;
    case ActionKind::Backward:
      done.input_gradient[a.stage][a.microbatch] = end;
      done.weight_gradient[a.stage][a.microbatch] = end;
      break;
    case ActionKind::BackwardInput: done.input_gradient[a.stage][a.microbatch] = end; break;
    case ActionKind::BackwardWeight: done.weight_gradient[a.stage][a.microbatch] = end; break;
    default: break;
  }
}

void check_ranges(const Schedule& schedule, const Action& a, int rank) {
  if (a.stage < 0 || a.stage >= schedule.stages || a.microbatch < 0 || a.microbatch >= schedule.microbatches)
    throw ValueError(fmt::format("[pipeline] simulate: rank {} action {}: expected stage < {} and microbatch < {}",
                                 rank, a, schedule.stages, schedule.microbatches));
}

// Activations held on each rank, stepping through its actions in order: a
// forward stores one; B frees it, or W where the backward is split.
std::vector<int> peak_held(const Schedule& schedule) {
  std::vector<int> peaks;
  for (const auto& list : schedule.actions) {
    int held = 0, peak = 0;
    for (const Action& a : list) {
      if (a.kind == ActionKind::Forward) peak = std::max(peak, ++held);
      if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight) --held;
    }
    peaks.push_back(peak);
  }
  return peaks;
}

// Idle time, the bubble and the peaks, from the timeline's busy times and makespan.
void summarize(const Schedule& schedule, SimulationResult& result);

[[noreturn]] void never_runs(const Schedule& schedule, int rank, std::size_t position) {
  throw ValueError(
      fmt::format("[pipeline] simulate: rank {} cannot run position {} ({}): its input is never "
                  "produced; validate() names the cause\n{}",
                  rank, position, schedule.actions[rank][position], grid_text(schedule)));
}

// Ranks sharing `cores` cores: time advances from one event (an action
// ends, an input arrives) to the next, the running actions each doing
// min(1, cores / running) of their work per second meanwhile.
void simulate_shared(const Schedule& schedule, const PipelineCosts& costs, SimulationResult& result) {
  constexpr double kNever = std::numeric_limits<double>::infinity();
  const int ranks = schedule.ranks();
  Finished done(schedule.stages, schedule.microbatches);
  std::vector<std::size_t> next(ranks, 0);
  std::vector<double> left(ranks, -1), started(ranks, 0);  // work left (< 0: none running)
  // Skips communication actions: the rank's next compute action, if any.
  auto current = [&](int rank) -> const Action* {
    const auto& list = schedule.actions[rank];
    while (next[rank] < list.size() && !is_compute(list[next[rank]].kind)) ++next[rank];
    return next[rank] < list.size() ? &list[next[rank]] : nullptr;
  };
  for (double t = 0;;) {
    double wake = kNever;
    int running = 0;
    for (int rank = 0; rank < ranks; ++rank) {
      const Action* a = current(rank);
      if (!a) continue;
      if (left[rank] < 0) {
        check_ranges(schedule, *a, rank);
        const double ready = inputs_ready(schedule, *a, done, costs);
        if (!std::isnan(ready) && ready <= t) {
          left[rank] = action_cost(*a, costs);
          started[rank] = t;
        } else if (!std::isnan(ready)) {
          wake = std::min(wake, ready);
        }
      }
      running += left[rank] >= 0;
    }
    if (running == 0) {
      if (wake == kNever) break;  // every rank done, or stuck (named below)
      t = wake;
      continue;
    }
    const double rate = std::min(1.0, static_cast<double>(costs.cores) / running);
    double step = wake - t;
    for (int rank = 0; rank < ranks; ++rank)
      if (left[rank] >= 0) step = std::min(step, left[rank] / rate);
    t += step;
    for (int rank = 0; rank < ranks; ++rank) {
      if (left[rank] < 0) continue;
      left[rank] -= rate * step;
      if (left[rank] > 1e-12 * std::max(1.0, action_cost(*current(rank), costs))) continue;
      const Action& a = *current(rank);
      record(done, a, t);
      result.timeline.push_back({rank, a, started[rank], t});
      result.busy[rank] += t - started[rank];
      result.makespan = std::max(result.makespan, t);
      left[rank] = -1;
      ++next[rank];
    }
  }
  for (int rank = 0; rank < ranks; ++rank)
    if (current(rank)) never_runs(schedule, rank, next[rank]);
}

}  // namespace

SimulationResult simulate(const Schedule& schedule, const PipelineCosts& costs) {
  const int ranks = schedule.ranks();
  if (costs.cores < 0) throw ValueError(fmt::format("[pipeline] simulate: {} cores; expected >= 0", costs.cores));
  SimulationResult result;
  result.busy.assign(ranks, 0.0);
  if (costs.cores > 0 && costs.cores < ranks) {
    simulate_shared(schedule, costs, result);
    summarize(schedule, result);
    return result;
  }
  Finished done(schedule.stages, schedule.microbatches);
  std::vector<std::size_t> next(ranks, 0);
  std::vector<double> free_at(ranks, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int rank = 0; rank < ranks; ++rank) {
      const auto& list = schedule.actions[rank];
      for (; next[rank] < list.size(); ++next[rank]) {
        const Action& a = list[next[rank]];
        if (!is_compute(a.kind)) continue;  // lowered: messages are priced on the consumer
        check_ranges(schedule, a, rank);
        double ready = inputs_ready(schedule, a, done, costs);
        if (std::isnan(ready)) break;
        double start = std::max(free_at[rank], ready), cost = action_cost(a, costs);
        free_at[rank] = start + cost;
        result.busy[rank] += cost;
        record(done, a, free_at[rank]);
        result.timeline.push_back({rank, a, start, free_at[rank]});
        progress = true;
      }
    }
  }
  for (int rank = 0; rank < ranks; ++rank)
    if (next[rank] < schedule.actions[rank].size()) never_runs(schedule, rank, next[rank]);
  result.makespan = *std::max_element(free_at.begin(), free_at.end());
  summarize(schedule, result);
  return result;
}

namespace {
void summarize(const Schedule& schedule, SimulationResult& result) {
  const int ranks = schedule.ranks();
  double idle_sum = 0, busy_sum = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    result.idle.push_back(result.makespan - result.busy[rank]);
    idle_sum += result.idle.back();
    busy_sum += result.busy[rank];
  }
  result.bubble_fraction = result.makespan > 0 ? idle_sum / ranks / result.makespan : 0;
  result.bubble_ratio = busy_sum > 0 ? idle_sum / busy_sum : 0;
  result.peak_microbatches = peak_held(schedule);
}
}  // namespace

std::string timeline_text(const Schedule& schedule, const SimulationResult& result, double unit) {
  if (!(unit > 0)) throw ValueError(fmt::format("[pipeline] timeline_text: unit {}; expected > 0", unit));
  const auto columns = static_cast<std::size_t>(std::ceil(result.makespan / unit - 1e-9));
  std::size_t width = 3;
  for (const TimedAction& t : result.timeline) width = std::max(width, action_text(t.action).size());
  std::vector<std::vector<std::string>> cells(schedule.ranks(), std::vector<std::string>(columns, "."));
  for (const TimedAction& t : result.timeline)
    for (auto c = static_cast<std::size_t>(std::floor(t.start / unit + 1e-9));
         c < columns && static_cast<double>(c) * unit < t.end - 1e-9; ++c)
      cells[t.rank][c] = action_text(t.action);
  std::string text;
  for (int rank = 0; rank < schedule.ranks(); ++rank) {
    text += fmt::format("rank {:<3}", rank);
    for (const std::string& cell : cells[rank]) text += fmt::format(" {:<{}}", cell, width);
    while (text.back() == ' ') text.pop_back();
    text += '\n';
  }
  return text;
}

}  // namespace dtensor::nn::pipeline
