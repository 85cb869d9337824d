// Trains a byte-level GPT-2 on Shakespeare, on one rank or on a mesh under
// any parallel plan, and prints the loss per step, the tokens per second and
// the collectives one step took, by phase. The same seed gives the same
// losses on every mesh and plan.
//   build/examples/train_gpt --ranks 4 --mesh 2x2 --dims dp,tp --plan ddp,tp --steps 20
//   build/examples/train_gpt --ranks 2 --plan tp_sp --json run.json --plot loss.svg --generate 64
//   mpirun -np 4 build/examples/train_gpt --mesh 4 --plan ddp
//   build/examples/train_gpt --ranks 4 --dims pp --plan pp --schedule 1f1b --micro-batches 4
#include <filesystem>

#include <dtensor/dtensor.h>
#include <dtensor/nn/parallel_plan.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <numeric>
#include <nlohmann/json.hpp>
#include <optional>

#include <dtensor/pictures/svg.h>

#include "dtensor/train/loss_plot.h"
#include "dtensor/train/pipeline_picture.h"
#include "dtensor/train/trainer.h"

using namespace dtensor;

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// "2x4" -> {2, 4}; ValueError naming the text otherwise.
Shape parse_mesh(const std::string& text) {
  Shape out;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find('x', start), text.size());
    const std::string part = text.substr(start, end - start);
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != part.size() || part.empty() || v <= 0)
      throw ValueError(fmt::format("--mesh '{}': expected sizes like 8 or 2x4", text));
    out.push_back(v);
    start = end + 1;
  }
  return out;
}

nlohmann::json to_json(const train::TrainOptions& o, const train::TrainResult& r, const std::string& mesh_text,
                       const std::string& plan_text) {
  nlohmann::json comm = nlohmann::json::array();
  for (const auto& c : r.comm)
    comm.push_back(
        {{"phase", c.phase}, {"kind", c.kind}, {"mesh_dims", c.mesh_dims}, {"count", c.count}, {"bytes", c.bytes}});
  nlohmann::json out = {{"config",
                         {{"mesh", mesh_text},
                          {"dims", o.dims},
                          {"plan", plan_text},
                          {"layers", o.model.layers},
                          {"d_model", o.model.d_model},
                          {"heads", o.model.heads},
                          {"seq", o.model.seq},
                          {"vocab", o.model.vocab},
                          {"tie_embeddings", o.model.tie_embeddings},
                          {"moe_experts", o.model.moe.experts},
                          {"moe_top_k", o.model.moe.top_k},
                          {"dtype", std::string(dtype_name(o.model.dtype))},
                          {"batch", o.batch},
                          {"micro_batches", o.micro_batches},
                          {"schedule", o.schedule},
                          {"virtual_stages", o.virtual_stages},
                          {"steps", o.steps},
                          {"schedule_steps", o.schedule_steps > 0 ? o.schedule_steps : o.steps},
                          {"save", o.save_dir},
                          {"resume", o.resume_dir},
                          {"warmup", o.warmup},
                          {"lr", o.lr},
                          {"weight_decay", o.weight_decay},
                          {"clip", o.clip},
                          {"seed", o.seed},
                          {"generate", o.generate},
                          {"val_batches", o.val_batches},
                          {"eval_every", o.eval_every},
                          {"text", o.text}}},
                        {"first_step", r.first_step},
                        {"losses", r.losses},
                        {"val_loss", r.val_loss},
                        {"val_points", r.val_points},
                        {"comm", comm},
                        {"tokens_per_second", r.tokens_per_second},
                        {"peak_bytes_per_rank", r.peak_bytes},
                        {"memory_per_rank",
                         {{"parameters", r.parameter_bytes},
                          {"gradients", r.gradient_bytes},
                          {"optimizer_states", r.optimizer_state_bytes}}},
                        {"generated", r.generated}};
  if (!r.expert_load.empty()) {
    out["expert_load"] = r.expert_load;
    out["dropped"] = r.dropped;
    out["aux_loss"] = r.aux_loss;
    out["z_loss"] = r.z_loss;
  }
  if (r.schedule) {
    nlohmann::json actions = nlohmann::json::object();
    for (int rank = 0; rank < r.schedule->ranks(); ++rank) {
      std::vector<std::string> texts;
      for (const auto& a : r.schedule->actions[static_cast<std::size_t>(rank)])
        texts.push_back(nn::pipeline::action_text(a));
      actions[std::to_string(rank)] = texts;
    }
    out["schedule"] = {{"name", r.schedule->name},
                       {"stages", r.schedule->stages},
                       {"microbatches", r.schedule->microbatches},
                       {"actions", actions}};
    out["bubble_fraction"] = r.bubble_fraction;
  }
  return out;
}

// The command line as given: the training options and the texts still to be
// read into them.
struct CommandLine {
  train::TrainOptions options;
  int ranks = 1;
  std::string mesh_text, dims_text, plan_text = "ddp", dtype_text = "f32", json_path, plot_path, device = "cpu";
  std::string trace_svg_path;
  bool trace_measured = false;
  bool no_param_overlap = false;  // with --overlap: zero1's parameter gather in the step
  std::string link_text, budget_text;
  std::string drop_policy = "probs", balance = "aux";
};

// Declares every option, each described on one line with its default, in
// three groups: where it runs and the model, the training, the outputs.
void add_mesh_and_model_options(CLI::App& app, CommandLine& cl) {
  train::TrainOptions& o = cl.options;
  app.add_option("--ranks", cl.ranks,
                 fmt::format("thread ranks (under mpirun: the job's processes) (default: {})", cl.ranks))
      ->check(CLI::Range(1, 64));
  app.add_option("--device", cl.device,
                 fmt::format("where the ranks keep their shards, read by the launcher: cpu only here, as the "
                             "optimizers update CPU shards (default: {})",
                             cl.device));
  app.add_option("--mesh", cl.mesh_text, "mesh shape, e.g. 8 or 2x4 (default: all ranks on one dim)");
  app.add_option("--dims", cl.dims_text, "mesh dim names, e.g. dp,tp (default: dp on one dim, else d0,d1,...)");
  app.add_option("--plan", cl.plan_text,
                 fmt::format("one plan per mesh dim, comma-separated, each ddp, zero1, fsdp, tp, tp_sp, pp "
                             "(pipeline stages) or ep (experts; e.g. ddp,tp, pp,ddp or ep,tp) (default: {})",
                             cl.plan_text));
  app.add_option("--schedule", o.schedule,
                 fmt::format("pipeline schedule under --plan pp: gpipe, 1f1b, interleaved, zb-h1, zbv or dualpipev "
                             "(the last three split backwards into input and weight gradients; zbv and dualpipev "
                             "hold 2 stages per rank, in a V, and dualpipev needs m >= 2p) (default: {})",
                             o.schedule));
  app.add_option("--virtual", o.virtual_stages,
                 fmt::format("pipeline stages per pp rank (interleaved; zbv and dualpipev: 1 or 2, they hold 2) "
                             "(default: {})",
                             o.virtual_stages))
      ->check(CLI::PositiveNumber);
  app.add_option("--layers", o.model.layers, fmt::format("transformer blocks (default: {})", o.model.layers))
      ->check(CLI::PositiveNumber);
  app.add_option("--d-model", o.model.d_model,
                 fmt::format("width of the embeddings and the residual stream (default: {})", o.model.d_model))
      ->check(CLI::PositiveNumber);
  app.add_option("--heads", o.model.heads,
                 fmt::format("attention heads per block, dividing --d-model (default: {})", o.model.heads))
      ->check(CLI::PositiveNumber);
  app.add_option("--seq", o.model.seq, fmt::format("sequence length in bytes (default: {})", o.model.seq))
      ->check(CLI::PositiveNumber);
  nn::MoEConfig& moe = o.model.moe;
  app.add_option("--moe-experts", moe.experts,
                 "E: each MoE block's experts, its MLP replaced by a router and E expert MLPs (split over "
                 "the ep plan's dim) (default: 0, dense)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--moe-top-k", moe.top_k, fmt::format("K: experts per token, 1 or 2 (default: {})", moe.top_k));
  app.add_option("--moe-every", moe.every,
                 fmt::format("every N-th block is MoE, from block N-1 (default: {}, all)", moe.every));
  app.add_option("--capacity-factor", moe.capacity_factor,
                 "C: each expert takes at most ceil(seq K / E C) assignments per sequence, the rest dropped "
                 "(default: none, dropless)");
  app.add_option("--drop-policy", cl.drop_policy,
                 fmt::format("over capacity, drop the least probable or the latest assignments (default: {})",
                             cl.drop_policy))
      ->check(CLI::IsMember({"probs", "position"}).description(""))
      ->type_name("probs|position");
  app.add_option("--aux-loss", moe.aux_loss,
                 fmt::format("A: the Switch load-balancing loss's coefficient (default: {})", moe.aux_loss));
  app.add_option("--z-loss", moe.z_loss, fmt::format("Z: the router z-loss's coefficient (default: {})", moe.z_loss));
  app.add_option("--balance", cl.balance,
                 fmt::format("balance the experts' load by the auxiliary loss (aux) or DeepSeek-V3's per-expert "
                             "selection bias (bias) (default: {})",
                             cl.balance))
      ->check(CLI::IsMember({"aux", "bias"}).description(""))
      ->type_name("aux|bias");
  app.add_flag("--tie-embeddings", o.model.tie_embeddings,
               "the lm_head reuses the token embedding's weight (GPT-2's tie); under pp the first and last "
               "stages each hold a copy, their gradients summed once per step (default: off)");
}

void add_training_options(CLI::App& app, CommandLine& cl) {
  train::TrainOptions& o = cl.options;
  app.add_option("--batch", o.batch,
                 fmt::format("sequences per micro-batch, all ranks together (default: {})", o.batch))
      ->check(CLI::PositiveNumber);
  app.add_option("--micro-batches", o.micro_batches,
                 fmt::format("micro-batches accumulated per optimizer step (default: {})", o.micro_batches))
      ->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps,
                 fmt::format("optimizer steps to train up to (after --resume: from the saved step) (default: {})",
                             o.steps))
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup,
                 fmt::format("steps of linear learning-rate warmup before the cosine (default: {})", o.warmup))
      ->check(CLI::NonNegativeNumber);
  app.add_option("--schedule-steps", o.schedule_steps,
                 "the learning-rate schedule's length (default: --steps; a run saved to resume later passes the "
                 "final step count)")
      ->check(CLI::PositiveNumber);
  app.add_option("--save", o.save_dir,
                 "save the model and optimizer to this checkpoint directory after the last step (default: none)");
  app.add_option("--resume", o.resume_dir,
                 "resume from this checkpoint (any mesh and plan) up to --steps (default: none, start afresh)");
  app.add_option("--lr", o.lr, fmt::format("peak learning rate (AdamW) (default: {})", o.lr))
      ->check(CLI::PositiveNumber);
  app.add_option("--weight-decay", o.weight_decay, fmt::format("AdamW's weight decay (default: {})", o.weight_decay))
      ->check(CLI::NonNegativeNumber);
  app.add_option("--clip", o.clip, fmt::format("max gradient norm, 0: off (default: {})", o.clip))
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, fmt::format("seed of the initial weights and the batches (default: {})", o.seed));
  app.add_option("--dtype", cl.dtype_text,
                 fmt::format("parameters and activations: f32, f64 or bf16 (default: {})", cl.dtype_text))
      ->check(CLI::IsMember({"f32", "f64", "bf16"}));
  app.add_option("--text", o.text, "training text (default: the fetched cache, else the committed slice)");
  app.add_option("--eval-every", o.eval_every,
                 fmt::format("validation loss every N steps (default: {}, at the end only)", o.eval_every))
      ->check(CLI::NonNegativeNumber);
}

void add_output_options(CLI::App& app, CommandLine& cl) {
  train::TrainOptions& o = cl.options;
  app.add_option("--json", cl.json_path,
                 "write config, losses, collectives and memory as one JSON object (default: none)");
  app.add_option("--plot", cl.plot_path, "draw the training and validation loss as an SVG (default: none)");
  app.add_flag("--overlap", o.overlap_grad_reduce,
               "start the gradients' all_reduce (ddp) or reduce_scatter (zero1) during the backward, bucket by "
               "bucket; plans ddp, zero1, tp, tp_sp only; zero1's all_gather of the updated parameters runs "
               "under the next forward (default: off)");
  app.add_flag("--no-param-overlap", cl.no_param_overlap,
               "with --overlap: zero1 gathers the updated parameters in the step, not under the next forward "
               "(default: under the next forward)");
  app.add_option("--budget", cl.budget_text,
                 "fail an allocation that would hold more than this on any rank (OutOfBudget naming the rank), "
                 "e.g. 512MiB (default: DTENSOR_MEMORY_BUDGET, else none)");
  app.add_flag("--domino", o.domino,
               "tp, tp_sp: split each rank's batch rows into chunks whose tensor-parallel collectives run under "
               "each other's computation, forward and backward, Domino (default: off)");
  app.add_option("--domino-chunks", o.domino_chunks,
                 "with --domino: the chunks of each rank's rows; more hide a collective after a short stage "
                 "(tp_sp's all_gathers) under more computation, at smaller GEMMs (default: 2)");
  app.add_flag("!--no-prefetch", o.prefetch_units,
               "fsdp: gather each unit when its block runs, not under the block before (default: prefetch)");
  app.add_flag("!--no-reduce-overlap", o.overlap_unit_reduce,
               "fsdp: reduce each unit's gradient when its block's backward ends, not under the next block's "
               "(default: overlapped)");
  app.add_flag("!--no-reshard-after-forward", o.reshard_after_forward,
               "fsdp: keep each block's gathered unit from its forward to its backward: no second gather, no "
               "recomputation, more memory (default: reshard, as FSDP2)");
  app.add_flag("--explain", o.explain,
               "print rank 0's layout decisions and collectives during the last step (default: off)");
  app.add_option("--trace", o.trace,
                 "record the last step as a Chrome trace (open in ui.perfetto.dev) (default: none)");
  app.add_option_function<double>(
         "--bucket-mib", [&o](double mib) { o.gradient_buckets = nn::gradient_buckets(mib); },
         "the gradients' buckets, in MiB; the first holds at most 1 (default: 25)")
      ->check(CLI::PositiveNumber);
  // launch() applies it to every rank's communicators; named here so that
  // --help lists it and a bad value exits 2 before any rank starts.
  app.add_option("--link", cl.link_text,
                 "model a slower link on every rank's calls, LATENCY,BANDWIDTH such as 10us,5GB/s (default: the "
                 "machine's own speed)");
  app.add_flag("--trace-measured", cl.trace_measured,
               "draw --trace-svg on the times the trace recorded, where overlap shows, not in logical time "
               "(default: off)");
  app.add_option("--trace-svg", cl.trace_svg_path,
                 "draw the --trace file's timeline as an SVG (logical time unless --trace-measured) (default: none)");
  app.add_option("--generate", o.generate,
                 fmt::format("bytes to sample greedily after training (default: {})", o.generate))
      ->check(CLI::NonNegativeNumber);
}

// Reads the texts into cl.options and checks, before any rank starts, what
// can be checked; ValueError (or another Error) naming the value otherwise.
// Resolves the training text's path last.
void check_command_line(CommandLine& cl) {
  train::TrainOptions& o = cl.options;
  o.model.dtype = parse_dtype(cl.dtype_text);
  o.model.moe.drop_policy = cl.drop_policy == "position" ? nn::DropPolicy::Position : nn::DropPolicy::Probs;
  o.model.moe.balance = cl.balance == "bias" ? nn::Balance::Bias : nn::Balance::AuxLoss;
  o.plans = split_list(cl.plan_text);
  if (!cl.budget_text.empty()) o.memory_budget = static_cast<std::size_t>(parse_bytes(cl.budget_text));
  if (!cl.mesh_text.empty()) o.mesh = parse_mesh(cl.mesh_text);
  if (!cl.dims_text.empty()) o.dims = split_list(cl.dims_text);
  const std::size_t ndim = o.mesh.empty() ? o.plans.size() : o.mesh.size();
  if (o.plans.size() != ndim)
    throw ValueError(fmt::format("--plan '{}' names {} plans for a mesh of {} dims; expected one per dim", cl.plan_text,
                                 o.plans.size(), ndim));
  if (!cl.trace_svg_path.empty() && o.trace.empty())
    throw ValueError(
        fmt::format("--trace-svg '{}' draws the trace of --trace FILE; give --trace too", cl.trace_svg_path));
  if (!o.dims.empty() && o.dims.size() != ndim)
    throw ValueError(fmt::format("--dims '{}' names {} dims for a mesh of {} dims", cl.dims_text, o.dims.size(), ndim));
  std::vector<nn::DimPlan> per_dim;
  for (const auto& p : o.plans) per_dim.push_back(nn::plan_named(p));
  o.model.check();
  if (!o.mesh.empty() && launch_backend() == "threads" && numel(o.mesh) != cl.ranks)
    throw ValueError(fmt::format("--mesh {} has {} ranks; --ranks is {}", cl.mesh_text, numel(o.mesh), cl.ranks));
  // What the mesh's sizes decide, before any rank starts: on threads a
  // 1-D mesh is all the ranks.
  const Shape mesh_shape = !o.mesh.empty() ? o.mesh : launch_backend() == "threads" ? Shape{cl.ranks} : Shape{};
  if (!mesh_shape.empty()) {
    nn::check_plans_fit(per_dim, mesh_shape, o.model, o.batch);
    // A pipeline that cannot be scheduled (1f1b with m < p, ...) is refused
    // here, before any rank starts, let alone sends.
    train::pipeline_schedule(o, mesh_shape);
  }
  if (!o.resume_dir.empty() && !std::filesystem::exists(std::filesystem::path(o.resume_dir) / "manifest.json"))
    throw ValueError(fmt::format("--resume '{}' is not a checkpoint: it has no manifest.json", o.resume_dir));
  o.text = train::find_text(o.text.empty() ? std::nullopt : std::optional<std::string>(o.text));
}

// The options as this job runs them: the mesh (all ranks on one dim unless
// given) and its dim names filled in.
train::TrainOptions options_for_job(const train::TrainOptions& o, const Communicator& world) {
  train::TrainOptions mine = o;
  if (mine.mesh.empty()) mine.mesh = {world.size()};
  if (mine.dims.empty())
    for (std::size_t m = 0; m < mine.mesh.size(); ++m)
      mine.dims.push_back(mine.mesh.size() == 1 ? "dp" : fmt::format("d{}", m));
  if (numel(mine.mesh) != world.size())
    throw ValueError(fmt::format("--mesh {} has {} ranks; the job has {}", fmt::join(mine.mesh, "x"), numel(mine.mesh),
                                 world.size()));
  return mine;
}

// One MoE block's load in the last step as a bar per expert, scaled to the
// busiest, with the mean (where a balanced router would put every expert)
// marked '|'.
void print_load_histogram(std::size_t block, const std::vector<std::int64_t>& load) {
  const std::int64_t total = std::accumulate(load.begin(), load.end(), std::int64_t{0});
  const std::int64_t most = std::max<std::int64_t>(1, *std::max_element(load.begin(), load.end()));
  const double mean = static_cast<double>(total) / static_cast<double>(load.size());
  constexpr int kWidth = 40;
  const auto mean_at = static_cast<int>(std::lround(mean / static_cast<double>(most) * kWidth));
  fmt::print("expert load of MoE block {} in the last step ({} assignments; '|' marks the mean, {:.1f}):\n", block,
             total, mean);
  for (std::size_t e = 0; e < load.size(); ++e) {
    const auto bar = static_cast<int>(std::lround(static_cast<double>(load[e]) / static_cast<double>(most) * kWidth));
    std::string line(static_cast<std::size_t>(std::max(bar, mean_at + 1)), ' ');
    std::fill_n(line.begin(), bar, '#');
    line[static_cast<std::size_t>(mean_at)] = '|';
    fmt::print("  expert {:3d} {:7d} {}\n", e, load[e], line);
  }
}

// Rank 0's summary after the last step: validation loss, throughput, one
// step's collectives, memory, and the generated bytes; with --explain, the
// experts' load as histograms.
void print_summary(const train::TrainResult& r, bool explain) {
  fmt::print("validation loss {:.6f}; {:.0f} tokens/s\n", r.val_loss, r.tokens_per_second);
  fmt::print("collectives of one step on rank 0:\n");
  for (const auto& c : r.comm)
    fmt::print("  {:9s} {:15s} over {:8s} x{:<3d} {} bytes\n", c.phase, c.kind,
               fmt::format("{}", fmt::join(c.mesh_dims, ",")), c.count, c.bytes);
  if (r.comm.empty()) fmt::print("  none\n");
  fmt::print("memory per rank (the busiest): parameters {}, gradients {}, optimizer states {}; peak of a step {}\n",
             human_bytes(static_cast<std::int64_t>(r.parameter_bytes)),
             human_bytes(static_cast<std::int64_t>(r.gradient_bytes)),
             human_bytes(static_cast<std::int64_t>(r.optimizer_state_bytes)),
             human_bytes(static_cast<std::int64_t>(r.peak_bytes)));
  if (r.schedule)
    fmt::print("pipeline: schedule {} ({} stages, {} micro-batches); bubble of the last step {:.1f}% (measured)\n",
               r.schedule->name, r.schedule->stages, r.schedule->microbatches, 100 * r.bubble_fraction);
  for (std::size_t b = 0; b < r.expert_load.size(); ++b)
    fmt::print("experts of MoE block {}: assignments routed in the last step {}{}\n", b, fmt::join(r.expert_load[b], " "),
               b + 1 == r.expert_load.size() ? fmt::format("; dropped {}", r.dropped) : "");
  if (explain)
    for (std::size_t b = 0; b < r.expert_load.size(); ++b) print_load_histogram(b, r.expert_load[b]);
  if (!r.generated.empty()) fmt::print("generated: {:?}\n", r.generated);
}

// The files rank 0 writes after the run: --json, --plot and --trace-svg.
void write_output_files(const CommandLine& cl, const train::TrainOptions& mine, const train::TrainResult& r,
                        const std::string& mesh_desc) {
  if (!cl.json_path.empty()) {
    // A young model's bytes need not be UTF-8: invalid ones become U+FFFD.
    std::ofstream(cl.json_path)
        << to_json(mine, r, mesh_desc, cl.plan_text).dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
        << "\n";
  }
  if (!cl.plot_path.empty()) {
    const std::string title =
        fmt::format("GPT {}L d{} h{} seq{} {} | mesh {} | plan {} | lr {}", mine.model.layers, mine.model.d_model,
                    mine.model.heads, mine.model.seq, dtype_name(mine.model.dtype), mesh_desc, cl.plan_text, mine.lr);
    train::write_loss_svg(cl.plot_path, title, r.losses, r.val_points);
  }
  if (!cl.trace_svg_path.empty()) {
    std::ifstream in(mine.trace);
    const std::string trace((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    pictures::TimelineOptions options;
    if (cl.trace_measured) options.clock = pictures::TimelineClock::Measured;
    options.title = fmt::format("one step of GPT {}L d{} | mesh {} | plan {}", mine.model.layers, mine.model.d_model,
                                mesh_desc, cl.plan_text);
    std::ofstream out(cl.trace_svg_path);
    // A pipeline's step on the measured clock, where its bubble shows.
    out << (r.schedule ? train::pipeline_step_svg(trace, *r.schedule, options.title)
                       : pictures::timeline_svg(trace, options));
    if (!out) throw Error(fmt::format("could not write --trace-svg '{}'", cl.trace_svg_path));
  }
}

// One rank's run: trains, prints the loss per step, and on rank 0 the
// summary and the output files.
void train_on_rank(Communicator& world, const CommandLine& cl, const train::TextData& data) {
  const train::TrainOptions mine = options_for_job(cl.options, world);
  const bool lead = world.rank() == 0;
  const std::string mesh_desc = fmt::format("{}", fmt::join(mine.mesh, "x"));
  if (lead)
    fmt::print("train_gpt: {} layers, d_model {}, {} heads, seq {}, {} on mesh {} ({}), plan {}\n", mine.model.layers,
               mine.model.d_model, mine.model.heads, mine.model.seq, dtype_name(mine.model.dtype), mesh_desc,
               fmt::join(mine.dims, ","), cl.plan_text);
  const train::TrainResult r = train::train(mine, data, &world, [&](std::int64_t step, double loss, double s) {
    if (lead) fmt::print("step {:4d}  loss {:.6f}  {:.1f} ms\n", step, loss, 1e3 * s);
  });
  if (!lead) return;
  print_summary(r, mine.explain);
  write_output_files(cl, mine, r, mesh_desc);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"train_gpt: a byte-level GPT-2 on Shakespeare, on any mesh and parallel plan"};
  // Wide enough that every option and its description share one line.
  app.get_formatter()->column_width(36);
  CommandLine cl;
  cl.options.model = {.vocab = 256, .seq = 32, .layers = 2, .d_model = 64, .heads = 4, .dtype = DType::Float32};
  add_mesh_and_model_options(app, cl);
  add_training_options(app, cl);
  add_output_options(app, cl);
  try {
    app.parse(argc, argv);
    cl.options.overlap_param_gather = cl.options.overlap_grad_reduce && !cl.no_param_overlap;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "train_gpt: {}\n", e.what());
    return 2;
  }

  std::optional<train::TextData> data;
  try {
    check_command_line(cl);
    if (!cl.link_text.empty()) (void)LinkModel::parse(cl.link_text);
    data.emplace(cl.options.text);
  } catch (const Error& e) {
    fmt::print(stderr, "train_gpt: {}\n", e.what());
    return 2;
  }

  LaunchOptions launch_options;
  launch_options.default_ranks = 1;
  return launch(
      argc, argv, [&](Communicator& world) { train_on_rank(world, cl, *data); }, launch_options);
}
