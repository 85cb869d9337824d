// The plans' layouts, and reading one plan per mesh dim as layouts.
#include "dtensor/nn/parallel_plan.h"

#include <fmt/format.h>

#include "dtensor/api/pointwise.h"
#include "dtensor/api/shape_ops.h"
#include "dtensor/core/error.h"

namespace dtensor::nn {

using namespace dtensor::shorthand;

namespace {

std::array<std::optional<Placement>, kPoints> every_point(Placement p) {
  std::array<std::optional<Placement>, kPoints> out;
  out.fill(p);
  return out;
}

void set(std::array<std::optional<Placement>, kPoints>& at, Point p, Placement placement) {
  at[static_cast<std::size_t>(p)] = placement;
}

}  // namespace

bool matches(std::string_view pattern, std::string_view name) {
  // Iterative glob with one backtrack point: the last '*' seen.
  std::size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

DimPlan ddp() {
  DimPlan plan;
  plan.name = "ddp";
  plan.batch = S(0);
  plan.activations = every_point(S(0));
  plan.splits_batch = true;
  return plan;
}

DimPlan zero1() {
  DimPlan plan = ddp();
  plan.name = "zero1";
  plan.states = S(0);
  return plan;
}

DimPlan fsdp() {
  DimPlan plan = ddp();
  plan.name = "fsdp";
  plan.fully_shards = true;
  return plan;
}

DimPlan tp() {
  DimPlan plan;
  plan.name = "tp";
  plan.splits_heads = true;
  plan.parameters = {
      {"wte.weight", S(0)},  // vocab-parallel embedding: rows
      {"*.attn.q.*", S(0)},  // column-parallel: output features (and their biases)
      {"*.attn.k.*", S(0)},        {"*.attn.v.*", S(0)},
      {"*.mlp.fc.*", S(0)},        {"*.attn.proj.weight", S(1)},  // row-parallel: input features (biases replicated)
      {"*.mlp.proj.weight", S(1)}, {"lm_head.weight", S(0)},      // column-parallel over the vocabulary
      // MoE experts [E, 4D, D] and [E, D, 4D]: each expert's MLP split as the dense one's (its
      // hidden features), so that a tp rank holds 1/tp of each and the output is a Partial sum.
      {"*.experts.fc.*", S(1)},    {"*.experts.proj.weight", S(2)},
  };
  // The residual stream replicated: the embedding's and the row-parallel
  // projections' Partial sums are all_reduced where they are made.
  plan.activations = every_point(R);
  return plan;
}

DimPlan tp_sp() {
  DimPlan plan = tp();
  plan.name = "tp_sp";
  // The residual stream (and the norms on it) split on the sequence: the
  // Partial sums are reduce_scattered to it, gathered before attention, the
  // MLP and the lm_head.
  set(plan.activations, Point::TokenEmbedding, S(1));
  set(plan.activations, Point::AttentionOutput, S(1));
  set(plan.activations, Point::MlpOutput, S(1));
  return plan;
}

DimPlan ep() {
  DimPlan plan = ddp();
  plan.name = "ep";
  // Each rank holds E / ep whole experts; every other parameter is
  // data-parallel over the dim, whose ranks hold different tokens.
  plan.parameters = {{"*.experts.*", S(0)}};
  plan.splits_experts = true;
  return plan;
}

DimPlan pp() {
  DimPlan out;
  out.name = "pp";
  out.pipelines = true;
  return out;
}

DimPlan plan_named(std::string_view name) {
  if (name == "ddp") return ddp();
  if (name == "zero1") return zero1();
  if (name == "fsdp") return fsdp();
  if (name == "tp") return tp();
  if (name == "tp_sp") return tp_sp();
  if (name == "pp") return pp();
  if (name == "ep") return ep();
  throw ValueError(fmt::format("[plan] unknown plan '{}'; expected one of ddp, zero1, fsdp, tp, tp_sp, pp, ep", name));
}

ParallelPlan::ParallelPlan(const DeviceMesh& mesh, std::vector<DimPlan> per_dim)
    : mesh_(mesh), per_dim_(std::move(per_dim)) {
  if (static_cast<int>(per_dim_.size()) != mesh_.ndim())
    throw ValueError(fmt::format("[plan] {} plans for a mesh of {} dims ({}); expected one per mesh dim",
                                 per_dim_.size(), mesh_.ndim(), fmt::join(mesh_.shape(), "x")));
}

Layout ParallelPlan::gathered_layout(std::string_view name) const {
  std::vector<Placement> out;
  for (const DimPlan& plan : per_dim_) {
    Placement p = R;
    for (const auto& [pattern, placement] : plan.parameters)
      if (matches(pattern, name)) {
        p = placement;
        break;
      }
    out.push_back(p);
  }
  return Layout(std::move(out));
}

bool ParallelPlan::shards_per_parameter() const {
  bool fully = false, shards = false;
  for (const DimPlan& plan : per_dim_) {
    fully = fully || plan.fully_shards;
    shards = shards || !plan.parameters.empty();
  }
  return fully && (shards || each_parameter_);
}

Layout ParallelPlan::parameter_layout(std::string_view name) const {
  Layout layout = gathered_layout(name);
  if (!shards_per_parameter()) return layout;
  // The fsdp split nests inside the tp shards (Layout::with makes it the
  // innermost), so gathering over the fsdp dims gives back the tp layout.
  for (int m = 0; m < mesh_.ndim(); ++m)
    if (per_dim_[static_cast<std::size_t>(m)].fully_shards) layout = layout.with(m, S(0));
  return layout;
}

Layout ParallelPlan::state_layout(std::string_view name) const {
  // ZeRO's split nests inside the parameter's own shards (Layout::with makes
  // it the innermost split), so a rank's state box lies within the
  // parameter shard it holds.
  Layout layout = parameter_layout(name);
  // A dim of one rank has nothing to split: its states stay as they are
  // (else the step would copy each part out and back for nothing).
  for (int m = 0; m < mesh_.ndim(); ++m)
    if (const auto& states = per_dim_[static_cast<std::size_t>(m)].states; states && mesh_.size(m) > 1)
      layout = layout.with(m, *states);
  return layout;
}

Layout ParallelPlan::batch_layout(bool generation) const {
  std::vector<Placement> out;
  for (const DimPlan& plan : per_dim_) out.push_back(generation && plan.splits_batch ? Placement(R) : plan.batch);
  return Layout(std::move(out));
}

ActivationLayouts ParallelPlan::activations(bool generation) const {
  ActivationLayouts out;
  for (std::size_t point = 0; point < kPoints; ++point) {
    std::vector<Placement> placements;
    bool any = false;
    for (const DimPlan& plan : per_dim_) {
      std::optional<Placement> p = plan.activations[point];
      if (generation && plan.splits_batch) p = R;
      any = any || p.has_value();
      placements.push_back(p.value_or(R));
    }
    if (any) out.at[point] = Layout(std::move(placements));
  }
  return out;
}

std::optional<Layout> ParallelPlan::flat_layout() const {
  std::vector<Placement> out;
  bool any = false;
  for (const DimPlan& plan : per_dim_) {
    any = any || plan.fully_shards;
    out.push_back(plan.fully_shards ? Placement(S(0)) : Placement(R));
  }
  if (!any || shards_per_parameter()) return std::nullopt;
  return Layout(std::move(out));
}

ParameterFactory<DTensor> ParallelPlan::parameter_factory(DType dtype) const {
  return [this, dtype](const std::string& name, const Shape& shape, Init init, std::uint64_t seed) {
    const Layout layout = parameter_layout(name);
    switch (init.kind) {
      case Init::Zeros: return zeros(shape, mesh_, layout, dtype);
      case Init::Ones: return ones(shape, mesh_, layout, dtype);
      case Init::Normal: break;
    }
    return mul(randn(shape, seed, mesh_, layout, dtype), init.std);
  };
}

std::vector<Violation> plan_violations(std::span<const DimPlan> per_dim, const Shape& mesh_shape,
                                       const GPTConfig& config, std::int64_t batch) {
  if (per_dim.size() != mesh_shape.size())
    return {{"WORLD", fmt::format("[plan] {} plans for a mesh of {} dims ({}); expected one per mesh dim",
                                  per_dim.size(), mesh_shape.size(), fmt::join(mesh_shape, "x"))}};
  std::vector<Violation> out;
  // ZeRO's states split inside fsdp's shards of another dim: the optimizer
  // cannot nest a state split of one dim inside a parameter split of
  // another (AdamW refuses it at the first step).
  for (std::size_t z = 0; z < per_dim.size(); ++z)
    for (std::size_t f = 0; f < per_dim.size(); ++f)
      if (per_dim[z].states && !per_dim[z].fully_shards && per_dim[f].fully_shards && mesh_shape[z] > 1 &&
          mesh_shape[f] > 1)
        out.push_back({"STATES",
                       fmt::format("[plan] {} on mesh dim {} with fsdp on mesh dim {}: ZeRO's optimizer states cannot "
                                   "split inside fsdp's parameter shards; expected fsdp on both (or ddp,fsdp: HSDP)",
                                   per_dim[z].name, z, f),
                       true});
  std::vector<std::size_t> pipelined;
  for (std::size_t m = 0; m < per_dim.size(); ++m)
    if (per_dim[m].pipelines) pipelined.push_back(m);
  if (pipelined.size() > 1)
    out.push_back({"PP", fmt::format("[plan] mesh dims {} all have plan pp; expected at most one pipeline dim",
                                     fmt::join(pipelined, ", "))});
  for (std::size_t m = 0; m < per_dim.size(); ++m) {
    const DimPlan& plan = per_dim[m];
    const std::int64_t n = mesh_shape[m];
    auto divides = [&](const char* rule, std::int64_t value, const char* what) {
      if (value % n != 0)
        out.push_back({rule, fmt::format("[plan] {} = {} is not divisible by mesh dim {} of size {} (plan {})", what,
                                         value, m, n, plan.name)});
    };
    if (plan.splits_heads) {
      divides("HEADS", config.heads, "heads");
      divides("VOCAB", config.vocab, "vocab");
    }
    if (plan.splits_batch) divides("BATCH", batch, "batch");
    if (plan.splits_experts && config.moe.enabled()) divides("EXPERTS", config.moe.experts, "moe experts");
    if (config.moe.enabled() && (plan.fully_shards || plan.pipelines) && n > 1)
      out.push_back({"MOE",
                     fmt::format("[plan] mixture of experts under plan {} (mesh dim {} of size {}); expected ep, ddp, "
                                 "zero1, tp or tp_sp",
                                 plan.name, m, n),
                     true});
    if (plan.pipelines && config.layers < n)
      out.push_back({"LAYERS", fmt::format("[plan] layers = {} over mesh dim {} of size {} (plan pp): every stage "
                                           "needs at least one block",
                                           config.layers, m, n)});
    if (plan.activations[static_cast<std::size_t>(Point::TokenEmbedding)] == Placement(S(1)))
      divides("SEQ", config.seq, "seq");
  }
  return out;
}

void check_plans_fit(std::span<const DimPlan> per_dim, const Shape& mesh_shape, const GPTConfig& config,
                     std::int64_t batch) {
  const std::vector<Violation> broken = plan_violations(per_dim, mesh_shape, config, batch);
  if (broken.empty()) return;
  if (broken.front().unsupported) throw UnsupportedError(broken.front().message);
  throw ValueError(broken.front().message);
}

void ParallelPlan::check_fits(const GPTConfig& config, std::int64_t batch) const {
  check_plans_fit(per_dim_, mesh_.shape(), config, batch);
}

}  // namespace dtensor::nn
