#pragma once
// A model of thread ranks sharing fewer cores than there are ranks, for
// bench/pipeline: nn::pipeline::simulate() runs each rank on a core of its
// own, which on a 2-core machine is wrong for p = 4 thread ranks. Here the
// ranks that are computing share `cores` cores equally (the kernel's fair
// scheduler, to a first approximation): while n ranks compute, each
// progresses at min(1, cores / n) of its work per second. A rank waiting
// for a message takes no core (the threads backend's waits block).
#include <dtensor/nn/pipeline.h>

#include <vector>

#include "pipeline_measure.h"

namespace dtensor::bench::pipeline {

/// simulate()'s dependencies and message delay with the compute actions
/// sharing `cores` cores; `work` is each action's cost on a core of its own.
/// A rank's busy time is the wall time its actions were in progress (as a
/// measured timeline counts it), so its bubble is the time it had nothing
/// to run. ValueError if the schedule cannot finish.
pipe::SimulationResult simulate_shared(const pipe::Schedule& schedule, const pipe::PipelineCosts& work, int cores);

/// Mean per stage of each compute kind's work in `steps`: the CPU time each
/// action had under the same sharing, the integral over its span of
/// min(1, cores / n(t)), n(t) the ranks inside a compute action at t on the
/// common clock. With n <= cores throughout it is the measured duration.
std::vector<StageTimes> stage_work(const std::vector<MeasuredStep>& steps, int stages, int cores);
/// That work for each of aligned_actions(step), in its order.
std::vector<double> action_work(const MeasuredStep& step, int cores);

}  // namespace dtensor::bench::pipeline
