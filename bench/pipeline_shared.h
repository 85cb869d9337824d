#pragma once
// Calibrating nn::pipeline::simulate() with shared cores
// (PipelineCosts::cores) for bench/pipeline: thread ranks on fewer cores
// than ranks compute at a fraction of a core while others compute, so an
// action's measured duration is more than its work. Here each measured
// action's work is recovered under the same model: its span's pieces, each
// at the share of a core the ranks computing then leave it.
#include <dtensor/nn/pipeline.h>

#include <vector>

#include "pipeline_measure.h"

namespace dtensor::bench::pipeline {

/// Mean per stage of each compute kind's work in `steps`: the CPU time each
/// action had under the same sharing, the integral over its span of
/// min(1, cores / n(t)), n(t) the ranks inside a compute action at t on the
/// common clock. With n <= cores throughout it is the measured duration.
std::vector<StageTimes> stage_work(const std::vector<MeasuredStep>& steps, int stages, int cores);
/// That work for each of aligned_actions(step), in its order.
std::vector<double> action_work(const MeasuredStep& step, int cores);

}  // namespace dtensor::bench::pipeline
