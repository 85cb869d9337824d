// Pipelined training: each rank holds its stages of the GPT and runs its
// list of the schedule each step; the optimizer steps once per step on the
// stages' parameters, after every microbatch's backward has accumulated.
#include "pipeline_trainer.h"

#include <algorithm>
#include <chrono>

#include <dtensor/checkpoint/checkpoint.h>
#include <dtensor/core/memory_account.h>
#include <dtensor/nn/optim.h>
#include <dtensor/nn/parallel_plan.h>
#include <dtensor/nn/pipeline_runtime.h>

#include "step_comm.h"

namespace dtensor::train::detail {

namespace pipe = nn::pipeline;

std::optional<int> pipeline_dim(const std::vector<std::string>& plans) {
  for (std::size_t d = 0; d < plans.size(); ++d)
    if (plans[d] == "pp") return static_cast<int>(d);
  return std::nullopt;
}

namespace {

// How host batches become a stage's inputs: plain tensors when pp is the
// only dim, else DTensors on the other dims' submesh under their plans; and
// how their tensors are saved and resumed.
struct PlainStages {
  using X = Tensor;
  DType dtype;
  nn::ParameterFactory<Tensor> factory() const { return nn::plain_parameters(dtype); }
  nn::ActivationLayouts activations(bool = false) const { return {}; }
  Tensor input(const Tensor& host, bool = false) const { return host; }
  std::vector<Layout> state_layouts(const nn::NamedParameters<Tensor>&) const { return {}; }
  void prepare(pipe::GPTStage<Tensor>&) const {}
  std::optional<Layout> layout_of(const Tensor&) const { return std::nullopt; }
  std::optional<Layout> state_layout_of(const nn::AdamW<Tensor>&, std::size_t) const { return std::nullopt; }
  Tensor scalar(std::int64_t v) const { return steps_tensor(v); }
  std::map<std::string, Tensor> load(const std::string& dir, const std::map<std::string, StateTarget>& want) const {
    return load_plain(dir, want);
  }
};
struct MeshStages {
  using X = DTensor;
  DType dtype;
  nn::ParallelPlan plan;
  nn::ParameterFactory<DTensor> factory() const { return plan.parameter_factory(dtype); }
  nn::ActivationLayouts activations(bool generation = false) const { return plan.activations(generation); }
  DTensor input(const Tensor& host, bool generation = false) const {
    return from_full(host, plan.mesh(), plan.batch_layout(generation));
  }
  std::vector<Layout> state_layouts(const nn::NamedParameters<DTensor>& named) const {
    return plan_state_layouts(plan, named);
  }
  // fsdp: each parameter a shard, gathered for its piece of the stage.
  void prepare(pipe::GPTStage<DTensor>& stage) const {
    GatheredLayouts gathered = plan_gathered_layouts(plan, stage.named_parameters());
    stage.root_gathered_layouts = std::move(gathered.root);
    stage.gathered_layouts = std::move(gathered.blocks);
  }
  std::optional<Layout> layout_of(const DTensor& t) const { return t.placements(); }
  std::optional<Layout> state_layout_of(const nn::AdamW<DTensor>& opt, std::size_t i) const {
    return opt.state_layout(i);
  }
  DTensor scalar(std::int64_t v) const { return steps_tensor(v, plan.mesh()); }

  std::map<std::string, DTensor> load(const std::string& dir, const std::map<std::string, StateTarget>& want) const {
    return load_on(plan.mesh(), dir, want);
  }
};

std::uint64_t largest(const DeviceMesh& mesh, std::uint64_t v) {
  double x = static_cast<double>(v);
  mesh.comm().all_reduce(&x, &x, 1, DType::Float64, ReduceOp::Max);
  return static_cast<std::uint64_t>(x);
}

// In microbatch order, as the unpipelined loop adds them.
double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

double mean_over_ranks(const DeviceMesh& mesh, double v) {
  mesh.comm().all_reduce(&v, &v, 1, DType::Float64, ReduceOp::Avg);
  return v;
}

std::uint64_t local_bytes(const Tensor& x) { return x.nbytes(); }
std::uint64_t local_bytes(const DTensor& x) { return x.to_local().nbytes(); }

// The busiest rank's bytes of parameters, gradients (each its parameter's
// size) and AdamW's moments, and of the peak of a step.
template <class X>
void record_memory(TrainResult& result, const DeviceMesh& mesh, const nn::AdamW<X>& optimizer, std::size_t step_peak) {
  std::uint64_t params = 0, states = 0;
  for (std::size_t i = 0; i < optimizer.params().size(); ++i) {
    params += local_bytes(optimizer.params()[i]);
    if (optimizer.exp_avg(i)) states += local_bytes(*optimizer.exp_avg(i)) + local_bytes(*optimizer.exp_avg_sq(i));
  }
  result.parameter_bytes = result.gradient_bytes = largest(mesh, params);
  result.optimizer_state_bytes = largest(mesh, states);
  result.peak_bytes = largest(mesh, step_peak);
}

// Greedy sampling of `count` bytes after `context`, as the unpipelined
// trainer does it (one position at a time through each stage's KV cache,
// restarted from the last half of the context when full): the last stage's
// rank picks each byte and broadcasts it over pp.
template <class Stages, class X = typename Stages::X>
std::string generate(const Stages& env, const pipe::Schedule& schedule, std::span<pipe::GPTStage<X>* const> mine,
                     Communicator& pp, std::vector<std::int64_t> context, std::int64_t count) {
  NoGradGuard no_grad;
  for (auto* stage : mine) stage->layouts = env.activations(true);
  const int last = schedule.rank_of_stage(schedule.stages - 1);
  std::vector<nn::KVCache<X>> caches;
  const std::string out =
      greedy_bytes(std::move(context), count, mine.front()->config.seq,
                   [&](const std::vector<std::int64_t>& pending, bool fresh) {
                     if (fresh) caches.assign(mine.size(), nn::KVCache<X>{});
                     const auto n = static_cast<std::int64_t>(pending.size());
                     const X tokens = env.input(Tensor::from_vector(pending, {1, n}), true);
                     const std::optional<X> logits = pipe::forward_through<X>(schedule, mine, pp, tokens, caches);
                     double token = logits ? first_value(argmax(narrow(*logits, 1, n - 1, 1), -1)) : 0;
                     pp.broadcast(&token, sizeof token, last);  // the last stage's rank chose it
                     return static_cast<std::int64_t>(token);
                   });
  for (auto* stage : mine) stage->layouts = env.activations(false);
  return out;
}

// This rank's part of a checkpoint: its stages' parameters and AdamW's
// moments under the whole model's names ("exp_avg.<name>", ...), and on the
// first stage's group the steps done; the parts together are what the
// unpipelined trainer saves, so either resumes the other.
// A tied weight's copy on the last stage is left to the first stage's
// group, which saves the weight once.
template <class Stages, class X = typename Stages::X>
std::map<std::string, X> stage_state(const nn::NamedParameters<X>& named, std::span<const std::size_t> tied_copies,
                                     const nn::AdamW<X>& opt, std::int64_t steps_done, bool first_stage,
                                     const Stages& env) {
  NoGradGuard no_grad;
  std::map<std::string, X> out;
  std::vector<std::string> names;
  for (const auto& [name, p] : named) names.push_back(name);
  const std::map<std::string, X> moments = opt.state_dict(names);
  for (std::size_t i = 0; i < named.size(); ++i) {
    if (std::ranges::find(tied_copies, i) != tied_copies.end()) continue;
    out.emplace(names[i], *named[i].second);
    for (const char* prefix : {"exp_avg.", "exp_avg_sq."})
      if (const auto it = moments.find(prefix + names[i]); it != moments.end()) out.emplace(it->first, it->second);
  }
  if (first_stage) out.emplace(kStepsDone, env.scalar(steps_done));
  return out;
}

// The stages' parameters from a checkpoint (saved on any mesh), in their
// layouts; returns the steps it was saved after. A tied copy gets its own
// storage, even where the first stage's weight is on this rank too.
template <class Stages, class X = typename Stages::X>
std::int64_t load_stage_parameters(const std::string& dir, const nn::NamedParameters<X>& named,
                                   std::span<const std::size_t> tied_copies, const Stages& env) {
  std::map<std::string, StateTarget> want{{kStepsDone, {std::nullopt, {}, DType::Int64}}};
  for (const auto& [name, p] : named) want.emplace(name, StateTarget{env.layout_of(*p), p->shape(), p->dtype()});
  auto got = env.load(dir, want);
  for (std::size_t i = 0; i < named.size(); ++i) {
    X& p = *named[i].second;
    const X& loaded = got.at(named[i].first);
    if (std::ranges::find(tied_copies, i) != tied_copies.end()) {
      p = pipe::leaf_copy(loaded);
    } else {
      p = loaded.detach();
      p.requires_grad_();
    }
  }
  return static_cast<std::int64_t>(first_value(got.at(kStepsDone)));
}

template <class Stages, class X = typename Stages::X>
void load_stage_moments(const std::string& dir, const nn::NamedParameters<X>& named, nn::AdamW<X>& opt,
                        std::int64_t updates, const Stages& env) {
  std::map<std::string, StateTarget> want;
  std::vector<std::string> names;
  for (const auto& [name, p] : named) {
    for (const char* prefix : {"exp_avg.", "exp_avg_sq."})
      want.emplace(prefix + name, StateTarget{env.state_layout_of(opt, names.size()), p->shape(), p->dtype()});
    names.push_back(name);
  }
  opt.load_state_dict(env.load(dir, want), names, updates);
}

// This rank's stages of the GPT (built whole first, so that every
// parameter has the one-rank model's values), pointers to them, and their
// parameters under the whole model's names, with which of those are a tied
// weight's last-stage copy. Moved, never copied: the pointers point into
// `stages`' buffer.
template <class X>
struct RankStages {
  std::vector<pipe::GPTStage<X>> stages;
  std::vector<pipe::GPTStage<X>*> mine;
  nn::NamedParameters<X> named;
  std::vector<std::size_t> tied_copies;  // indices into `named`
  RankStages() = default;
  RankStages(RankStages&&) noexcept = default;
  RankStages(const RankStages&) = delete;
};

template <class Stages, class X = typename Stages::X>
RankStages<X> take_stages(const TrainOptions& o, const Stages& env, const pipe::Schedule& schedule, int rank) {
  nn::GPT<X> whole = nn::GPT<X>::init(o.model, o.seed, env.factory(), env.activations());
  const pipe::LayerSplit split = pipe::split_layers(o.model.layers, schedule.stages, o.layer_split);
  RankStages<X> out;
  for (int s : schedule.stages_of_rank.at(static_cast<std::size_t>(rank)))
    out.stages.push_back(pipe::GPTStage<X>::take(whole, split, s));
  for (auto& stage : out.stages) {
    env.prepare(stage);
    out.mine.push_back(&stage);
    for (auto& member : stage.named_parameters()) {
      if (stage.holds_tied_copy() && member.second == &stage.lm_head->weight) out.tied_copies.push_back(out.named.size());
      out.named.push_back(member);
    }
  }
  return out;
}

// The whole run on this rank, once the mesh, its pp dim and the schedule
// are known.
template <class Stages>
TrainResult run(const TrainOptions& o, const TextData& data, const Stages& env, const DeviceMesh& mesh, int pp_dim,
                const pipe::Schedule& schedule, const StepCallback& on_step) {
  using X = typename Stages::X;
  // Everything this rank allocates from here on is charged to it.
  const auto memory = rank_account(o, mesh.rank());
  const ChargeMemoryTo charge(memory);
  std::size_t step_peak = 0;
  Communicator& pp = mesh.dim_comm(pp_dim);
  RankStages<X> held = take_stages(o, env, schedule, pp.rank());
  const std::vector<pipe::GPTStage<X>*>& mine = held.mine;
  const nn::NamedParameters<X>& named = held.named;
  const std::int64_t first_step =
      o.resume_dir.empty() ? 0 : load_stage_parameters(o.resume_dir, named, held.tied_copies, env);
  if (first_step > o.steps)
    throw ValueError(
        fmt::format("[train] {} was saved after step {}, past --steps {}", o.resume_dir, first_step, o.steps));
  std::vector<X> params;
  for (const auto& member : named) params.push_back(*member.second);
  nn::AdamW<X> optimizer(params, {.lr = o.lr,
                                  .weight_decay = o.weight_decay,
                                  .sharding = {.buckets = o.gradient_buckets,
                                               .state_layouts = env.state_layouts(named)}});
  if (first_step > 0) load_stage_moments(o.resume_dir, named, optimizer, first_step, env);
  const std::int64_t schedule_steps = o.schedule_steps > 0 ? o.schedule_steps : o.steps;
  auto inputs_of = [&](Split part, std::int64_t first_draw, std::int64_t count) {
    pipe::StepInputs<X> in;
    for (std::int64_t i = 0; i < count; ++i) {
      const Batch b = data.next_batch(part, o.batch, o.model.seq, static_cast<std::uint64_t>(first_draw + i), o.seed);
      in.tokens.push_back(env.input(Tensor::from_vector(b.inputs, {o.batch, o.model.seq})));
      in.targets.push_back(env.input(Tensor::from_vector(b.targets, {o.batch, o.model.seq})));
    }
    return in;
  };

  TrainResult result;
  result.first_step = first_step;
  double seconds = 0;
  for (std::int64_t step = first_step; step < o.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    memory->reset_peak();
    optimizer.set_lr(nn::warmup_cosine_lr(step, o.warmup, schedule_steps, o.lr, o.lr / 10));
    pipe::StepInputs<X> in = inputs_of(Split::Train, step * o.micro_batches, o.micro_batches);
    in.loss_scales = pipe::equal_loss_scales(o.micro_batches, o.batch * o.model.seq);
    const bool last = step == o.steps - 1;
    std::optional<TraceScope> trace;  // the last step's, as the unpipelined loop records
    if (last && !o.trace.empty()) trace.emplace(mesh, o.trace);
    std::optional<ExplainScope> explain;  // rank 0's decisions: its stages' ops
    if (last && o.explain && mesh.rank() == 0) explain.emplace();
    const DimsStats before = mesh_stats(mesh);
    pipe::StepTimeline timeline;
    const std::vector<double> losses = pipe::run_step<X>(schedule, mine, pp, in, last ? &timeline : nullptr);
    const DimsStats passed = mesh_stats(mesh);
    pipe::sum_tied_gradients<X>(schedule, mine, pp);  // a tied weight's two copies: one gradient
    // The norm over every stage's gradients: each stage's part, summed over
    // pp, a tied weight's counted once.
    if (o.clip > 0) nn::clip_grad_norm<X>(params, o.clip, 2.0, o.gradient_buckets, &pp, held.tied_copies);
    optimizer.step();  // once per step: under ddp its gradients' reduction too
    step_peak = memory->peak_bytes();
    optimizer.zero_grad();
    const DimsStats updated = mesh_stats(mesh);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step > first_step || o.steps - first_step == 1) seconds += took;
    result.losses.push_back(mean(losses));
    if (trace) trace->finish();
    if (last) {
      // Forwards and backwards interleave in a pipeline: one phase for both.
      add_phase(result.comm, "pipeline", passed - before, mesh.dim_names());
      add_phase(result.comm, "optimizer", updated - passed, mesh.dim_names());
      result.bubble_fraction = mean_over_ranks(mesh, timeline.idle_fraction());
    }
    if (on_step) on_step(step, result.losses.back(), took);
  }
  result.tokens_per_second = tokens_per_second(o, o.steps - first_step, seconds);
  if (!o.save_dir.empty())
    dcp::save_parts(o.save_dir,
                    stage_state(named, held.tied_copies, optimizer, o.steps, pp.rank() == schedule.rank_of_stage(0), env),
                    mesh.comm());
  if (o.val_batches > 0) {  // none: no validation loss (0), as the unpipelined trainer's
    NoGradGuard no_grad;
    const pipe::StepInputs<X> val = inputs_of(Split::Validation, 0, o.val_batches);
    result.val_loss =
        mean(pipe::run_step<X>(pipe::forward_only(schedule, static_cast<int>(o.val_batches)), mine, pp, val));
  }
  result.val_points.emplace_back(o.steps - 1, result.val_loss);
  record_memory(result, mesh, optimizer, step_peak);
  result.schedule = schedule;
  if (o.generate > 0) {
    const Batch prompt = data.next_batch(Split::Validation, 1, std::max<std::int64_t>(1, o.model.seq / 4), 0, o.seed);
    result.generated =
        generate(env, schedule, std::span<pipe::GPTStage<X>* const>(mine), pp, prompt.inputs, o.generate);
  }
  return result;
}

}  // namespace

TrainResult train_pipelined(const TrainOptions& o, const TextData& data, Communicator& world,
                            const StepCallback& on_step) {
  if (o.overlap_grad_reduce || o.overlap_param_gather)
    throw ValueError(
        "[train] overlap_grad_reduce / overlap_param_gather with plan 'pp': a pipeline's stages reduce their "
        "gradients after the schedule, not overlapped yet");
  std::vector<nn::DimPlan> all_plans;
  for (const std::string& name : o.plans) all_plans.push_back(nn::plan_named(name));
  nn::check_plans_fit(all_plans, o.mesh, o.model, o.batch);  // the whole mesh's rules (one pp dim) first
  const pipe::Schedule schedule = *pipeline_schedule(o, o.mesh);
  DeviceMesh mesh(world, o.mesh, o.dims);
  const int pp_dim = *pipeline_dim(o.plans);
  std::vector<std::string> other_dims;
  std::vector<nn::DimPlan> other_plans;
  for (std::size_t d = 0; d < o.plans.size(); ++d)
    if (static_cast<int>(d) != pp_dim) {
      other_dims.push_back(mesh.dim_names()[d]);
      other_plans.push_back(nn::plan_named(o.plans[d]));
    }
  if (other_dims.empty()) return run(o, data, PlainStages{o.model.dtype}, mesh, pp_dim, schedule, on_step);
  nn::ParallelPlan plan(mesh.submesh(other_dims), std::move(other_plans));
  plan.shard_each_parameter();  // fsdp: a stage cannot hold the whole model's flat units
  plan.check_fits(o.model, o.batch);
  return run(o, data, MeshStages{o.model.dtype, std::move(plan)}, mesh, pp_dim, schedule, on_step);
}

}  // namespace dtensor::train::detail

namespace dtensor::train {

std::optional<nn::pipeline::Schedule> pipeline_schedule(const TrainOptions& o, const Shape& mesh_shape) {
  const std::optional<int> dim = detail::pipeline_dim(o.plans);
  if (!dim) return std::nullopt;
  if (static_cast<std::size_t>(*dim) >= mesh_shape.size())
    throw ValueError(fmt::format("[train] plan pp on mesh dim {} of a mesh of {} dims", *dim, mesh_shape.size()));
  const int ranks = static_cast<int>(mesh_shape[static_cast<std::size_t>(*dim)]);
  nn::pipeline::Schedule schedule = nn::pipeline::make_schedule(o.schedule, ranks, static_cast<int>(o.micro_batches),
                                                                static_cast<int>(o.virtual_stages));
  nn::pipeline::split_layers(o.model.layers, schedule.stages, o.layer_split);
  if (ranks > 1) schedule = nn::pipeline::lower(schedule);
  nn::pipeline::check_runnable(schedule);  // I and W: refused here, before any rank sends anything
  return schedule;
}

}  // namespace dtensor::train
