// Tutorial step 8: reading a timeline. One training step of the Megatron
// MLP of step 4, now data parallel over dp as well, recorded with a
// TraceScope as a Chrome trace; rank 0 then reads the file back and prints
// what a person sees in Perfetto: one process per rank, an ops track and a
// collectives track, and on the latter each collective with its group, its
// bytes and the plan step it ran for. (Times are left out here: they change
// from run to run. Open a trace of your own to see them.)
//   build/examples/tutorial/tutorial_08_timeline
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include <dtensor/nn/optim.h>

#include "tutorial.h"

using namespace dtensor;

namespace {

/// Rank 0's view of the trace file: what Perfetto would draw for `rank`.
void describe(const std::filesystem::path& path, int rank) {
  const nlohmann::json trace = nlohmann::json::parse(std::ifstream(path));
  const nlohmann::json& events = trace.is_object() ? trace["traceEvents"] : trace;
  std::map<int, std::string> processes;
  std::map<std::pair<int, int>, std::string> tracks;
  for (const auto& e : events) {
    if (e["ph"] != "M") continue;
    if (e["name"] == "process_name") processes[e["pid"]] = e["args"]["name"];
    if (e["name"] == "thread_name") tracks[{e["pid"], e["tid"]}] = e["args"]["name"];
  }
  fmt::print("{} processes:\n", processes.size());
  for (const auto& [pid, name] : processes) fmt::print("  {}\n", name);
  std::vector<std::string> ops, collectives;
  for (const auto& e : events) {
    if (e["ph"] != "X" || e["pid"] != rank) continue;
    const std::string track = tracks[{e["pid"], e["tid"]}];
    const std::string name = e["name"];
    if (track == "ops") {
      ops.push_back(name);
    } else {
      std::string line = fmt::format("{} on {}, {} bytes received", name, e["args"]["group"].get<std::string>(),
                                     e["args"]["bytes"].get<std::int64_t>());
      if (e["args"].contains("plan_step")) line += fmt::format(" ({})", e["args"]["plan_step"].get<std::string>());
      collectives.push_back(line);
    }
  }
  fmt::print("the ops track of {}, in order:\n  {}\n", processes[rank], fmt::join(ops, ", "));
  fmt::print("its collectives track, in order (kind, group, bytes, and the plan step it ran for):\n");
  for (const auto& line : collectives) fmt::print("  {}\n", line);
}

}  // namespace

int main(int argc, char** argv) {
  return launch(
      argc, argv,
      [&](Communicator& world) {
        (void)tutorial::pictures_dir(argc, argv);  // no pictures here; refuses unknown arguments
        DeviceMesh mesh(world, {2, 2}, {"dp", "tp"});
        const std::int64_t batch = 8, hidden = 8, ffn = 16;
        const DTensor x = distribute_tensor(Tensor::randn({batch, hidden}, DType::Float64, 1), mesh,
                                            Layout::parse("S(0),R"));  // the batch split over dp
        DTensor w1 = distribute_tensor(mul(Tensor::randn({ffn, hidden}, DType::Float64, 2), 0.25), mesh,
                                       Layout::parse("R,S(0)"));  // column-parallel over tp
        DTensor w2 = distribute_tensor(mul(Tensor::randn({hidden, ffn}, DType::Float64, 3), 0.25), mesh,
                                       Layout::parse("R,S(1)"));  // row-parallel over tp
        w1.requires_grad_();
        w2.requires_grad_();
        nn::SGDOptions options;
        options.lr = 0.1;
        nn::SGD<DTensor> sgd({w1, w2}, options);

        // One file for the job: rank 0 chooses it and writes it.
        const auto path = std::filesystem::temp_directory_path() /
                          fmt::format("dtensor_tutorial_08_{}.json", world.rank() == 0 ? getpid() : 0);
        {
          TraceScope trace(mesh, path.string());
          const DTensor y = linear(gelu(linear(x, w1)), w2);
          sum(mul(y, y)).backward();
          sgd.step();
          trace.finish();
        }
        if (world.rank() == 0) {
          describe(path, 0);
          std::filesystem::remove(path);
        }
      },
      {.default_ranks = 4});
}
