#include "dtensor/ops/dispatch.h"

#include <memory>
#include <unordered_map>

#include "dtensor/core/error.h"
#include "dtensor/redistribute/executor.h"
#include "dtensor/redistribute/planner.h"

namespace dtensor {
namespace {

// One cached decision with the key it was made for. A hit compares the key
// field by field against the call's own spans, so a hit allocates nothing.
struct Entry {
  const OpDef* op;
  Shape mesh_shape;
  std::vector<TensorMeta> inputs;
  std::vector<Layout> layouts;
  OpAttrs attrs;
  CostModel cost;
  OpDecision decision;
  std::vector<std::unique_ptr<Plan>> plans;  // owned: the plan cache may be cleared
};

struct Cache {
  std::unordered_map<std::size_t, std::vector<std::unique_ptr<Entry>>> entries;
  PropagationCacheStats stats;
};
thread_local Cache cache;
thread_local std::function<void(const std::string&)> explain_sink;

std::size_t key_hash(const OpDef& op, const Shape& mesh, std::span<const TensorMeta> inputs,
                     std::span<const Layout> layouts, const OpAttrs& attrs, const CostModel& cost) {
  std::size_t h = std::hash<const void*>{}(&op);
  auto mix = [&](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
  for (auto s : mesh) mix(static_cast<std::size_t>(s));
  for (const auto& m : inputs) {
    mix(static_cast<std::size_t>(m.dtype) + 0x100);
    for (auto s : m.shape) mix(static_cast<std::size_t>(s));
  }
  for (const auto& l : layouts) mix(l.hash());
  mix(attrs.hash());
  mix(cost.hash());
  return h;
}

bool same_key(const Entry& e, const OpDef& op, const Shape& mesh, std::span<const TensorMeta> inputs,
              std::span<const Layout> layouts, const OpAttrs& attrs, const CostModel& cost) {
  return e.op == &op && e.mesh_shape == mesh && std::equal(e.inputs.begin(), e.inputs.end(), inputs.begin(), inputs.end()) &&
         std::equal(e.layouts.begin(), e.layouts.end(), layouts.begin(), layouts.end()) && e.attrs == attrs &&
         e.cost == cost;
}

std::string layouts_text(std::span<const Layout> layouts) {
  std::string out;
  for (std::size_t i = 0; i < layouts.size(); ++i) out += fmt::format("{}[{}]", i ? " " : "", layouts[i]);
  return out;
}

}  // namespace

const OpDecision& decide(const OpDef& op, const Shape& mesh_shape, std::span<const TensorMeta> inputs,
                         std::span<const Layout> layouts, const OpAttrs& attrs, const CostModel& cost) {
  const std::size_t h = key_hash(op, mesh_shape, inputs, layouts, attrs, cost);
  auto& bucket = cache.entries[h];
  for (const auto& e : bucket)
    if (same_key(*e, op, mesh_shape, inputs, layouts, attrs, cost)) {
      ++cache.stats.hits;
      return e->decision;
    }
  ++cache.stats.misses;
  if (op.num_inputs >= 0 && static_cast<int>(inputs.size()) != op.num_inputs)
    throw ValueError(fmt::format("[{}] takes {} tensor inputs, got {}", op.name, op.num_inputs, inputs.size()));

  auto entry = std::make_unique<Entry>();
  entry->op = &op;
  entry->mesh_shape = mesh_shape;
  entry->inputs.assign(inputs.begin(), inputs.end());
  entry->layouts.assign(layouts.begin(), layouts.end());
  entry->attrs = attrs;
  entry->cost = cost;
  OpDecision& d = entry->decision;
  d.op = &op;
  d.output = op.meta(inputs, attrs);
  StrategyQuery query{mesh_shape, entry->inputs, entry->layouts, entry->attrs, d.output};
  std::vector<Strategy> candidates = op.strategy(query);
  d.candidates = static_cast<int>(candidates.size());

  double best = -1;
  std::size_t best_index = 0;
  std::vector<double> costs(candidates.size(), 0);
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    double total = 0;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (candidates[c].inputs[i] == layouts[i]) continue;
      PlanRequest request{mesh_shape, inputs[i].shape, inputs[i].dtype, layouts[i], candidates[c].inputs[i], cost};
      total += cached_plan(request).est_seconds;
    }
    costs[c] = total;
    if (best < 0 || total < best) {
      best = total;
      best_index = c;
    }
  }
  if (best < 0)
    throw LayoutError(fmt::format("[{}] no sharding strategy for inputs {} of shapes {} on mesh {}", op.name,
                                  layouts_text(layouts),
                                  fmt::join([&] {
                                    std::vector<std::string> s;
                                    for (auto& m : inputs) s.push_back(fmt::format("{}", fmt::join(m.shape, "x")));
                                    return s;
                                  }(), " "),
                                  fmt::join(mesh_shape, "x")));
  d.chosen = candidates[best_index];
  d.cost_seconds = best;
  for (std::size_t c = 0; c < candidates.size(); ++c)
    if (c != best_index && (d.runner_up_cost < 0 || costs[c] < d.runner_up_cost)) {
      d.runner_up_cost = costs[c];
      d.runner_up = candidates[c];
    }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (d.chosen.inputs[i] == layouts[i]) {
      d.input_plans.push_back(nullptr);
      continue;
    }
    PlanRequest request{mesh_shape, inputs[i].shape, inputs[i].dtype, layouts[i], d.chosen.inputs[i], cost};
    entry->plans.push_back(std::make_unique<Plan>(cached_plan(request)));
    d.input_plans.push_back(entry->plans.back().get());
  }
  bucket.push_back(std::move(entry));
  return bucket.back()->decision;
}

ShardedTensor dispatch(const OpDef& op, const DeviceMesh& mesh, std::span<const ShardedTensor* const> inputs,
                       const OpAttrs& attrs, const CostModel& cost) {
  // Small calls keep their metadata on the stack.
  constexpr std::size_t kInline = 4;
  const std::size_t n = inputs.size();
  std::array<TensorMeta, kInline> meta_inline;
  std::array<Layout, kInline> layout_inline;
  std::vector<TensorMeta> meta_heap;
  std::vector<Layout> layout_heap;
  std::span<TensorMeta> metas;
  std::span<Layout> layouts;
  if (n <= kInline) {
    metas = std::span<TensorMeta>(meta_inline.data(), n);
    layouts = std::span<Layout>(layout_inline.data(), n);
  } else {
    meta_heap.resize(n);
    layout_heap.resize(n);
    metas = meta_heap;
    layouts = layout_heap;
  }
  for (std::size_t i = 0; i < n; ++i) {
    metas[i].shape = inputs[i]->global_shape;
    metas[i].dtype = inputs[i]->local.dtype();
    layouts[i] = inputs[i]->layout;
  }
  const OpDecision& d = decide(op, mesh.shape(), metas, layouts, attrs, cost);

  const bool explaining = static_cast<bool>(explain_sink);
  CommStats before;
  if (explaining) before = mesh.comm().stats();
  if (d.boxes_coordinate != mesh.coordinate()) {
    d.input_boxes.resize(n);
    for (std::size_t i = 0; i < n; ++i)
      d.input_boxes[i] = local_box(mesh.shape(), metas[i].shape, d.chosen.inputs[i], mesh.coordinate());
    d.output_box = local_box(mesh.shape(), d.output.shape, d.chosen.output, mesh.coordinate());
    d.boxes_coordinate = mesh.coordinate();
  }
  std::vector<Tensor> locals(n);
  for (std::size_t i = 0; i < n; ++i)
    locals[i] = d.input_plans[i] ? execute_plan(*d.input_plans[i], mesh, inputs[i]->local) : inputs[i]->local;
  const Box& out_box = d.output_box;
  const Device device = n ? inputs[0]->local.device() : Device::CPU;
  const Kernel& kernel = op.kernels[static_cast<int>(device)];
  if (!kernel) throw UnsupportedError(fmt::format("[{}] has no {} kernel in this build", op.name, device));
  KernelArgs args{locals, metas, d.input_boxes, d.chosen.inputs, attrs, d.output, out_box, d.chosen.output};
  Tensor out = kernel(args);
  if (out.shape() != out_box.size)
    throw Error(fmt::format("[{}] internal: the kernel returned a {} shard where {} gives {}", op.name,
                            fmt::join(out.shape(), "x"), d.chosen.output, fmt::join(out_box.size, "x")));
  if (explaining) {
    CommStats moved = mesh.comm().stats() - before;
    std::string line = fmt::format("{}: inputs {}; chose {} -> {} at {}", op.name, layouts_text(layouts),
                                   layouts_text(d.chosen.inputs), d.chosen.output, human_seconds(d.cost_seconds));
    if (d.runner_up_cost >= 0)
      line += fmt::format(" (runner-up {} -> {} at {}; {} candidates)", layouts_text(d.runner_up.inputs),
                          d.runner_up.output, human_seconds(d.runner_up_cost), d.candidates);
    line += fmt::format("; issued {}", moved);
    explain_sink(line);
  }
  return ShardedTensor{std::move(out), d.chosen.output, d.output.shape};
}

Tensor run_unsharded(const OpDef& op, std::span<const Tensor> inputs, const OpAttrs& attrs) {
  const std::size_t n = inputs.size();
  if (op.num_inputs >= 0 && static_cast<int>(n) != op.num_inputs)
    throw ValueError(fmt::format("[{}] takes {} tensor inputs, got {}", op.name, op.num_inputs, n));
  std::vector<TensorMeta> metas(n);
  std::vector<Box> boxes(n);
  std::vector<Layout> layouts(n);
  for (std::size_t i = 0; i < n; ++i) {
    metas[i] = TensorMeta{inputs[i].shape(), inputs[i].dtype()};
    boxes[i] = full_box(inputs[i].shape());
  }
  TensorMeta out = op.meta(metas, attrs);
  const Device device = n ? inputs[0].device() : Device::CPU;
  const Kernel& kernel = op.kernels[static_cast<int>(device)];
  if (!kernel) throw UnsupportedError(fmt::format("[{}] has no {} kernel in this build", op.name, device));
  KernelArgs args{inputs, metas, boxes, layouts, attrs, out, full_box(out.shape), Layout()};
  return kernel(args);
}

PropagationCacheStats propagation_cache_stats() { return cache.stats; }
void clear_propagation_cache() { cache = Cache{}; }

ExplainScope::ExplainScope(std::function<void(const std::string&)> sink) : previous_(explain_sink) {
  explain_sink = sink ? std::move(sink) : [](const std::string& line) { fmt::print("[explain] {}\n", line); };
}
ExplainScope::~ExplainScope() { explain_sink = std::move(previous_); }

}  // namespace dtensor
