#include "dtensor/ops/dispatch.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <unordered_map>
#include <utility>

#include "dtensor/core/cuda.h"
#include "dtensor/core/error.h"
#include "dtensor/core/hash.h"
#include "dtensor/redistribute/executor.h"
#include "dtensor/redistribute/planner.h"
#include "dtensor/core/detail/cache_capacity.h"
#include "dtensor/core/detail/heap_bytes.h"
#include "dtensor/core/detail/lru_list.h"
#include "dtensor/mesh/detail/trace_recorder.h"

namespace dtensor {

namespace {

bool is_half(DType dtype) { return dtype == DType::BFloat16 || dtype == DType::Float16; }

/// Runs the op's kernel for the inputs' device (for an op without tensor
/// inputs, OpAttrs::device()). The CPU kernels compute bf16 and f16 in f32:
/// the inputs are widened, the kernel runs with the output's dtype widened
/// too, and the output is rounded once to its dtype.
Tensor run_kernel(const OpDef& op, const KernelArgs& args) {
  const std::size_t n = args.inputs.size();
  const Device device = n ? args.inputs[0].device() : args.attrs.device();
  for (std::size_t i = 1; i < n; ++i)
    if (args.inputs[i].device() != device)
      throw ValueError(fmt::format("[{}] input {} is on {} and input 0 on {}; move them to one device with to()",
                                   op.name, i, args.inputs[i].device(), device));
  const Kernel& kernel = op.kernel(device);
  if (!kernel)
    throw UnsupportedError(fmt::format("[{}] has no {} kernel{}", op.name, device,
                                       device == Device::CUDA && !cuda::built() ? " (this build has no CUDA)" : ""));
  if (device != Device::CPU || op.cpu_handles_half) return kernel(args);
  bool widen = is_half(args.output.dtype);
  for (std::size_t i = 0; i < n; ++i) widen = widen || is_half(args.inputs[i].dtype());
  if (!widen) return kernel(args);
  std::vector<Tensor> inputs(args.inputs.begin(), args.inputs.end());
  std::vector<TensorMeta> global(args.global.begin(), args.global.end());
  for (std::size_t i = 0; i < n; ++i) {
    inputs[i] = inputs[i].to(cpu_compute_dtype(inputs[i].dtype()));
    global[i].dtype = cpu_compute_dtype(global[i].dtype);
  }
  TensorMeta output = args.output;
  output.dtype = cpu_compute_dtype(output.dtype);
  KernelArgs wide{inputs, global, args.boxes, args.layouts, args.attrs, output, args.output_box, args.output_layout};
  return kernel(wide).to(args.output.dtype);
}

// One cached decision with the key it was made for. A hit compares the key
// field by field against the call's own inputs, so a hit allocates nothing.
struct Entry {
  const OpDef* op;
  Shape mesh_shape;
  std::vector<TensorMeta> inputs;
  std::vector<Layout> layouts;
  OpAttrs attrs;
  CostModel cost;
  OpDecision decision;
  std::vector<std::unique_ptr<Plan>> plans;  // owned: the plan cache may be cleared
  /// This rank's boxes of the inputs (in decision.chosen.inputs) and of the
  /// output, for the mesh coordinate they were computed at. Entries are per
  /// thread, i.e. per rank, so dispatch fills these once instead of on every
  /// call.
  Shape boxes_coordinate;
  std::vector<Box> input_boxes;
  Box output_box;
  /// The layout and global shape of every output this entry makes, shared
  /// by them (made on the first dispatch through the entry).
  std::shared_ptr<const ShardedMeta> output_meta;
  /// The cache's bookkeeping: the key's hash (its bucket), the entry's
  /// approx bytes, and its place in the recency order.
  std::size_t hash = 0;
  std::size_t bytes = 0;
  Entry* lru_prev = nullptr;
  Entry* lru_next = nullptr;
};

CacheCapacity& capacity() {
  static CacheCapacity c("DTENSOR_PROPAGATION_CACHE_ENTRIES", kDefaultPropagationCacheEntries, "propagation cache");
  return c;
}

// Per thread (per rank), so that a hit takes no lock: a lookup, a compare
// of the key and a relink. Bounded by capacity() entries, the least
// recently used going first.
struct Cache {
  std::unordered_map<std::size_t, std::vector<std::unique_ptr<Entry>>> entries;
  LruList<Entry> lru;
  std::size_t bytes = 0;
  CacheStats stats;
};
thread_local Cache cache;
thread_local std::function<void(const std::string&)> explain_sink;
thread_local std::function<void(const ExplainedOp&)> explain_on_op;
thread_local std::string explain_tag;  // ExplainTag's, e.g. "backward of linear"

// A call's inputs as the cache key reads them, in the two forms calls come
// in: the metadata spans of decide() and a miss, and the inputs by address
// of dispatch(), which a hit reads in place.
struct MetaInputs {
  std::span<const TensorMeta> metas;
  std::span<const Layout> layouts;
  std::size_t size() const { return metas.size(); }
  const Shape& shape(std::size_t i) const { return metas[i].shape; }
  DType dtype(std::size_t i) const { return metas[i].dtype; }
  const Layout& layout(std::size_t i) const { return layouts[i]; }
};
struct CallInputs {
  std::span<const ShardedInput> inputs;
  std::size_t size() const { return inputs.size(); }
  const Shape& shape(std::size_t i) const { return *inputs[i].global_shape; }
  DType dtype(std::size_t i) const { return inputs[i].local->dtype(); }
  const Layout& layout(std::size_t i) const { return *inputs[i].layout; }
};

// The cost model is compared, not hashed: its hash of its doubles would
// cost more than the rest of a hit's key, and calls differing only in it
// are rare.
template <class Inputs>
std::size_t key_hash(const OpDef& op, const Shape& mesh, const Inputs& inputs, const OpAttrs& attrs) {
  std::size_t h = std::hash<const void*>{}(&op);
  for (auto s : mesh) hash_combine(h, static_cast<std::size_t>(s));
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    hash_combine(h, static_cast<std::size_t>(inputs.dtype(i)) + 0x100);
    for (auto s : inputs.shape(i)) hash_combine(h, static_cast<std::size_t>(s));
    hash_combine(h, inputs.layout(i).hash());
  }
  hash_combine(h, attrs.hash());
  return h;
}

template <class Inputs>
bool same_key(const Entry& e, const OpDef& op, const Shape& mesh, const Inputs& inputs, const OpAttrs& attrs,
              const CostModel& cost) {
  if (e.op != &op || e.inputs.size() != inputs.size() || e.mesh_shape != mesh) return false;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (e.inputs[i].dtype != inputs.dtype(i) || e.inputs[i].shape != inputs.shape(i) ||
        e.layouts[i] != inputs.layout(i))
      return false;
  return e.attrs == attrs && e.cost == cost;
}

// The cached entry for a call (now the most recently used), or null; counts
// nothing.
template <class Inputs>
Entry* find_entry(Cache& c, std::size_t h, const OpDef& op, const Shape& mesh, const Inputs& inputs,
                  const OpAttrs& attrs, const CostModel& cost) {
  const auto it = c.entries.find(h);
  if (it == c.entries.end()) return nullptr;
  for (const auto& e : it->second)
    if (same_key(*e, op, mesh, inputs, attrs, cost)) {
      c.lru.touch(e.get());
      return e.get();
    }
  return nullptr;
}

std::size_t strategy_bytes(const Strategy& s) {
  std::size_t n = buffer_bytes(s.inputs) + approx_bytes(s.output) - sizeof(Layout) + buffer_bytes(s.note);
  for (const Layout& l : s.inputs) n += approx_bytes(l) - sizeof(Layout);
  return n;
}

// An entry's memory once dispatch has filled its boxes (estimated from the
// inputs' ranks, as they are filled after the entry is counted).
std::size_t entry_bytes(const Entry& e) {
  std::size_t n = sizeof(Entry) + buffer_bytes(e.mesh_shape) + buffer_bytes(e.inputs) + buffer_bytes(e.layouts) +
                  buffer_bytes(e.plans) + buffer_bytes(e.decision.input_plans) + strategy_bytes(e.decision.chosen) +
                  strategy_bytes(e.decision.runner_up) + buffer_bytes(e.decision.output.shape) + sizeof(ShardedMeta) +
                  2 * e.mesh_shape.size() * sizeof(std::int64_t);
  for (const TensorMeta& m : e.inputs) n += buffer_bytes(m.shape) + sizeof(Box) + 2 * buffer_bytes(m.shape);
  for (const Layout& l : e.layouts) n += approx_bytes(l) - sizeof(Layout);
  for (const auto& p : e.plans) n += approx_bytes(*p);
  return n;
}

// Drops least recently used entries until one more of `bytes` fits.
void make_room(Cache& c, std::size_t bytes) {
  const std::size_t limit = capacity().get();
  while (c.lru.size() >= limit || (c.lru.size() > 0 && c.bytes + bytes > kPropagationCacheBytes)) {
    Entry* old = c.lru.back();
    c.lru.unlink(old);
    c.bytes -= old->bytes;
    ++c.stats.evictions;
    auto bucket = c.entries.find(old->hash);
    auto& v = bucket->second;
    v.erase(std::find_if(v.begin(), v.end(), [&](const auto& p) { return p.get() == old; }));
    if (v.empty()) c.entries.erase(bucket);
  }
}

std::string layouts_text(std::span<const Layout> layouts) {
  std::string out;
  for (std::size_t i = 0; i < layouts.size(); ++i) out += fmt::format("{}[{}]", i ? " " : "", layouts[i]);
  return out;
}

// The prices of moving each input to a candidate's target. Most moves have a
// closed-form price; the rest get a lower bound first and the planner's
// price only if the candidate could still be the best or the runner-up.
// Candidates share targets, so prices are kept per (input, target) for one
// call.
class MovePrices {
 public:
  struct Price {
    std::size_t input;
    const Layout* target;
    double seconds;  // exact, or a lower bound while !exact
    bool exact;
  };

  MovePrices(const Shape& mesh, std::span<const TensorMeta> inputs, std::span<const Layout> layouts,
             const CostModel& cost)
      : mesh_(mesh), inputs_(inputs), layouts_(layouts), cost_(cost) {
    prices_.reserve(2 * inputs.size() + 8);
  }

  /// The closed-form price or a lower bound.
  const Price& bound(std::size_t i, const Layout& target) { return find(i, target); }

  double exact(std::size_t i, const Layout& target) {
    Price& p = find(i, target);
    if (!p.exact) {
      p.seconds = redistribute_seconds(mesh_, inputs_[i].shape, inputs_[i].dtype, layouts_[i], target, cost_);
      p.exact = true;
    }
    return p.seconds;
  }

 private:
  Price& find(std::size_t i, const Layout& target) {
    for (Price& p : prices_)
      if (p.input == i && *p.target == target) return p;
    const TensorMeta& m = inputs_[i];
    if (auto t = closed_form_seconds(mesh_, m.shape, m.dtype, layouts_[i], target, cost_))
      prices_.push_back(Price{i, &target, *t, true});
    else
      prices_.push_back(Price{i, &target,
                              redistribute_lower_bound_seconds(mesh_, m.shape, m.dtype, layouts_[i], target, cost_),
                              false});
    return prices_.back();
  }

  const Shape& mesh_;
  std::span<const TensorMeta> inputs_;
  std::span<const Layout> layouts_;
  const CostModel& cost_;
  std::vector<Price> prices_;
};

// A candidate that creates a Partial output leaves a reduction owed: a
// later op or the user will need the values, and the least any of them can
// pay is a reduce_scatter, half an all_reduce's traffic. Pricing inputs
// alone (as PyTorch does) would pick, for S(0) @ S(0), an all_to_all of A
// into a Partial C of N x N per rank over an all_gather of B into an S(0)
// C: cheaper by the inputs, slower and twice the memory once C is reduced.
// A Partial carried over from an input (P + P) owes nothing new.
double owed_reduction(const Strategy& cand, const Shape& mesh_shape, const TensorMeta& output, const CostModel& cost) {
  double owed = 0;
  for (int m = 0; m < cand.output.mesh_ndim(); ++m) {
    if (!is_partial(cand.output[m])) continue;
    bool carried = false;
    for (const Layout& in : cand.inputs) carried = carried || (m < in.mesh_ndim() && is_partial(in[m]));
    if (carried) continue;
    // The all_reduce on m, at the planner's one-step cost: a search per
    // candidate would double a cache miss. (The planner prices what that
    // declines: a lower bound here could be no more than a latency.)
    const auto all_reduce = all_reduce_step_seconds(mesh_shape, output.shape, output.dtype, cand.output, m, cost);
    owed += 0.5 * (all_reduce ? *all_reduce
                              : redistribute_seconds(mesh_shape, output.shape, output.dtype, cand.output,
                                                     cand.output.with(m, Replicate{}), cost));
  }
  return owed;
}

constexpr std::size_t kNone = static_cast<std::size_t>(-1);

/// The cheapest candidate and the runner-up (kNone: none) with their costs.
struct Ranking {
  std::size_t best = kNone, second = kNone;
  std::vector<double> costs, owed;
};

// Prices every candidate (sums in input order, so that a candidate's price
// does not depend on which of its moves were priced first) and ranks them:
// cheapest bounds first; a candidate whose bound exceeds the runner-up
// found so far can be neither the best nor the runner-up, and nor can any
// after it. Ties go to the earliest candidate.
Ranking rank_candidates(std::span<const Strategy> candidates, const Shape& mesh_shape,
                        std::span<const TensorMeta> inputs, std::span<const Layout> layouts, const TensorMeta& output,
                        const CostModel& cost) {
  MovePrices prices(mesh_shape, inputs, layouts, cost);
  constexpr double kUnpriced = std::numeric_limits<double>::infinity();
  Ranking r;
  std::vector<double> bound(candidates.size(), 0);
  r.costs.assign(candidates.size(), kUnpriced);
  r.owed.assign(candidates.size(), 0);
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    r.owed[c] = owed_reduction(candidates[c], mesh_shape, output, cost);
    double total = r.owed[c];
    bool exact = true;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (candidates[c].inputs[i] == layouts[i]) continue;
      const auto& p = prices.bound(i, candidates[c].inputs[i]);
      total += p.seconds;
      exact = exact && p.exact;
    }
    bound[c] = total;
    if (exact) r.costs[c] = total;
  }
  std::vector<std::size_t> order(candidates.size());
  for (std::size_t c = 0; c < order.size(); ++c) order[c] = c;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return bound[a] < bound[b]; });
  auto before = [&](std::size_t a, std::size_t b) {
    return r.costs[a] < r.costs[b] || (r.costs[a] == r.costs[b] && a < b);
  };
  for (std::size_t c : order) {
    if (r.second != kNone && bound[c] > r.costs[r.second]) break;
    if (r.costs[c] == kUnpriced) {
      double total = r.owed[c];
      for (std::size_t i = 0; i < inputs.size(); ++i)
        if (candidates[c].inputs[i] != layouts[i]) total += prices.exact(i, candidates[c].inputs[i]);
      r.costs[c] = total;
    }
    if (r.best == kNone || before(c, r.best)) {
      r.second = r.best;
      r.best = c;
    } else if (r.second == kNone || before(c, r.second)) {
      r.second = c;
    }
  }
  return r;
}

[[noreturn]] void no_strategy(const OpDef& op, const Shape& mesh_shape, std::span<const TensorMeta> inputs,
                              std::span<const Layout> layouts) {
  std::vector<std::string> shapes;
  for (const auto& m : inputs) shapes.push_back(fmt::format("{}", fmt::join(m.shape, "x")));
  throw LayoutError(fmt::format("[{}] no sharding strategy for inputs {} of shapes {} on mesh {}", op.name,
                                layouts_text(layouts), fmt::join(shapes, " "), fmt::join(mesh_shape, "x")));
}

// Makes the decision of a new entry (its key already filled).
void make_decision(Entry& entry) {
  const OpDef& op = *entry.op;
  const Shape& mesh_shape = entry.mesh_shape;
  std::span<const TensorMeta> inputs = entry.inputs;
  std::span<const Layout> layouts = entry.layouts;
  OpDecision& d = entry.decision;
  d.op = &op;
  d.output = op.meta(inputs, entry.attrs);
  StrategyQuery query{mesh_shape, inputs, layouts, entry.attrs, d.output};
  const std::vector<Strategy> candidates = op.strategy(query);
  d.candidates = static_cast<int>(candidates.size());
  const Ranking r = rank_candidates(candidates, mesh_shape, inputs, layouts, d.output, entry.cost);
  if (r.best == kNone || r.costs[r.best] < 0) no_strategy(op, mesh_shape, inputs, layouts);
  d.chosen = candidates[r.best];
  d.cost_seconds = r.costs[r.best];
  d.owed_seconds = r.owed[r.best];
  if (r.second != kNone) {
    d.runner_up = candidates[r.second];
    d.runner_up_cost = r.costs[r.second];
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (d.chosen.inputs[i] == layouts[i]) {
      d.input_plans.push_back(nullptr);
      continue;
    }
    PlanRequest request{mesh_shape, inputs[i].shape, inputs[i].dtype, layouts[i], d.chosen.inputs[i], entry.cost};
    entry.plans.push_back(std::make_unique<Plan>(cached_plan(request)));
    d.input_plans.push_back(entry.plans.back().get());
  }
}

// The cached entry for a call, made on a miss.
Entry& decide_entry(const OpDef& op, const Shape& mesh_shape, std::span<const TensorMeta> inputs,
                    std::span<const Layout> layouts, const OpAttrs& attrs, const CostModel& cost) {
  const MetaInputs key{inputs, layouts};
  const std::size_t h = key_hash(op, mesh_shape, key, attrs);
  if (Entry* e = find_entry(cache, h, op, mesh_shape, key, attrs, cost)) {
    ++cache.stats.hits;
    return *e;
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
  make_decision(*entry);
  entry->hash = h;
  entry->bytes = entry_bytes(*entry);
  make_room(cache, entry->bytes);
  cache.bytes += entry->bytes;
  cache.lru.push_front(entry.get());
  auto& bucket = cache.entries[h];
  bucket.push_back(std::move(entry));
  return *bucket.back();
}

void explain(const Entry& e, const CommStats& moved) {
  const OpDef& op = *e.op;
  const OpDecision& d = e.decision;
  const std::span<const Layout> layouts = e.layouts;
  const std::string tag = explain_tag.empty() ? std::string() : fmt::format("[{}] ", explain_tag);
  if (!d.chosen.note.empty()) explain_sink(fmt::format("{}{}: {}", tag, op.name, d.chosen.note));
  std::string line = fmt::format("{}{}: inputs {}; chose {} -> {} at {}", tag, op.name, layouts_text(layouts),
                                 layouts_text(d.chosen.inputs), d.chosen.output, human_seconds(d.cost_seconds));
  if (d.owed_seconds > 0)
    line += fmt::format(" (of which {} owed for reducing its new Partial later)", human_seconds(d.owed_seconds));
  if (d.runner_up_cost >= 0)
    line += fmt::format(" (runner-up {} -> {} at {}; {} candidates)", layouts_text(d.runner_up.inputs),
                        d.runner_up.output, human_seconds(d.runner_up_cost), d.candidates);
  line += fmt::format("; issued {}", moved);
  explain_sink(line);
  if (explain_on_op) explain_on_op(ExplainedOp{op, e.mesh_shape, e.inputs, e.layouts, d, moved, explain_tag});
}

}  // namespace

const OpDecision& decide(const OpDef& op, const Shape& mesh_shape, std::span<const TensorMeta> inputs,
                         std::span<const Layout> layouts, const OpAttrs& attrs, const CostModel& cost) {
  return decide_entry(op, mesh_shape, inputs, layouts, attrs, cost).decision;
}

namespace {

// Small calls keep their tensors and metadata on the stack.
constexpr std::size_t kInline = 4;

// A miss: the call's metadata by value, for the new entry's key.
Entry& decide_miss(const OpDef& op, const Shape& mesh_shape, const CallInputs& call, const OpAttrs& attrs,
                   const CostModel& cost) {
  std::vector<TensorMeta> metas(call.size());
  std::vector<Layout> layouts(call.size());
  for (std::size_t i = 0; i < call.size(); ++i) {
    metas[i] = TensorMeta{call.shape(i), call.dtype(i)};
    layouts[i] = call.layout(i);
  }
  return decide_entry(op, mesh_shape, metas, layouts, attrs, cost);
}

// What an entry keeps for this rank: the boxes (per mesh coordinate) and
// the outputs' shared metadata.
void fill_rank_parts(Entry& e, const DeviceMesh& mesh) {
  const OpDecision& d = e.decision;
  if (e.boxes_coordinate != mesh.coordinate()) {
    e.input_boxes.resize(e.inputs.size());
    for (std::size_t i = 0; i < e.inputs.size(); ++i)
      e.input_boxes[i] = local_box(mesh.shape(), e.inputs[i].shape, d.chosen.inputs[i], mesh.coordinate());
    e.output_box = local_box(mesh.shape(), d.output.shape, d.chosen.output, mesh.coordinate());
    e.boxes_coordinate = mesh.coordinate();
  }
  if (!e.output_meta) e.output_meta = std::make_shared<const ShardedMeta>(ShardedMeta{d.chosen.output, d.output.shape});
}

// What a trace shows of the decision: the layouts the kernel runs on.
void note_layouts(trace::OpSpan& span, const OpDecision& d) {
  span.note("inputs", trace::json_quote(layouts_text(d.chosen.inputs)));
  span.note("output", trace::json_quote(fmt::format("{}", d.chosen.output)));
}

}  // namespace

ShardedTensor dispatch(const OpDef& op, const DeviceMesh& mesh, std::span<const ShardedInput> inputs,
                       const OpAttrs& attrs, const CostModel& cost, std::vector<ShardedTensor>* moved) {
  trace::OpSpan span(op.name);  // a trace event while one records, else one thread-local test
  const CallInputs call{inputs};
  Cache& c = cache;  // one thread-local lookup
  Entry* found = find_entry(c, key_hash(op, mesh.shape(), call, attrs), op, mesh.shape(), call, attrs, cost);
  if (found)
    ++c.stats.hits;
  else
    found = &decide_miss(op, mesh.shape(), call, attrs, cost);
  Entry& e = *found;
  const OpDecision& d = e.decision;
  if (span.recording()) note_layouts(span, d);

  const bool explaining = static_cast<bool>(explain_sink);
  CommStats before;
  if (explaining) before = mesh.comm().stats();
  fill_rank_parts(e, mesh);
  // The kernel takes its inputs as one span of Tensors: a lone input that
  // stays put is passed as it is, others are copied (or moved) into place.
  const std::size_t n = inputs.size();
  const bool as_passed = n == 1 && !d.input_plans[0];
  InlineArray<Tensor, kInline> slots(as_passed ? 0 : n);
  // (Not a conditional expression: with a const Tensor operand it would be
  // a const prvalue and copy twice.)
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (d.input_plans[i])
      slots[i] = execute_plan(*d.input_plans[i], mesh, *inputs[i].local);
    else
      slots[i] = *inputs[i].local;
  }
  const std::span<const Tensor> locals =
      as_passed ? std::span<const Tensor>(inputs[0].local, 1) : std::span<const Tensor>(slots.data(), n);
  if (moved) {
    moved->clear();  // stays empty (no allocation) when nothing moved
    for (std::size_t i = 0; i < n; ++i) {
      if (!d.input_plans[i]) continue;
      if (moved->empty()) moved->resize(n);
      (*moved)[i] =
          ShardedTensor{locals[i],
                        std::make_shared<const ShardedMeta>(ShardedMeta{d.chosen.inputs[i], *inputs[i].global_shape})};
    }
  }
  KernelArgs args{locals, e.inputs, e.input_boxes, d.chosen.inputs, attrs, d.output, e.output_box, d.chosen.output};
  Tensor out = run_kernel(op, args);
  if (out.shape() != e.output_box.size)
    throw Error(fmt::format("[{}] internal: the kernel returned a {} shard where {} gives {}", op.name,
                            fmt::join(out.shape(), "x"), d.chosen.output, fmt::join(e.output_box.size, "x")));
  if (explaining) explain(e, mesh.comm().stats() - before);
  return ShardedTensor{std::move(out), e.output_meta};
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
  const TensorMeta out = op.meta(metas, attrs);
  const Box out_box = full_box(out.shape);
  const Layout out_layout;
  KernelArgs args{inputs, metas, boxes, layouts, attrs, out, out_box, out_layout};
  return run_kernel(op, args);
}

CacheStats propagation_cache_stats() {
  CacheStats s = cache.stats;
  s.entries = cache.lru.size();
  s.capacity = capacity().get();
  s.bytes = cache.bytes;
  return s;
}
void clear_propagation_cache() { cache = Cache{}; }
void set_propagation_cache_capacity(std::size_t entries) { capacity().set(entries); }

ExplainScope::ExplainScope(std::function<void(const std::string&)> sink)
    : previous_(explain_sink), previous_on_op_(explain_on_op) {
  explain_sink = sink ? std::move(sink) : [](const std::string& line) { fmt::print("[explain] {}\n", line); };
}
ExplainScope::ExplainScope(std::function<void(const std::string&)> sink, std::function<void(const ExplainedOp&)> on_op)
    : ExplainScope(std::move(sink)) {
  explain_on_op = std::move(on_op);
}
ExplainScope::~ExplainScope() {
  explain_sink = std::move(previous_);
  explain_on_op = std::move(previous_on_op_);
}

ExplainTag::ExplainTag(std::string tag) : previous_(std::exchange(explain_tag, std::move(tag))) {}
ExplainTag::~ExplainTag() { explain_tag = std::move(previous_); }

}  // namespace dtensor
