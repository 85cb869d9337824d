#pragma once
// Internal to the shape ops: the view algebra (PyTorch's InputDim/Flatten/
// Split/Singleton/Broadcast). An op describes how its output dims arise from
// its input dims as groups; a shard may ride on the leading dim of a group,
// and every candidate is checked against the exact local boxes on the mesh
// before it is offered, so uneven shapes never give a shard whose data do
// not line up (PyTorch #179502).
#include <functional>
#include <span>
#include <vector>

#include "dtensor/ops/op.h"

namespace dtensor::view {

/// Input dims `in` become output dims `out`. A flat group keeps the row-major
/// order of its elements (a reshape of those dims: 1:1, flatten, split,
/// singletons); a non-flat group (broadcast, narrowed or concatenated dim,
/// new stacked dim) must stay whole on both sides.
struct Group {
  std::vector<int> in;
  std::vector<int> out;
  bool flat = true;
};

/// How an op's output dims arise from its inputs' dims (the same for every
/// input), and whether the op is linear (Partial passes through).
struct ViewRule {
  std::vector<Group> groups;
  bool linear = true;
};

using RuleFn = std::function<ViewRule(std::span<const TensorMeta> in, const OpAttrs& attrs, const TensorMeta& out)>;

/// Groups of a reshape from `a` to `b` (same numel): the shortest runs of
/// dims whose sizes multiply to the same number.
ViewRule reshape_rule(const Shape& a, const Shape& b);

/// Every dim maps to itself, except `skip` (if >= 0) which must stay whole.
ViewRule identity_rule(int ndim, int skip = -1);

/// Output dim o is input dim perm[o].
ViewRule permute_rule(const std::vector<int>& perm);

/// Candidates from a rule: all-Replicate; a shard on the leading
/// (outermost non-singleton) dim of each flat group, following it to the
/// group's leading output dim; Partial passing through a linear op; the
/// inputs' own nesting order. Each is kept only if the boxes line up on this
/// mesh. A single input's candidates that drop one of its shards say so in
/// their note (explain mode).
std::vector<Strategy> view_strategies(const ViewRule& rule, const StrategyQuery& q);

}  // namespace dtensor::view
