// Tutorial step 9: pipeline parallelism. A schedule is data, one list of
// actions per rank (<dtensor/nn/pipeline.h>): first 1F1B on 4 stages with 8
// microbatches, simulated at unit costs (when each action runs, the bubble,
// the activations each rank holds), beside GPipe and ZB-H1. Then a GPT of 4
// blocks is trained with it on 4 thread ranks, one stage each, and compared
// with the same training on one rank; its last step is traced and drawn as
// measured. The measured bubble changes from run to run: the program marks
// it "(measured", and the tutorial's test compares everything else exactly.
//   build/examples/tutorial/tutorial_09_pipeline [--pictures DIR]
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <dtensor/nn/pipeline.h>
#include <dtensor/train/pipeline_picture.h>
#include <dtensor/train/trainer.h>

#include "tutorial.h"

using namespace dtensor;
namespace pipeline = dtensor::nn::pipeline;

namespace {

constexpr int kStages = 4, kMicrobatches = 8;

/// The three schedules at unit costs (F 1, I 1, W 1, so B 2): the timelines
/// of 1F1B and ZB-H1, and for each its makespan, idle time, bubble and the
/// activations each rank holds at most.
void simulate_schedules() {
  const pipeline::Schedule one_f_one_b = pipeline::make_schedule("1f1b", kStages, kMicrobatches);
  fmt::print("1f1b, {} stages, {} microbatches: one column per time unit (F 1, B 2), '.' idle\n{}", kStages,
             kMicrobatches, pipeline::timeline_text(one_f_one_b, pipeline::simulate(one_f_one_b)));
  const pipeline::Schedule zb = pipeline::make_schedule("zb-h1", kStages, kMicrobatches);
  fmt::print("zb-h1: the backward split into I (1) and W (1)\n{}", pipeline::timeline_text(zb, pipeline::simulate(zb)));
  fmt::print("simulated  makespan  idle per rank  bubble          activations held per rank\n");
  for (const char* name : {"gpipe", "1f1b", "zb-h1"}) {
    const pipeline::SimulationResult r = pipeline::simulate(pipeline::make_schedule(name, kStages, kMicrobatches));
    fmt::print("  {:8} {:<9g} {:<14g} {:<15} {}\n", name, r.makespan, r.idle[0],
               fmt::format("{:g}/{:g} = {:.1f}%", r.idle[0], r.makespan, 100 * r.bubble_fraction),
               fmt::join(r.peak_microbatches, " "));
  }
}

/// A GPT of 4 blocks (train_gpt's model otherwise), 8 micro-batches of 8
/// sequences a step, trained under 1F1B with one stage per rank and, on rank
/// 0, on one rank alone; prints both losses, what rank 0 sent and received,
/// and the measured bubble, and draws the last step as measured.
void train_pipelined(Communicator& world, const std::optional<std::filesystem::path>& picture_dir) {
  train::TrainOptions one_rank;
  one_rank.model = {.vocab = 256, .seq = 32, .layers = kStages, .d_model = 64, .heads = 4, .dtype = DType::Float64};
  one_rank.batch = 8;
  one_rank.micro_batches = kMicrobatches;
  one_rank.steps = 3;
  train::TrainOptions pipelined = one_rank;
  pipelined.mesh = {kStages};
  pipelined.dims = {"pp"};
  pipelined.plans = {"pp"};
  pipelined.schedule = "1f1b";
  // One file for the job: rank 0 chooses it and writes it.
  pipelined.trace = (std::filesystem::temp_directory_path() /
                     fmt::format("dtensor_tutorial_09_{}.json", world.rank() == 0 ? getpid() : 0))
                        .string();
  const train::TextData data(train::committed_slice_path());  // the same text with or without the fetched corpus
  const train::TrainResult piped = train::train(pipelined, data, &world);
  if (world.rank() != 0) return;
  const train::TrainResult alone = train::train(one_rank, data, nullptr);

  fmt::print("a GPT of {} blocks, one stage per rank; {} steps of {} micro-batches of {} sequences, f64\n", kStages,
             one_rank.steps, kMicrobatches, one_rank.batch);
  for (std::size_t step = 0; step < piped.losses.size(); ++step)
    fmt::print("step {}: loss {:.6f} on {} pipeline ranks, {:.6f} on one rank\n", step, piped.losses[step], kStages,
               alone.losses[step]);
  fmt::print("the same losses as on one rank, bit for bit: {}\n", piped.losses == alone.losses);
  std::vector<std::string> calls;
  for (const train::PhaseComm& c : piped.comm)
    calls.push_back(fmt::format("{} x{} ({} bytes)", c.kind, c.count, c.bytes));
  fmt::print("rank 0 (stage 0) in one step: {}\n", fmt::join(calls, ", "));
  fmt::print("parameters on the busiest rank {}, on one rank {}\n",
             human_bytes(static_cast<std::int64_t>(piped.parameter_bytes)),
             human_bytes(static_cast<std::int64_t>(alone.parameter_bytes)));
  const pipeline::SimulationResult predicted = pipeline::simulate(*piped.schedule);
  fmt::print("bubble of the last step {:.1f}% (measured; {:.1f}% simulated)\n", 100 * piped.bubble_fraction,
             100 * predicted.bubble_fraction);
  std::ifstream in(pipelined.trace);
  const std::string trace((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  tutorial::
      write_picture(picture_dir, "09_1f1b_measured.svg",
                    train::pipeline_step_svg(trace, *piped.schedule,
                                             fmt::format("one step of the GPT under 1f1b on {} ranks, as measured",
                                                         kStages)));
  std::filesystem::remove(pipelined.trace);
}

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv,
                [&](Communicator& world) {
                  const auto picture_dir = tutorial::pictures_dir(argc, argv);
                  if (world.rank() == 0) simulate_schedules();
                  train_pipelined(world, picture_dir);
                },
                {.default_ranks = kStages});
}
