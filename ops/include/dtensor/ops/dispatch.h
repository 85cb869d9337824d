#pragma once
// Sharding propagation: for an op and its inputs' layouts, price every
// candidate strategy by the planner's cost of redistributing each input to
// what the candidate needs, take the cheapest (ties go to the earliest
// candidate, the same on every rank), redistribute and run the local kernel.
// Decisions are cached per thread per (op, input metas and layouts, attrs,
// mesh, cost model).
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dtensor/core/cache_stats.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/ops/op.h"
#include "dtensor/redistribute/cost_model.h"
#include "dtensor/redistribute/plan.h"

namespace dtensor {

/// A sharded tensor's layout and global shape. Immutable, hence shared by
/// every tensor that has them: a DTensor's copies, and all the outputs one
/// propagation-cache entry makes (so that a cache hit builds its output
/// without copying either).
struct ShardedMeta {
  Layout layout;
  Shape global_shape;
};

/// An input of dispatch: a DTensor's parts by address (not copied on a hit).
struct ShardedInput {
  const Tensor* local = nullptr;
  const Layout* layout = nullptr;
  const Shape* global_shape = nullptr;
};

/// A sharded tensor without its mesh: what dispatch returns.
struct ShardedTensor {
  Tensor local;
  std::shared_ptr<const ShardedMeta> meta;
};

/// The outcome of propagation for one call signature.
struct OpDecision {
  const OpDef* op = nullptr;
  TensorMeta output;
  Strategy chosen;
  /// Plans that bring each input to chosen.inputs[i] (null: no move).
  std::vector<const Plan*> input_plans;
  double cost_seconds = 0;
  /// The part of cost_seconds owed for reducing a Partial output that the
  /// chosen strategy creates (half an all_reduce of it; see dispatch.cpp).
  double owed_seconds = 0;
  /// The next cheapest candidate, for explain mode (runner_up_cost < 0: none).
  Strategy runner_up;
  double runner_up_cost = -1;
  int candidates = 0;
};

/// Propagation only (cached). LayoutError naming the op and the layouts if
/// no candidate is valid. The reference stays valid until this thread's
/// propagation cache evicts the decision (after propagation_cache_capacity
/// other distinct calls) or is cleared.
const OpDecision& decide(const OpDef& op, const Shape& mesh_shape, std::span<const TensorMeta> inputs,
                         std::span<const Layout> layouts, const OpAttrs& attrs, const CostModel& cost);

/// Propagates, redistributes the inputs and runs the local kernel on this
/// rank. Every rank of the mesh calls it with the same metadata. With
/// `moved`, it also hands back the inputs as the kernel received them:
/// (*moved)[i] is input i after its plan ran, with local undefined where
/// the input stayed put, and *moved empty when no input moved (autograd
/// saves these, so that a backward does not move the same input again).
ShardedTensor dispatch(const OpDef& op, const DeviceMesh& mesh, std::span<const ShardedInput> inputs,
                       const OpAttrs& attrs, const CostModel& cost = {}, std::vector<ShardedTensor>* moved = nullptr);

/// Runs an op on plain (unsharded) tensors: meta, then the kernel.
Tensor run_unsharded(const OpDef& op, std::span<const Tensor> inputs, const OpAttrs& attrs);

/// The propagation cache's bound per thread unless
/// DTENSOR_PROPAGATION_CACHE_ENTRIES or set_propagation_cache_capacity()
/// says otherwise. An entry (the decision, copies of its plans, this rank's
/// boxes) takes about 1-8 KiB, so a full cache holds a few MiB per rank.
inline constexpr std::size_t kDefaultPropagationCacheEntries = 1024;
/// And whatever the entry bound, one thread's entries take at most this
/// many approximate bytes (entries holding big exchange plans go sooner).
inline constexpr std::size_t kPropagationCacheBytes = std::size_t{64} << 20;

/// This thread's propagation cache: a hit runs no meta or strategy function
/// and prices nothing; only a miss does (and counts in `misses`).
CacheStats propagation_cache_stats();
void clear_propagation_cache();
/// The bound on every thread's propagation cache, from 1 to 2^20 entries
/// (else ValueError naming the value); a cache above it shrinks at its next
/// miss.
void set_propagation_cache_capacity(std::size_t entries);

/// One dispatched op as explain mode saw it, for callers that show
/// decisions in their own form (pictures::decision_svg draws one). Valid
/// only during the callback.
struct ExplainedOp {
  const OpDef& op;
  const Shape& mesh_shape;
  std::span<const TensorMeta> inputs;
  std::span<const Layout> layouts;  // the inputs' layouts as called
  const OpDecision& decision;
  CommStats moved;       // what this rank's collectives did for the op
  std::string_view tag;  // ExplainTag's, e.g. "backward of linear"
};

/// While alive on this thread, every dispatched op prints what it did: the
/// layouts in, the strategy chosen, its cost against the runner-up and the
/// collectives it issued. Lines go to `sink` (stdout by default); with
/// `on_op`, each op's decision is also handed over whole.
class ExplainScope {
 public:
  explicit ExplainScope(std::function<void(const std::string&)> sink = {});
  ExplainScope(std::function<void(const std::string&)> sink, std::function<void(const ExplainedOp&)> on_op);
  ~ExplainScope();
  ExplainScope(const ExplainScope&) = delete;
  ExplainScope& operator=(const ExplainScope&) = delete;

 private:
  std::function<void(const std::string&)> previous_;
  std::function<void(const ExplainedOp&)> previous_on_op_;
};

/// While alive on this thread, explain lines start with `tag` (autograd
/// marks the ops of a backward pass "backward of <forward op>"). Tags nest;
/// the innermost is shown.
class ExplainTag {
 public:
  explicit ExplainTag(std::string tag);
  ~ExplainTag();
  ExplainTag(const ExplainTag&) = delete;
  ExplainTag& operator=(const ExplainTag&) = delete;

 private:
  std::string previous_;
};

}  // namespace dtensor
