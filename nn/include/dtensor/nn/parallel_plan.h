#pragma once
// Parallel plans as data: for each mesh dim, the placement of every
// parameter (by name pattern), of the token batch, of the activations at the
// model's named points, and of the optimizer states. A plan never issues a
// collective: the layouts go to propagation and the planner, which find
// Megatron's all_reduces, sequence parallelism's all_gathers and
// reduce_scatters and DDP's gradient all_reduce on their own.
//
//   DeviceMesh mesh(world, {2, 4}, {"dp", "tp"});
//   nn::ParallelPlan plan(mesh, {nn::ddp(), nn::tp()});   // one plan per mesh dim
//   auto model = nn::GPT<DTensor>::init(config, seed, plan.parameter_factory(config.dtype), plan.activations());
//
// Plans for one mesh dim, and what they put on it:
// - ddp: parameters replicated; the batch and every activation S(0).
// - zero1: as ddp, with optimizer states (and the gradients they take) S(0)
//   on dim 0 of each parameter (ZeRO-1/2).
// - fsdp (ZeRO-3): as ddp, with the parameters in flat units S(0), one per
//   block and one root (embeddings, final norm, lm_head), each gathered for
//   use and its gradient reduce_scattered (fully_shard). With ddp on
//   another dim: HSDP.
// - tp (Megatron): token embedding and lm_head split over the vocabulary
//   (rows, S(0)); q, k, v and fc column-parallel (S(0) of [out, in], their
//   biases S(0)); attention and MLP output projections row-parallel (S(1));
//   position embedding, norms and row-parallel biases replicated; the
//   residual stream replicated (the row-parallel outputs' Partial sums are
//   all_reduced where they leave the projection).
// - tp_sp: tp with sequence parallelism: the residual stream, norms and
//   embedding output S(1) (the sequence), gathered at attention, MLP and
//   lm_head inputs and reduce_scattered at the projections' outputs.
// - ep: expert parallelism, as ddp with each MoE layer's experts S(0) (a
//   rank holds E / ep of them; the routed rows travel by all_to_allv).
//   Under tp the experts' hidden features are split as the dense MLP's.
#include <array>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtensor/api/dtensor_tensor.h"
#include "dtensor/nn/modules.h"

namespace dtensor::nn {

/// What one plan puts on the mesh dim it is given.
struct DimPlan {
  std::string name;
  /// Name patterns ('*' matches any run of characters) and the placement of
  /// matching parameters; the first match wins, Replicate where none does.
  std::vector<std::pair<std::string, Placement>> parameters;
  /// The token batch [B, T] (and its targets).
  Placement batch = Replicate{};
  /// The activations [B, T, D] at each point (none: propagation's choice).
  std::array<std::optional<Placement>, kPoints> activations{};
  /// Where optimizer states live when not in the parameter's layout: ZeRO's
  /// S(0) over dp.
  std::optional<Placement> states;
  /// FSDP: the parameters in flat units S(0) over this dim (fully_shard).
  bool fully_shards = false;
  /// Whether the dim splits the batch (so generation, which runs one
  /// sequence, replicates it instead).
  bool splits_batch = false;
  /// Whether the dim splits attention heads and the vocabulary: the model
  /// must divide them by its size.
  bool splits_heads = false;
  /// Expert parallelism: the dim splits each MoE layer's experts (and, as
  /// under ddp, the batch); the model's experts must divide by its size.
  bool splits_experts = false;
  /// Pipeline parallelism: the dim splits the model's blocks into stages
  /// (pipeline_stage.h), one rank per stage, instead of laying out tensors.
  bool pipelines = false;
};

DimPlan ddp();
DimPlan zero1();
DimPlan tp();
DimPlan tp_sp();
DimPlan fsdp();
/// Pipeline stages over the dim (pipelines = true; everything else
/// replicated). The trainer runs it with nn::pipeline's runtime.
DimPlan pp();
/// Expert parallelism (as ddp for everything but the MoE experts, which are
/// S(0) over the dim: each rank holds E / size of them, and the tokens
/// travel to them by all_to_allv; moe.h).
DimPlan ep();
/// The plan of that name ("ddp", "zero1", "fsdp", "tp", "tp_sp", "pp", "ep"); ValueError naming
/// the text and the known names otherwise.
DimPlan plan_named(std::string_view name);

/// A broken rule: its name (WORLD, NAMES, STATES, PP, HEADS, VOCAB, BATCH,
/// EXPERTS, MOE, LAYERS, SEQ) and the message a run stops with.
struct Violation {
  std::string rule;
  std::string message;
  bool unsupported = false;  // a combination this build cannot run (UnsupportedError), not a bad value
};

/// The plan rules, every one broken, for one plan per dim of a mesh of
/// `mesh_shape`: STATES (zero1 inside another dim's fsdp), PP (one pipeline
/// dim at most), then per dim HEADS, VOCAB, BATCH, EXPERTS, MOE, LAYERS
/// and SEQ.
std::vector<Violation> plan_violations(std::span<const DimPlan> per_dim, const Shape& mesh_shape,
                                       const GPTConfig& config, std::int64_t batch);

/// The first of plan_violations() as its error (UnsupportedError or
/// ValueError); the message names the value and the mesh dim unless the model and batch
/// divide as the plans need on a mesh of `mesh_shape` (heads and vocab by
/// tp, batch by dp, the sequence by tp_sp, at least one block per pp rank). For callers that check before they have
/// a mesh (a command line); ParallelPlan::check_fits calls it.
void check_plans_fit(std::span<const DimPlan> per_dim, const Shape& mesh_shape, const GPTConfig& config,
                     std::int64_t batch);

/// One DimPlan per mesh dim, read together as layouts.
class ParallelPlan {
 public:
  /// ValueError unless there is one plan per mesh dim.
  ParallelPlan(const DeviceMesh& mesh, std::vector<DimPlan> per_dim);

  const DeviceMesh& mesh() const { return mesh_; }
  const std::vector<DimPlan>& per_dim() const { return per_dim_; }

  Layout parameter_layout(std::string_view name) const;
  /// Where the optimizer keeps `name`'s states (its layout unless a plan
  /// moves them).
  Layout state_layout(std::string_view name) const;
  /// The layout of the tokens and targets [B, T]; for generation, the batch
  /// is replicated where training splits it.
  Layout batch_layout(bool generation = false) const;
  ActivationLayouts activations(bool generation = false) const;
  /// The flat units' layout where a dim's plan fully shards and no other
  /// shards parameters (S(0) on those dims, Replicate elsewhere); none
  /// otherwise.
  std::optional<Layout> flat_layout() const;
  /// Whether a fully sharding dim meets one that shards parameters (fsdp
  /// over tp), or shard_each_parameter() was called: then each block parameter is its tp layout with S(0) over
  /// the fsdp dims nested inside (`S(0)[1],S(0)[0]` where both split dim
  /// 0), gathered per block to gathered_layout(), and the root's
  /// (embeddings, final norm, lm_head) likewise, gathered once per forward.
  bool shards_per_parameter() const;
  /// Makes a fully sharding dim shard each parameter (as over tp) even
  /// where no dim shards parameters: a pipeline stage holds only some of
  /// the model, so it cannot hold the whole model's flat units.
  void shard_each_parameter() { each_parameter_ = true; }
  /// A parameter's layout without the fsdp dims' split.
  Layout gathered_layout(std::string_view name) const;
  /// Makes each parameter in its layout, with the values the plain model's
  /// factory gives (no communication).
  ParameterFactory<DTensor> parameter_factory(DType dtype) const;

  /// ValueError naming the value and the mesh dim unless the model and
  /// batch divide as the plans need (heads and vocab by tp, batch by dp).
  void check_fits(const GPTConfig& config, std::int64_t batch) const;

 private:
  DeviceMesh mesh_;
  std::vector<DimPlan> per_dim_;
  bool each_parameter_ = false;
};

/// Whether `name` matches `pattern`, where '*' matches any run of characters.
bool matches(std::string_view pattern, std::string_view name);

}  // namespace dtensor::nn
