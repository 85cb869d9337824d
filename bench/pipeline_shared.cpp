// The work of measured actions under shared cores (pipeline_shared.h).
#include "pipeline_shared.h"

#include <algorithm>

namespace dtensor::bench::pipeline {

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
