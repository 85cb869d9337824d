#include <algorithm>
#include <mutex>

#include "dtensor/core/error.h"
#include "dtensor/ops/op.h"
#include "families.h"

namespace dtensor {

namespace {

// The registry's expansion of an op's per-mesh-dim options.
StrategyFn expanded(DimStrategyFn per_dim, bool prefer_kept) {
  return [per_dim = std::move(per_dim), prefer_kept](const StrategyQuery& q) {
    const std::vector<DimStrategy> options = per_dim(q);
    std::vector<Strategy> cands = expand_to_mesh(options, q);
    if (!prefer_kept) return cands;
    auto kept = [&](const Strategy& s) {
      int n = 0;
      for (std::size_t i = 0; i < q.layouts.size() && i < s.inputs.size(); ++i) n += s.inputs[i] == q.layouts[i];
      return n;
    };
    std::stable_sort(cands.begin(), cands.end(),
                     [&](const Strategy& a, const Strategy& b) { return kept(a) > kept(b); });
    return cands;
  };
}

}  // namespace

OpRegistry& OpRegistry::global() {
  static OpRegistry registry;
  static std::once_flag builtins;
  std::call_once(builtins, [] { register_builtin_ops(registry); });
  return registry;
}

const OpDef& OpRegistry::add(OpDef def) {
  if (def.name.empty()) throw ValueError("[ops] an op needs a name");
  if (contains(def.name)) throw ValueError(fmt::format("[ops] op '{}' is already registered", def.name));
  if (!def.meta || (!def.strategy && !def.dim_strategy))
    throw ValueError(
        fmt::format("[ops] op '{}' needs a meta function and a strategy function (strategy or dim_strategy)",
                    def.name));
  if (def.strategy && def.dim_strategy)
    throw ValueError(fmt::format("[ops] op '{}' gives both strategy and dim_strategy; expected one", def.name));
  if (def.dim_strategy) def.strategy = expanded(std::move(def.dim_strategy), def.prefer_kept_layouts);
  def.dim_strategy = nullptr;
  std::string name = def.name;
  auto [it, inserted] = defs_.emplace(std::move(name), std::make_unique<OpDef>(std::move(def)));
  return *it->second;
}

OpDef dim_strategy_op(std::string name, int num_inputs, std::string doc, MetaFn meta, DimStrategyFn dim_strategy) {
  OpDef def;
  def.name = std::move(name);
  def.num_inputs = num_inputs;
  def.doc = std::move(doc);
  def.meta = std::move(meta);
  def.dim_strategy = std::move(dim_strategy);
  return def;
}

bool OpRegistry::contains(std::string_view name) const { return defs_.find(name) != defs_.end(); }

const OpDef& OpRegistry::get(std::string_view name) const {
  if (auto it = defs_.find(name); it != defs_.end()) return *it->second;
  std::vector<std::string> close;
  for (const auto& [n, d] : defs_)
    if (n.find(name.substr(0, 3)) != std::string::npos) close.push_back(n);
  std::sort(close.begin(), close.end());
  throw ValueError(fmt::format("[ops] unknown op '{}'{}", name,
                               close.empty() ? "" : fmt::format(": did you mean {}?", fmt::join(close, ", "))));
}

std::vector<std::string> OpRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, d] : defs_) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

Op Op::find(std::string_view name) { return Op(OpRegistry::global().get(name)); }

void register_builtin_ops(OpRegistry& registry) {
  register_pointwise_ops(registry);
  register_einsum_ops(registry);
  register_reduction_ops(registry);
  register_shape_ops(registry);
  register_embedding_ops(registry);
  register_backward_ops(registry);
}

}  // namespace dtensor
