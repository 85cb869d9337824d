// The training loop, written once for plain tensors and DTensors: an Env
// says how host batches become model inputs and how a loss is read.
#include "dtensor/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include <dtensor/checkpoint/checkpoint.h>
#include <dtensor/core/memory_account.h>
#include <dtensor/nn/optim.h>
#include <dtensor/nn/overlap.h>
#include <dtensor/nn/parallel_plan.h>

#include "pipeline_trainer.h"
#include "step_comm.h"

namespace dtensor::train {

using namespace dtensor;

namespace {

using detail::add_phase;
using detail::DimsStats;
using detail::first_value;
using detail::operator+;
using detail::operator-;

Tensor host_tokens(const std::vector<std::int64_t>& values, std::int64_t rows, std::int64_t cols) {
  return Tensor::from_vector(values, {rows, cols});
}

using detail::StateTarget;

// One rank, plain tensors.
struct PlainEnv {
  using X = Tensor;
  DType dtype;
  nn::ParameterFactory<Tensor> factory() const { return nn::plain_parameters(dtype); }
  nn::ActivationLayouts activations(bool) const { return {}; }
  Tensor input(const Tensor& host, bool) const { return host; }
  double value(const Tensor& t) const { return first_value(t); }
  DimsStats stats() const { return {}; }
  void start_trace(std::optional<TraceScope>&, const std::string& path) const {
    throw ValueError(
        fmt::format("--trace '{}' records the DTensor ops of a run on a mesh; this run has plain tensors", path));
  }
  bool lead() const { return true; }
  int rank() const { return 0; }
  std::vector<std::string> dim_names() const { return {}; }
  std::uint64_t largest(std::uint64_t v) const { return v; }
  std::vector<Layout> state_layouts(const nn::NamedParameters<Tensor>&) const { return {}; }
  void prepare(nn::GPT<Tensor>&) const {}
  void save(const std::string& dir, const std::map<std::string, Tensor>& state) const { dcp::save(dir, state); }
  // The named tensors whole (plain tensors have no layout).
  std::map<std::string, Tensor> load(const std::string& dir, const std::map<std::string, StateTarget>& want) const {
    return detail::load_plain(dir, want);
  }
  std::optional<Layout> layout_of(const Tensor&) const { return std::nullopt; }
  std::optional<Layout> state_layout_of(const nn::AdamW<Tensor>&, std::size_t) const { return std::nullopt; }
  Tensor scalar(std::int64_t v) const { return detail::steps_tensor(v); }
};

// DTensors on a mesh under a plan; every rank builds the same host batch
// and keeps its own box of it (no communication).
struct MeshEnv {
  using X = DTensor;
  DType dtype;
  DeviceMesh mesh;
  nn::ParallelPlan plan;
  nn::ParameterFactory<DTensor> factory() const { return plan.parameter_factory(dtype); }
  nn::ActivationLayouts activations(bool generation) const { return plan.activations(generation); }
  DTensor input(const Tensor& host, bool generation) const {
    return from_full(host, mesh, plan.batch_layout(generation));
  }
  double value(const DTensor& t) const { return first_value(t.full_tensor()); }
  void start_trace(std::optional<TraceScope>& trace, const std::string& path) const { trace.emplace(mesh, path); }
  DimsStats stats() const { return detail::mesh_stats(mesh); }
  bool lead() const { return mesh.rank() == 0; }
  int rank() const { return mesh.rank(); }
  std::vector<std::string> dim_names() const { return mesh.dim_names(); }
  std::vector<Layout> state_layouts(const nn::NamedParameters<DTensor>& named) const {
    return detail::plan_state_layouts(plan, named);
  }
  // FSDP: the parameters into flat units sharded over the fully sharding dims.
  void prepare(nn::GPT<DTensor>& model) const {
    if (const auto flat = plan.flat_layout()) nn::fully_shard(model, *flat);
    detail::GatheredLayouts gathered = detail::plan_gathered_layouts(plan, model.named_parameters());
    model.root_gathered_layouts = std::move(gathered.root);
    model.gathered_layouts = std::move(gathered.blocks);
  }
  void save(const std::string& dir, const std::map<std::string, DTensor>& state) const { dcp::save(dir, state); }
  std::map<std::string, DTensor> load(const std::string& dir, const std::map<std::string, StateTarget>& want) const {
    return detail::load_on(mesh, dir, want);
  }
  std::optional<Layout> layout_of(const DTensor& t) const { return t.placements(); }
  std::optional<Layout> state_layout_of(const nn::AdamW<DTensor>& opt, std::size_t i) const {
    return opt.state_layout(i);
  }
  DTensor scalar(std::int64_t v) const { return detail::steps_tensor(v, mesh); }
  std::uint64_t largest(std::uint64_t v) const {
    double x = static_cast<double>(v);
    mesh.comm().all_reduce(&x, &x, 1, DType::Float64, ReduceOp::Max);
    return static_cast<std::uint64_t>(x);
  }
};

// Greedy sampling of `count` bytes after `prompt`, one position at a time
// through the KV cache; when the context is full, the cache restarts from
// the last half of it.
template <class Env>
std::string generate(nn::GPT<typename Env::X>& model, const Env& env, std::vector<std::int64_t> context,
                     std::int64_t count) {
  using X = typename Env::X;
  NoGradGuard no_grad;
  model.layouts = env.activations(true);
  nn::KVCache<X> cache;
  const std::string out =
      detail::greedy_bytes(std::move(context), count, model.config.seq,
                           [&](const std::vector<std::int64_t>& pending, bool fresh) {
                             if (fresh) cache = nn::KVCache<X>{};
                             const auto n = static_cast<std::int64_t>(pending.size());
                             const X logits = model.logits(env.input(host_tokens(pending, 1, n), true), &cache);
                             return static_cast<std::int64_t>(env.value(argmax(narrow(logits, 1, n - 1, 1), -1)));
                           });
  model.layouts = env.activations(false);
  return out;
}

// ---- Checkpoints: any mesh and plan resumes from any other -------------------

using detail::kStepsDone;

// The model's parameters and AdamW's moments ("exp_avg.<name>",
// "exp_avg_sq.<name>") under the plain model's names, and the steps done.
// FSDP's flat units are gathered and cut into their members, so that the
// checkpoint does not depend on the plan that wrote it.
template <class Env>
std::map<std::string, typename Env::X> training_state(nn::GPT<typename Env::X>& model,
                                                      const nn::AdamW<typename Env::X>& opt, std::int64_t steps_done,
                                                      const Env& env) {
  using X = typename Env::X;
  NoGradGuard no_grad;
  std::map<std::string, X> out{{kStepsDone, env.scalar(steps_done)}};
  const std::vector<X>& params = opt.params();
  if constexpr (std::is_same_v<X, DTensor>) {
    if (!model.units.empty()) {
      for (std::size_t u = 0; u < model.units.size(); ++u) {
        const nn::FlatUnit<DTensor>& unit = model.units[u];
        auto put = [&](const std::string& prefix, const DTensor& flat) {
          const std::vector<DTensor> members = unit.unflatten(flat.redistribute(unit.gathered));
          for (std::size_t k = 0; k < members.size(); ++k) out.emplace(prefix + unit.names[k], members[k]);
        };
        put("", params[u]);
        if (opt.exp_avg(u)) {
          put("exp_avg.", *opt.exp_avg(u));
          put("exp_avg_sq.", *opt.exp_avg_sq(u));
        }
      }
      return out;
    }
  }
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) {
    out.emplace(name, params[names.size()]);
    names.push_back(name);
  }
  out.merge(opt.state_dict(names));
  return out;
}

// Before the plan's preparation (FSDP's flattening): the parameters from
// the checkpoint, in the layouts the plan gives them. Returns the steps done.
template <class Env>
std::int64_t load_parameters(const std::string& dir, nn::GPT<typename Env::X>& model, const Env& env) {
  std::map<std::string, StateTarget> want{{kStepsDone, {std::nullopt, {}, DType::Int64}}};
  auto named = model.named_parameters();
  for (const auto& [name, p] : named) want.emplace(name, StateTarget{env.layout_of(*p), p->shape(), p->dtype()});
  auto got = env.load(dir, want);
  for (auto& [name, p] : named) {
    *p = got.at(name).detach();
    p->requires_grad_();
  }
  return static_cast<std::int64_t>(env.value(got.at(kStepsDone)));
}

// After the optimizer is made: its moments from the checkpoint, in its state
// layouts (a flat FSDP unit's from its members, concatenated).
template <class Env>
void load_moments(const std::string& dir, nn::GPT<typename Env::X>& model, nn::AdamW<typename Env::X>& opt,
                  std::int64_t updates, const Env& env) {
  using X = typename Env::X;
  if constexpr (std::is_same_v<X, DTensor>) {
    if (!model.units.empty()) {
      for (std::size_t u = 0; u < model.units.size(); ++u) {
        const nn::FlatUnit<DTensor>& unit = model.units[u];
        std::map<std::string, StateTarget> want;
        for (const char* prefix : {"exp_avg.", "exp_avg_sq."})
          for (std::size_t k = 0; k < unit.names.size(); ++k)
            want.emplace(prefix + unit.names[k], StateTarget{std::nullopt, unit.shapes[k], unit.flat.dtype()});
        const auto got = env.load(dir, want);
        auto flat = [&](const std::string& prefix) {
          std::vector<Tensor> pieces;
          for (std::size_t k = 0; k < unit.names.size(); ++k)
            pieces.push_back(reshape(got.at(prefix + unit.names[k]).to_local(), {numel(unit.shapes[k])}));
          return from_full(cat(std::span<const Tensor>(pieces), 0), env.mesh, opt.state_layout(u));
        };
        opt.load_state(u, flat("exp_avg."), flat("exp_avg_sq."), updates);
      }
      return;
    }
  }
  std::map<std::string, StateTarget> want;
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) {
    for (const char* prefix : {"exp_avg.", "exp_avg_sq."})
      want.emplace(prefix + name, StateTarget{env.state_layout_of(opt, names.size()), p->shape(), p->dtype()});
    names.push_back(name);
  }
  opt.load_state_dict(env.load(dir, want), names, updates);
}

// One step's forward and backward passes over its micro-batches: the sum
// of their losses and the collectives of each phase.
struct Passes {
  DimsStats forward, backward;
  double loss_sum = 0;
};

template <class Env, class X, class BatchOf>
Passes forward_backward(nn::GPT<X>& model, const Env& env, const TrainOptions& o, std::int64_t step,
                        const BatchOf& batch_of, nn::OverlappedGradientReduction* overlap) {
  Passes out;
  for (std::int64_t micro = 0; micro < o.micro_batches; ++micro) {
    if (overlap) overlap->set_enabled(micro == o.micro_batches - 1);
    const auto [tokens, targets] = batch_of(Split::Train, static_cast<std::uint64_t>(step * o.micro_batches + micro));
    const DimsStats before = env.stats();
    const X loss = [&] {
      const CommScope named("forward");  // the timeline's scopes lane (backward and optimizer name themselves)
      return model.loss(tokens, targets);
    }();
    const DimsStats forwarded = env.stats();
    (o.micro_batches > 1 ? mul(loss, 1.0 / static_cast<double>(o.micro_batches)) : loss).backward();
    const DimsStats after = env.stats();
    out.forward = out.forward + (forwarded - before);
    out.backward = out.backward + (after - forwarded);
    out.loss_sum += env.value(loss);  // reading it is outside the phases (under dp it is a Partial sum)
  }
  return out;
}

// The MoE blocks' routing in the step just run (before end_moe_step
// starts the next step's count).
template <class X>
void record_routing(TrainResult& result, const nn::GPT<X>& model) {
  for (const nn::Block<X>& block : model.blocks)
    if (block.moe) {
      const nn::MoEState<X>& s = *block.moe->state;
      result.expert_load.push_back(s.step_load);
      result.dropped += s.step_dropped;
      result.aux_loss += s.aux_loss;
      result.z_loss += s.z_loss;
    }
}

// The busiest rank's bytes of parameters, gradients and optimizer states
// after the run, and of the peak of a step (`step_peak` on this rank).
template <class Env, class X>
void record_memory(TrainResult& result, const std::vector<X>& params, const nn::AdamW<X>& optimizer, const Env& env,
                   std::size_t step_peak) {
  std::uint64_t param_bytes = 0, grad_bytes = 0, state_bytes = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto local_bytes = [](const auto& x) -> std::uint64_t {
      if constexpr (std::is_same_v<std::decay_t<decltype(x)>, DTensor>)
        return x.to_local().nbytes();
      else
        return x.nbytes();
    };
    param_bytes += local_bytes(params[i]);
    grad_bytes += local_bytes(params[i]);  // a gradient takes its parameter's layout for the update
    if (optimizer.exp_avg(i)) state_bytes += local_bytes(*optimizer.exp_avg(i)) + local_bytes(*optimizer.exp_avg_sq(i));
  }
  result.parameter_bytes = env.largest(param_bytes);
  result.gradient_bytes = env.largest(grad_bytes);
  result.optimizer_state_bytes = env.largest(state_bytes);
  result.peak_bytes = env.largest(step_peak);
}

template <class Env>
TrainResult run(const TrainOptions& o, const TextData& data, const Env& env, const StepCallback& on_step) {
  using X = typename Env::X;
  const std::int64_t seq = o.model.seq;
  // Everything this rank allocates from here on (parameters, states,
  // gradients, activations, buffers of collectives) is charged to it.
  const auto memory = detail::rank_account(o, env.rank());
  const ChargeMemoryTo charge(memory);
  std::size_t step_peak = 0;
  nn::GPT<X> model = nn::GPT<X>::init(o.model, o.seed, env.factory(), env.activations(false));
  const std::int64_t first_step = o.resume_dir.empty() ? 0 : load_parameters(o.resume_dir, model, env);
  if (first_step > o.steps)
    throw ValueError(
        fmt::format("[train] {} was saved after step {}, past --steps {}", o.resume_dir, first_step, o.steps));
  env.prepare(model);
  model.prefetch_units = o.prefetch_units;
  model.overlap_unit_reduce = o.overlap_unit_reduce;
  model.reshard_after_forward = o.reshard_after_forward;
  model.domino = o.domino;
  model.domino_started = o.domino_started;
  model.domino_chunks = o.domino_chunks;
  std::vector<X> params = model.parameters();
  nn::AdamW<X> optimizer(params, {.lr = o.lr,
                                  .weight_decay = o.weight_decay,
                                  .sharding = {.buckets = o.gradient_buckets,
                                               .state_layouts = env.state_layouts(model.named_parameters()),
                                               .overlap_parameter_gather = o.overlap_param_gather}});
  if (first_step > 0) load_moments(o.resume_dir, model, optimizer, first_step, env);
  if (o.domino) {
    bool tensor_parallel = false;
    for (const std::string& plan : o.plans) {
      tensor_parallel = tensor_parallel || plan == "tp" || plan == "tp_sp";
      if (plan != "ddp" && plan != "zero1" && plan != "tp" && plan != "tp_sp")
        throw ValueError(fmt::format("[train] domino with plan '{}': Domino splits the blocks of meshes whose plans "
                                     "are ddp, zero1, tp or tp_sp",
                                     plan));
    }
    if (!tensor_parallel)
      throw ValueError(fmt::format("[train] domino with plans '{}': it overlaps tensor-parallel collectives; "
                                   "expected a tp or tp_sp dim",
                                   fmt::join(o.plans, ",")));
  }
  std::optional<nn::OverlappedGradientReduction> overlap;
  if (o.overlap_grad_reduce) {
    for (const std::string& plan : o.plans)
      if (plan != "ddp" && plan != "zero1" && plan != "tp" && plan != "tp_sp")
        throw ValueError(fmt::format("[train] overlap_grad_reduce with plan '{}': the gradient reduction overlaps on "
                                     "meshes whose plans are ddp, zero1, tp or tp_sp (fsdp overlaps its units' "
                                     "reductions with the backward already: overlap_unit_reduce)",
                                     plan));
    if constexpr (std::same_as<X, DTensor>) {
      std::vector<Layout> update_layouts;  // ZeRO's reduce_scatter: straight into the optimizer's part
      for (std::size_t i = 0; i < params.size(); ++i) update_layouts.push_back(optimizer.state_layout(i));
      overlap.emplace(params, std::move(update_layouts), o.gradient_buckets);
    } else
      throw ValueError("[train] overlap_grad_reduce on plain tensors: it needs a mesh with a ddp dim");
  }
  const std::int64_t schedule_steps = o.schedule_steps > 0 ? o.schedule_steps : o.steps;
  auto batch_of = [&](Split split, std::uint64_t draw) {
    const Batch b = data.next_batch(split, o.batch, seq, draw, o.seed);
    return std::pair{env.input(host_tokens(b.inputs, o.batch, seq), false),
                     env.input(host_tokens(b.targets, o.batch, seq), false)};
  };

  auto validation_loss = [&] {
    NoGradGuard no_grad;
    double sum = 0;
    for (std::int64_t i = 0; i < o.val_batches; ++i) {
      const auto [tokens, targets] = batch_of(Split::Validation, static_cast<std::uint64_t>(i));
      sum += env.value(model.loss(tokens, targets));
    }
    return o.val_batches > 0 ? sum / static_cast<double>(o.val_batches) : 0;
  };

  TrainResult result;
  result.first_step = first_step;
  double seconds = 0;
  for (std::int64_t step = first_step; step < o.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    std::optional<ExplainScope> explain;
    if (o.explain && step == o.steps - 1 && env.lead()) explain.emplace();
    std::optional<TraceScope> trace;
    if (!o.trace.empty() && step == o.steps - 1) env.start_trace(trace, o.trace);
    memory->reset_peak();
    optimizer.set_lr(nn::warmup_cosine_lr(step, o.warmup, schedule_steps, o.lr, o.lr / 10));
    const Passes passes = forward_backward(model, env, o, step, batch_of, overlap ? &*overlap : nullptr);
    const DimsStats before_update = env.stats();
    if (overlap) overlap->finish();  // its waits count as the update's, where the blocking path reduces
    if (o.clip > 0) nn::clip_grad_norm<X>(params, o.clip, 2.0, o.gradient_buckets);
    optimizer.step();
    if (step == o.steps - 1) record_routing(result, model);
    model.end_moe_step();  // Balance::Bias: the bias from this step's load
    step_peak = memory->peak_bytes();
    optimizer.zero_grad();
    const DimsStats update = env.stats() - before_update;
    // After the step's counts (writing the file gathers the ranks' events),
    // and here, not in the destructor, so that a failed write is an error.
    if (trace) trace->finish();
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The first step builds the caches (propagation, plans, memory): the
    // rate is the steady one after it, when there is an after.
    if (step > first_step || o.steps - first_step == 1) seconds += took;
    result.losses.push_back(passes.loss_sum / static_cast<double>(o.micro_batches));
    if (step == o.steps - 1) {
      result.comm.clear();
      add_phase(result.comm, "forward", passes.forward, env.dim_names());
      add_phase(result.comm, "backward", passes.backward, env.dim_names());
      add_phase(result.comm, "optimizer", update, env.dim_names());
    }
    if (on_step) on_step(step, result.losses.back(), took);
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < o.steps)
      result.val_points.emplace_back(step, validation_loss());
  }
  result.tokens_per_second = detail::tokens_per_second(o, o.steps - first_step, seconds);
  optimizer.wait_parameters();  // the last step's gathers, before a save reads the parameters

  if (!o.save_dir.empty()) env.save(o.save_dir, training_state(model, optimizer, o.steps, env));
  result.val_loss = validation_loss();
  result.val_points.emplace_back(o.steps - 1, result.val_loss);

  record_memory(result, params, optimizer, env, step_peak);

  if (o.generate > 0) {
    const Batch prompt = data.next_batch(Split::Validation, 1, std::max<std::int64_t>(1, seq / 4), 0, o.seed);
    result.generated = generate(model, env, prompt.inputs, o.generate);
  }
  return result;
}

}  // namespace

TrainResult train(const TrainOptions& o, const TextData& data, Communicator* world, const StepCallback& on_step) {
  if (o.warmup > o.steps)
    throw ValueError(fmt::format("[train] warmup = {} steps is more than the {} steps", o.warmup, o.steps));
  if (world == nullptr || o.mesh.empty()) return run(o, data, PlainEnv{o.model.dtype}, on_step);
  if (detail::pipeline_dim(o.plans)) return detail::train_pipelined(o, data, *world, on_step);
  DeviceMesh mesh(*world, o.mesh, o.dims);
  std::vector<nn::DimPlan> per_dim;
  for (const std::string& name : o.plans) per_dim.push_back(nn::plan_named(name));
  nn::ParallelPlan plan(mesh, std::move(per_dim));
  plan.check_fits(o.model, o.batch);
  return run(o, data, MeshEnv{o.model.dtype, mesh, std::move(plan)}, on_step);
}

}  // namespace dtensor::train
