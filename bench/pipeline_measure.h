#pragma once
// bench/pipeline's measurements: pipeline steps of the GPT on thread ranks,
// each rank's StepTimeline put on one clock, and what a calibration reads
// from them (per-stage compute times, the point-to-point cost).
#include <dtensor/dtensor.h>
#include <dtensor/nn/pipeline.h>
#include <dtensor/nn/pipeline_runtime.h>

#include <cstdint>
#include <vector>

namespace dtensor::bench::pipeline {

namespace pipe = nn::pipeline;

/// The model every rank builds whole and takes its stages of, and the
/// microbatches' shape.
struct ModelSpec {
  nn::GPTConfig model;
  std::int64_t batch = 4;  // sequences per microbatch
  std::uint64_t seed = 1;
};

/// One rank's part of one step: `start` is steady_clock's time (seconds)
/// just before run_step, taken after a barrier; the timeline's times count
/// from run_step's own start on this rank (a few microseconds later).
struct RankStep {
  double start = 0;
  pipe::StepTimeline timeline;
  double cpu = 0;  // the rank thread's CPU time in run_step
};
using MeasuredStep = std::vector<RankStep>;  // by rank

/// A step on one clock: the makespan from the earliest rank's start to the
/// latest rank's last action, and the bubble as simulate() defines it:
/// per rank (makespan - busy) / makespan, averaged over ranks. `own_span`
/// is the runtime's bubble_fraction (each rank over its own span only).
struct StepFigures {
  double makespan = 0, bubble = 0, own_span_bubble = 0;
  double busy = 0;  // compute seconds, summed over ranks
};
StepFigures figures(const MeasuredStep& step);

/// Each compute action of a step at its place on the common clock (seconds
/// from the earliest rank's start), in simulate()'s TimedAction form.
std::vector<pipe::TimedAction> aligned_actions(const MeasuredStep& step);

/// Runs `warmup` untimed and then `steps` timed steps of `schedule` (lowered
/// where it spans several ranks) on schedule.ranks() thread ranks, every
/// rank starting each step after a barrier; returns the timed steps.
/// Gradients are emptied between steps (no optimizer: the step is
/// run_step's alone).
/// `host_misses`: the big host blocks mapped afresh (host_memory_stats())
/// during the timed steps, a step's memory the host cache did not keep.
struct Run {
  std::vector<MeasuredStep> steps;
  std::uint64_t host_misses = 0;
};
Run run_steps(const ModelSpec& spec, const pipe::Schedule& schedule, int warmup, int steps);

/// Mean measured durations per stage of each compute kind over `steps`
/// (0 where a kind did not run). Stage 0's I does nothing (it has no input
/// to pass back) and its W is the whole backward, as the runtime runs them.
struct StageTimes {
  double forward = 0, backward = 0, input_backward = 0, weight_backward = 0;
};
std::vector<StageTimes> stage_means(const std::vector<MeasuredStep>& steps, int stages);
/// The mean of `values[i]` per stage and compute kind of `actions[i]`.
std::vector<StageTimes> means_by_stage(const std::vector<pipe::TimedAction>& actions, const std::vector<double>& values,
                                       int stages);

/// The point-to-point cost on thread ranks: half the median round trip of
/// a ping-pong between two ranks of `bytes` and of 8 bytes, fitted to
/// latency + bytes / bandwidth.
struct LinkFit {
  double small_seconds = 0, message_seconds = 0;  // one way, 8 bytes and `bytes`
  LinkParams link;
};
LinkFit measure_link(std::size_t bytes, int round_trips);

/// What the rest of the machine ran while this process measured: the CPU
/// time of every other process (/proc/stat's busy time less this process's
/// getrusage time) over the wall time of all hardware threads, from
/// construction to share(). Thread ranks share the cores with them, so a
/// share of a few percent already slows a step; -1 where /proc/stat cannot
/// be read.
class OthersLoad {
 public:
  OthersLoad();
  double share() const;

 private:
  double busy_ = 0, self_ = 0, wall_ = 0;
};

}  // namespace dtensor::bench::pipeline
