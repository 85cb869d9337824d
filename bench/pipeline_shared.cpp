// bench/pipeline's model of ranks sharing cores (pipeline_shared.h).
#include "pipeline_shared.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dtensor::bench::pipeline {

namespace {

constexpr double kNotYet = std::numeric_limits<double>::quiet_NaN();
constexpr double kNever = std::numeric_limits<double>::infinity();

double work_of(const pipe::Action& a, const pipe::PipelineCosts& costs) {
  const auto c = costs.of_stage(a.stage);
  switch (a.kind) {
    case pipe::ActionKind::Forward: return c.forward;
    case pipe::ActionKind::Backward: return c.input_backward + c.weight_backward;
    case pipe::ActionKind::BackwardInput: return c.input_backward;
    case pipe::ActionKind::BackwardWeight: return c.weight_backward;
    default: return 0;
  }
}

// The state of the run: when each (stage, microbatch)'s forward, input
// gradient and weight gradient finished (NaN: not yet), and each rank's
// place in its compute actions.
struct State {
  const pipe::Schedule& schedule;
  const pipe::PipelineCosts& costs;
  std::vector<std::vector<double>> forward, input_gradient;
  std::vector<std::vector<pipe::Action>> compute;  // per rank, in order
  std::vector<std::size_t> next;
  std::vector<double> left, started;  // the running action's work left (< 0: none running) and start

  State(const pipe::Schedule& s, const pipe::PipelineCosts& c)
      : schedule(s),
        costs(c),
        forward(s.stages, std::vector<double>(s.microbatches, kNotYet)),
        input_gradient(forward),
        compute(s.ranks()),
        next(s.ranks(), 0),
        left(s.ranks(), -1),
        started(s.ranks(), 0) {
    for (int r = 0; r < s.ranks(); ++r)
      for (const pipe::Action& a : s.actions[r])
        if (pipe::is_compute(a.kind)) compute[r].push_back(a);
  }

  bool done(int r) const { return next[r] >= compute[r].size(); }

  // When rank r's next action's inputs are there: NaN if not yet known.
  double ready(int r) const {
    const pipe::Action& a = compute[r][next[r]];
    const int mb = a.microbatch;
    auto from = [&](int producer, double end) {
      const bool remote = schedule.rank_of_stage(producer) != schedule.rank_of_stage(a.stage);
      return remote ? end + costs.message_seconds() : end;
    };
    switch (a.kind) {
      case pipe::ActionKind::Forward: return a.stage == 0 ? 0.0 : from(a.stage - 1, forward[a.stage - 1][mb]);
      case pipe::ActionKind::BackwardWeight: return input_gradient[a.stage][mb];
      default: {
        const double own = forward[a.stage][mb];
        if (a.stage == schedule.stages - 1) return own;
        const double gradient = from(a.stage + 1, input_gradient[a.stage + 1][mb]);
        return std::isnan(own) || std::isnan(gradient) ? kNotYet : std::max(own, gradient);
      }
    }
  }

  void finish(int r, double t, pipe::SimulationResult& out) {
    const pipe::Action& a = compute[r][next[r]];
    if (a.kind == pipe::ActionKind::Forward) forward[a.stage][a.microbatch] = t;
    if (a.kind == pipe::ActionKind::Backward || a.kind == pipe::ActionKind::BackwardInput)
      input_gradient[a.stage][a.microbatch] = t;
    out.timeline.push_back({r, a, started[r], t});
    out.busy[r] += t - started[r];
    ++next[r];
    left[r] = -1;
  }
};

}  // namespace

pipe::SimulationResult simulate_shared(const pipe::Schedule& schedule, const pipe::PipelineCosts& work, int cores) {
  State state(schedule, work);
  const int ranks = schedule.ranks();
  pipe::SimulationResult out;
  out.busy.assign(ranks, 0.0);
  for (double t = 0;;) {
    // Start what is ready; note when the next waiting rank becomes ready.
    double wake = kNever;
    int running = 0;
    for (int r = 0; r < ranks; ++r) {
      if (state.done(r)) continue;
      if (state.left[r] < 0) {
        const double ready = state.ready(r);
        if (!std::isnan(ready) && ready <= t) {
          state.left[r] = work_of(state.compute[r][state.next[r]], work);
          state.started[r] = t;
        } else if (!std::isnan(ready)) {
          wake = std::min(wake, ready);
        }
      }
      running += state.left[r] >= 0;
    }
    if (running == 0) {
      if (wake == kNever) break;  // every rank done, or stuck (checked below)
      t = wake;
      continue;
    }
    const double rate = std::min(1.0, static_cast<double>(cores) / running);
    double step = wake - t;
    for (int r = 0; r < ranks; ++r)
      if (state.left[r] >= 0) step = std::min(step, state.left[r] / rate);
    t += step;
    for (int r = 0; r < ranks; ++r) {
      if (state.left[r] < 0) continue;
      state.left[r] -= rate * step;
      if (state.left[r] <= 1e-12) state.finish(r, t, out);
    }
  }
  for (int r = 0; r < ranks; ++r)
    if (!state.done(r))
      throw ValueError(fmt::format("[pipeline] simulate_shared: rank {} cannot run {}", r,
                                   pipe::action_text(state.compute[r][state.next[r]])));
  for (const pipe::TimedAction& a : out.timeline) out.makespan = std::max(out.makespan, a.end);
  for (int r = 0; r < ranks; ++r) {
    out.idle.push_back(out.makespan - out.busy[r]);
    out.bubble_fraction += out.idle.back() / out.makespan / ranks;
  }
  return out;
}

std::vector<double> action_work(const MeasuredStep& step, int cores) {
  const std::vector<pipe::TimedAction> actions = aligned_actions(step);
  std::vector<double> work;
  for (const pipe::TimedAction& a : actions) {
    // The span's pieces between the other actions' starts and ends, each at
    // the share of a core its number of computing ranks leaves.
    std::vector<double> cuts{a.start, a.end};
    for (const pipe::TimedAction& b : actions)
      for (double x : {b.start, b.end})
        if (x > a.start && x < a.end) cuts.push_back(x);
    std::sort(cuts.begin(), cuts.end());
    double cpu = 0;
    for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
      const double mid = (cuts[i] + cuts[i + 1]) / 2;
      int n = 0;
      for (const pipe::TimedAction& b : actions) n += b.start <= mid && mid < b.end;
      cpu += (cuts[i + 1] - cuts[i]) * std::min(1.0, static_cast<double>(cores) / std::max(n, 1));
    }
    work.push_back(cpu);
  }
  return work;
}

std::vector<StageTimes> stage_work(const std::vector<MeasuredStep>& steps, int stages, int cores) {
  std::vector<pipe::TimedAction> all;
  std::vector<double> work;
  for (const MeasuredStep& step : steps) {
    const std::vector<pipe::TimedAction> actions = aligned_actions(step);
    const std::vector<double> w = action_work(step, cores);
    all.insert(all.end(), actions.begin(), actions.end());
    work.insert(work.end(), w.begin(), w.end());
  }
  return means_by_stage(all, work, stages);
}

}  // namespace dtensor::bench::pipeline
