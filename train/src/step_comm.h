#pragma once
// What the trainer's two loops (trainer.cpp, pipeline_trainer.cpp) share, not
// installed: a rank's memory account, a step's collectives by phase as TrainResult::comm lists them,
// a scalar's value, the plan's optimizer-state layouts, a checkpoint's
// names, targets and loads, the throughput.
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <dtensor/checkpoint/checkpoint.h>
#include <dtensor/core/memory_account.h>
#include <fmt/format.h>
#include <dtensor/dtensor.h>
#include <dtensor/nn/parallel_plan.h>

#include "dtensor/train/trainer.h"

namespace dtensor::train::detail {

// This rank's memory account, its budget the options' (else
// DTENSOR_MEMORY_BUDGET's, else none): an allocation past it is an
// OutOfBudget naming the rank.
inline std::shared_ptr<MemoryAccount> rank_account(const TrainOptions& o, int rank) {
  auto account = std::make_shared<MemoryAccount>();
  const std::optional<std::size_t> budget =
      o.memory_budget > 0 ? std::optional<std::size_t>(o.memory_budget) : memory_budget_from_environment();
  if (budget) account->set_budget(*budget, fmt::format("rank {}", rank));
  return account;
}

// The optimizer states where `plan` keeps them (zero1: S(0) over dp); none
// where every state is in its parameter's layout.
inline std::vector<Layout> plan_state_layouts(const nn::ParallelPlan& plan, const nn::NamedParameters<DTensor>& named) {
  std::vector<Layout> out;
  bool moved = false;
  for (const auto& [name, p] : named) {
    out.push_back(plan.state_layout(name));
    moved = moved || out.back() != plan.parameter_layout(name);
  }
  return moved ? out : std::vector<Layout>{};
}

// Per-parameter FSDP (plan.shards_per_parameter()): the layouts `named`'s
// parameters are gathered to, the blocks' by block ("blocks.<i>." prefixes,
// in order) and the others' (embeddings, final norm, lm_head) apart; both
// empty otherwise. A whole GPT and a pipeline stage are prepared alike.
struct GatheredLayouts {
  std::vector<Layout> root;
  std::vector<std::vector<Layout>> blocks;
};
inline GatheredLayouts plan_gathered_layouts(const nn::ParallelPlan& plan, const nn::NamedParameters<DTensor>& named) {
  GatheredLayouts out;
  if (!plan.shards_per_parameter()) return out;
  std::string block;  // the current block's prefix
  for (const auto& [name, p] : named) {
    if (!name.starts_with("blocks.")) {
      out.root.push_back(plan.gathered_layout(name));
      continue;
    }
    const std::string prefix = name.substr(0, name.find('.', 7) + 1);  // "blocks.<i>."
    if (prefix != block) {
      out.blocks.emplace_back();
      block = prefix;
    }
    out.blocks.back().push_back(plan.gathered_layout(name));
  }
  return out;
}

// Where a resumed tensor goes: its layout (none: replicated, or a plain
// tensor) and the shape and dtype it must have.
struct StateTarget {
  std::optional<Layout> layout;
  Shape shape;
  DType dtype;
};

// The named tensors whole, checked as dcp::load checks DTensor targets.
inline std::map<std::string, Tensor> load_plain(const std::string& dir,
                                                const std::map<std::string, StateTarget>& want) {
  std::vector<std::string> names;
  for (const auto& [name, target] : want) names.push_back(name);
  auto got = dcp::load_full(dir, names);
  for (const auto& [name, target] : want)
    if (got.at(name).shape() != target.shape || got.at(name).dtype() != target.dtype)
      throw ShapeError(fmt::format("[train] {} in {} is {} [{}]; the model expects {} [{}]", name, dir,
                                   got.at(name).dtype(), fmt::join(got.at(name).shape(), ","), target.dtype,
                                   fmt::join(target.shape, ",")));
  return got;
}

// The named tensors on `mesh` in their layouts (none: replicated).
inline std::map<std::string, DTensor> load_on(const DeviceMesh& mesh, const std::string& dir,
                                              const std::map<std::string, StateTarget>& want) {
  std::map<std::string, dcp::Target> targets;
  for (const auto& [name, t] : want)
    targets.emplace(name, dcp::Target{mesh, t.layout.value_or(Layout::replicated(mesh.ndim())), t.shape, t.dtype});
  return dcp::load(dir, targets);
}

// A checkpoint's step count as a tensor: plain, or replicated on `mesh`.
inline Tensor steps_tensor(std::int64_t v) { return Tensor::full({}, static_cast<double>(v), DType::Int64); }
inline DTensor steps_tensor(std::int64_t v, const DeviceMesh& mesh) {
  return from_full(steps_tensor(v), mesh, Layout::replicated(mesh.ndim()));
}

// Tokens a second over the `ran` steps less the first (which fills the
// caches), or over the one step when only one ran.
inline double tokens_per_second(const TrainOptions& o, std::int64_t ran, double seconds) {
  const std::int64_t timed_steps = ran > 1 ? ran - 1 : ran;
  return seconds > 0 ? static_cast<double>(timed_steps * o.micro_batches * o.batch * o.model.seq) / seconds : 0;
}

// Greedy sampling's loop: `count` bytes after `context`, one position at a
// time through KV caches. `next(pending, fresh)` runs the model on the
// positions after the cached ones and returns the chosen byte; `fresh`
// says to start the caches anew, as at the start and whenever `pending`
// would not fit in `seq` positions, from the last seq/2 bytes of the context.
template <class Next>
std::string greedy_bytes(std::vector<std::int64_t> context, std::int64_t count, std::int64_t seq, Next&& next) {
  std::string out;
  std::vector<std::int64_t> pending = context;
  std::int64_t cached = -1;  // positions the caches hold; -1: no caches yet
  for (std::int64_t i = 0; i < count; ++i) {
    const bool fresh = cached < 0 || cached + static_cast<std::int64_t>(pending.size()) > seq;
    if (fresh) {
      const auto keep = static_cast<std::size_t>(seq / 2);
      if (context.size() > keep) context.erase(context.begin(), context.end() - static_cast<std::ptrdiff_t>(keep));
      pending = context;
      cached = 0;
    }
    const std::int64_t token = next(std::as_const(pending), fresh);
    cached += static_cast<std::int64_t>(pending.size());
    out.push_back(static_cast<char>(token));
    context.push_back(token);
    pending = {token};
  }
  return out;
}

// A checkpoint's count of the steps it was saved after.
inline constexpr const char* kStepsDone = "train.steps_done";

// A scalar's value (a loss, a sampled token), whole.
inline double first_value(const Tensor& t) { return t.to(DType::Float64).data_as<double>()[0]; }
inline double first_value(const DTensor& t) { return first_value(t.full_tensor()); }

// A rank's collective counters by the mesh dims they ran over.
using DimsStats = std::map<std::vector<int>, CommStats>;

inline DimsStats operator-(const DimsStats& after, const DimsStats& before) {
  DimsStats out;
  for (const auto& [dims, stats] : after) {
    const auto it = before.find(dims);
    out[dims] = it == before.end() ? stats : stats - it->second;
  }
  return out;
}
inline DimsStats operator+(const DimsStats& a, const DimsStats& b) {
  DimsStats out = a;
  for (const auto& [dims, stats] : b) out[dims] = out.count(dims) ? out[dims] + stats : stats;
  return out;
}

inline DimsStats mesh_stats(const DeviceMesh& mesh) {
  DimsStats out;
  for (auto& group : mesh.group_stats()) out[group.mesh_dims] = group.stats;
  return out;
}

// Appends `used`'s data-moving collectives to `out` under `phase`, each
// with the names of the mesh dims it ran over.
inline void add_phase(std::vector<PhaseComm>& out, const char* phase, const DimsStats& used,
                      const std::vector<std::string>& names) {
  for (const auto& [dims, stats] : used) {
    std::vector<std::string> dim_names;
    for (int d : dims) dim_names.push_back(names.at(static_cast<std::size_t>(d)));
    for (int k = 0; k < kNumCollectiveKinds; ++k) {
      const auto kind = static_cast<CollectiveKind>(k);
      if (kind == CollectiveKind::Barrier || kind == CollectiveKind::Split || stats.count(kind) == 0) continue;
      out.push_back({phase, std::string(collective_name(kind)), dim_names, stats.count(kind),
                     stats.bytes_by_kind[static_cast<std::size_t>(k)]});
    }
  }
}

}  // namespace dtensor::train::detail
