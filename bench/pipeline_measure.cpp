// bench/pipeline's measurements (pipeline_measure.h).
#include "pipeline_measure.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "thread_timing.h"

namespace dtensor::bench::pipeline {

namespace {

using Clock = std::chrono::steady_clock;

double now_seconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Random byte tokens (the loss's value does not matter here, only the work).
Tensor random_tokens(std::mt19937_64& rng, const ModelSpec& spec) {
  std::uniform_int_distribution<std::int64_t> byte(0, spec.model.vocab - 1);
  std::vector<std::int64_t> v(static_cast<std::size_t>(spec.batch * spec.model.seq));
  for (auto& x : v) x = byte(rng);
  return Tensor::from_vector(v, {spec.batch, spec.model.seq});
}

pipe::StepInputs<Tensor> make_inputs(const ModelSpec& spec, int microbatches) {
  std::mt19937_64 rng(spec.seed);
  pipe::StepInputs<Tensor> in;
  for (int i = 0; i < microbatches; ++i) {
    in.tokens.push_back(random_tokens(rng, spec));
    in.targets.push_back(random_tokens(rng, spec));
  }
  in.loss_scales = pipe::equal_loss_scales(microbatches, spec.batch * spec.model.seq);
  return in;
}

// One rank of run_steps: its stages of the whole model, then the steps.
void rank_steps(Communicator& world, const ModelSpec& spec, const pipe::Schedule& schedule, int warmup, Run& out) {
  nn::GPT<Tensor> whole = nn::GPT<Tensor>::init(spec.model, spec.seed, nn::plain_parameters(spec.model.dtype));
  const pipe::LayerSplit split = pipe::split_layers(spec.model.layers, schedule.stages);
  std::vector<pipe::GPTStage<Tensor>> stages;
  for (int s : schedule.stages_of_rank.at(static_cast<std::size_t>(world.rank())))
    stages.push_back(pipe::GPTStage<Tensor>::take(whole, split, s));
  std::vector<pipe::GPTStage<Tensor>*> mine;
  for (auto& stage : stages) mine.push_back(&stage);
  const pipe::StepInputs<Tensor> inputs = make_inputs(spec, schedule.microbatches);
  const int total = warmup + static_cast<int>(out.steps.size());
  for (int step = 0; step < total; ++step) {
    world.barrier();
    if (step == warmup && world.rank() == 0) out.host_misses = host_memory_stats().misses;
    RankStep rs;
    rs.start = now_seconds();
    const double cpu = thread_seconds();
    pipe::run_step<Tensor>(schedule, mine, world, inputs, &rs.timeline);
    rs.cpu = thread_seconds() - cpu;
    if (step >= warmup) out.steps[static_cast<std::size_t>(step - warmup)][static_cast<std::size_t>(world.rank())] = rs;
    for (auto& stage : stages)
      for (Tensor& p : stage.parameters()) p.zero_grad();
  }
  world.barrier();
  if (world.rank() == 0) out.host_misses = host_memory_stats().misses - out.host_misses;
}

// Seconds the whole machine's CPUs were busy since boot (/proc/stat's
// first line: user, nice, system, idle, iowait, irq, softirq, steal); -1
// where it cannot be read.
double machine_busy_seconds() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) || cpu != "cpu") return -1;
  return (user + nice + system + irq + softirq + steal) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double self_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

}  // namespace

OthersLoad::OthersLoad() : busy_(machine_busy_seconds()), self_(self_cpu_seconds()), wall_(now_seconds()) {}

double OthersLoad::share() const {
  const double busy = machine_busy_seconds();
  if (busy_ < 0 || busy < 0) return -1;
  const double others = (busy - busy_) - (self_cpu_seconds() - self_);
  const double capacity = (now_seconds() - wall_) * std::max(1u, std::thread::hardware_concurrency());
  return capacity > 0 ? std::max(0.0, others / capacity) : 0;
}

StepFigures figures(const MeasuredStep& step) {
  StepFigures f;
  if (step.empty()) return f;
  double origin = std::numeric_limits<double>::infinity();
  for (const RankStep& r : step) origin = std::min(origin, r.start);
  for (const RankStep& r : step) f.makespan = std::max(f.makespan, r.start - origin + r.timeline.seconds);
  std::vector<pipe::StepTimeline> timelines;
  for (const RankStep& r : step) {
    f.busy += r.timeline.busy();
    f.bubble += (f.makespan - r.timeline.busy()) / f.makespan;
    timelines.push_back(r.timeline);
  }
  f.bubble /= static_cast<double>(step.size());
  f.own_span_bubble = pipe::bubble_fraction(timelines);
  return f;
}

std::vector<pipe::TimedAction> aligned_actions(const MeasuredStep& step) {
  double origin = std::numeric_limits<double>::infinity();
  for (const RankStep& r : step) origin = std::min(origin, r.start);
  std::vector<pipe::TimedAction> out;
  for (const RankStep& r : step)
    for (pipe::TimedAction a : r.timeline.actions) {
      if (!pipe::is_compute(a.action.kind)) continue;
      a.start += r.start - origin;
      a.end += r.start - origin;
      out.push_back(a);
    }
  return out;
}

Run run_steps(const ModelSpec& spec, const pipe::Schedule& schedule, int warmup, int steps) {
  Run out;
  out.steps.assign(static_cast<std::size_t>(steps), MeasuredStep(schedule.ranks()));
  // Each rank writes only its own slots; run_threads joins before they are read.
  run_threads(schedule.ranks(), [&](Communicator& world) { rank_steps(world, spec, schedule, warmup, out); });
  return out;
}

std::vector<StageTimes> means_by_stage(const std::vector<pipe::TimedAction>& actions, const std::vector<double>& values,
                                       int stages) {
  struct Sum {
    double total = 0;
    int count = 0;
  };
  std::vector<std::array<Sum, 4>> sums(static_cast<std::size_t>(stages));
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const pipe::Action& a = actions[i].action;
    if (!pipe::is_compute(a.kind)) continue;
    // F, B, I, W come first in ActionKind, in that order.
    Sum& sum = sums.at(static_cast<std::size_t>(a.stage))[static_cast<std::size_t>(a.kind)];
    sum.total += values.at(i);
    ++sum.count;
  }
  std::vector<StageTimes> out(static_cast<std::size_t>(stages));
  for (std::size_t s = 0; s < out.size(); ++s) {
    auto mean = [&](int k) {
      const Sum& x = sums[s][static_cast<std::size_t>(k)];
      return x.count ? x.total / x.count : 0.0;
    };
    out[s] = {mean(0), mean(1), mean(2), mean(3)};
  }
  return out;
}

std::vector<StageTimes> stage_means(const std::vector<MeasuredStep>& steps, int stages) {
  std::vector<pipe::TimedAction> actions;
  std::vector<double> durations;
  for (const MeasuredStep& step : steps)
    for (const RankStep& r : step)
      for (const pipe::TimedAction& a : r.timeline.actions) {
        actions.push_back(a);
        durations.push_back(a.end - a.start);
      }
  return means_by_stage(actions, durations, stages);
}

LinkFit measure_link(std::size_t bytes, int round_trips) {
  LinkFit fit;
  run_threads(2, [&](Communicator& world) {
    std::vector<std::byte> buf(bytes);
    auto one_way = [&](std::size_t n) {
      std::vector<double> times;
      for (int i = 0; i < round_trips + 2; ++i) {  // the first two: warm-up
        world.barrier();
        const double t0 = now_seconds();
        if (world.rank() == 0) {
          world.send(buf.data(), n, 1, i);
          world.recv(buf.data(), n, 1, i);
        } else {
          world.recv(buf.data(), n, 0, i);
          world.send(buf.data(), n, 0, i);
        }
        if (i >= 2) times.push_back((now_seconds() - t0) / 2);
      }
      return median(times);
    };
    const double small = one_way(8), big = one_way(bytes);
    if (world.rank() != 0) return;
    fit.small_seconds = small;
    fit.message_seconds = big;
    fit.link.hop_latency_s = small;
    fit.link.bandwidth_Bps = big > small ? static_cast<double>(bytes - 8) / (big - small) : 1e15;
  });
  return fit;
}

}  // namespace dtensor::bench::pipeline
