// Tutorial step 8: reading a timeline. One training step of the Megatron
// MLP of step 4, now data parallel over dp as well, recorded with a
// TraceScope as a Chrome trace; rank 0 then reads the file back and prints
// what a person sees in Perfetto: one process per rank, an ops track and a
// collectives track, and on the latter each collective with its group, its
// bytes and the plan step it ran for. (Times are left out here: they change
// from run to run. Open a trace of your own to see them.) Then the same MLP
// is trained one step tensor parallel and one step fully sharded, each
// traced and drawn on the logical clock (the same picture on every run).
//   build/examples/tutorial/tutorial_08_timeline [--pictures DIR]
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <span>

#include <nlohmann/json.hpp>

#include <dtensor/nn/optim.h>
#include <dtensor/pictures/svg.h>

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
    } else if (track == "collectives") {
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

/// Runs `step` on every rank inside a TraceScope and returns the trace's
/// text on rank 0 (empty elsewhere).
template <class Step>
std::string traced(Communicator& world, const DeviceMesh& mesh, std::string_view name, Step&& step) {
  const auto path = std::filesystem::temp_directory_path() /
                    fmt::format("dtensor_tutorial_08_{}_{}.json", name, world.rank() == 0 ? getpid() : 0);
  {
    TraceScope trace(mesh, path.string());
    step();
    trace.finish();
  }
  if (world.rank() != 0) return {};
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  return text;
}

/// "all_gather x2, reduce_scatter x2": rank 0's collectives in a trace.
std::string collectives_of_rank_0(const std::string& text) {
  std::map<std::string, int> kinds;
  const nlohmann::json trace = nlohmann::json::parse(text);
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["pid"] == 0 && e.value("cat", "") == "collective") ++kinds[e["name"]];
  std::vector<std::string> parts;
  for (const auto& [kind, count] : kinds) parts.push_back(fmt::format("{} x{}", kind, count));
  return fmt::format("{}", fmt::join(parts, ", "));
}

/// One SGD step of the MLP y = gelu(x W1^T) W2^T on weights already laid
/// out; `forward` runs the two linears (directly, or gathered per unit).
template <class Forward>
void train_step(const DTensor& x, DTensor& w1, DTensor& w2, Forward&& forward) {
  nn::SGDOptions options;
  options.lr = 0.1;
  nn::SGD<DTensor> sgd({w1, w2}, options);
  // The backward and the optimizer name their regions themselves; the
  // forward is the user's to name (the timeline's scopes lane shows all three).
  const DTensor loss = [&] {
    const CommScope named("forward");
    const DTensor y = forward(x, w1, w2);
    return sum(mul(y, y));
  }();
  loss.backward();
  sgd.step();
}

/// The same MLP step tensor parallel (Megatron: W1 column-, W2 row-parallel
/// over 4 ranks) and fully sharded (FSDP: each weight S(0) over 4 ranks,
/// gathered for use), each traced and drawn.
void tp_versus_fsdp(Communicator& world, const std::optional<std::filesystem::path>& picture_dir) {
  const Tensor x_full = Tensor::randn({8, 8}, DType::Float64, 1);
  const Tensor w1_full = mul(Tensor::randn({16, 8}, DType::Float64, 2), 0.25);
  const Tensor w2_full = mul(Tensor::randn({8, 16}, DType::Float64, 3), 0.25);
  auto mlp = [](const DTensor& x, const DTensor& w1, const DTensor& w2) { return linear(gelu(linear(x, w1)), w2); };

  // A tensor on the mesh in the layout given, its gradient recorded.
  auto parameter = [](const Tensor& full, const DeviceMesh& mesh, const char* layout) {
    DTensor p = distribute_tensor(full, mesh, Layout::parse(layout));
    p.requires_grad_();
    return p;
  };

  const DeviceMesh tp(world, {4}, {"tp"});
  DTensor w1 = parameter(w1_full, tp, "S(0)"), w2 = parameter(w2_full, tp, "S(1)");
  const DTensor x_tp = distribute_tensor(x_full, tp, Layout::parse("R"));
  const std::string tp_trace = traced(world, tp, "tp", [&] { train_step(x_tp, w1, w2, mlp); });

  const DeviceMesh dp(world, {4}, {"dp"});
  DTensor v1 = parameter(w1_full, dp, "S(0)"), v2 = parameter(w2_full, dp, "S(0)");
  const DTensor x_dp = distribute_tensor(x_full, dp, Layout::parse("S(0)"));
  const Layout whole[] = {Layout::parse("R"), Layout::parse("R")};
  auto gathered = [&](const DTensor& x, const DTensor& a, const DTensor& b) {
    const DTensor inputs[] = {x}, params[] = {a, b};
    return recompute_gathered(
        [&](std::span<const DTensor> in, std::span<const DTensor> w) { return mlp(in[0], w[0], w[1]); }, inputs,
        params, whole);
  };
  const std::string fsdp_trace = traced(world, dp, "fsdp", [&] { train_step(x_dp, v1, v2, gathered); });

  if (world.rank() != 0) return;
  fmt::print("tp, rank 0's collectives: {}\n", collectives_of_rank_0(tp_trace));
  fmt::print("fsdp, rank 0's collectives: {}\n", collectives_of_rank_0(fsdp_trace));
  pictures::TimelineOptions options;
  options.title = "one step of the MLP, tensor parallel on 4 ranks (W1 S(0), W2 S(1))";
  tutorial::write_picture(picture_dir, "08_tp_timeline.svg", pictures::timeline_svg(tp_trace, options));
  options.title = "one step of the MLP, fully sharded on 4 ranks (W1, W2 S(0), gathered for use)";
  tutorial::write_picture(picture_dir, "08_fsdp_timeline.svg", pictures::timeline_svg(fsdp_trace, options));
}

}  // namespace

int main(int argc, char** argv) {
  return launch(
      argc, argv,
      [&](Communicator& world) {
        const auto picture_dir = tutorial::pictures_dir(argc, argv);
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
        tp_versus_fsdp(world, picture_dir);
      },
      {.default_ranks = 4});
}
