// The planner's front end: validation, the reduced problem, the choice
// between the searched chain and the direct exchange, and the plan value.
#include "dtensor/redistribute/planner.h"

#include <algorithm>
#include <array>

#include <fmt/ranges.h>

#include "dtensor/redistribute/detail/compact_layout.h"
#include "dtensor/core/error.h"
#include "dtensor/core/hash.h"
#include "dtensor/core/reduction_bytes.h"
#include "objective.h"
#include "dtensor/redistribute/detail/planner_search.h"

namespace dtensor {
namespace {

using planner::Edge;
using planner::kPar;
using planner::kRep;
using planner::kShard;
using planner::Problem;
using planner::Search;

void check_mesh_and_shape(const PlanRequest& req) {
  if (auto problem = plan_size_problem(req.mesh_shape, req.global_shape, req.dtype))
    throw ShapeError(fmt::format("[redistribute] {}", *problem));
}

Layout check_layout(const Layout& l, std::string_view which, const PlanRequest& req) {
  const Shape& mesh = req.mesh_shape;
  if (auto problem = layout_problem(l.placements(), mesh.size(), req.global_shape.size())) {
    switch (problem->kind) {
      case LayoutProblem::Kind::MeshDims:
        throw LayoutError(fmt::format("[redistribute] {} layout {} has {} placements: the mesh [{}] has {} dims", which,
                                      l, l.mesh_ndim(), fmt::join(mesh, ","), mesh.size()));
      case LayoutProblem::Kind::ShardDim:
        throw LayoutError(fmt::format("[redistribute] {} ({} layout {})", describe(*problem, l, mesh), which, l));
      case LayoutProblem::Kind::MixedPartial:
        throw LayoutError(fmt::format("[redistribute] {} layout {}", which, describe(*problem, l, mesh)));
    }
  }
  return validate_layout(l, mesh, req.global_shape);
}

// Size-1 mesh dims are Replicate in intermediate layouts (always valid).
Layout lift(const CompactLayout& p, const Problem& P, int mesh_ndim) {
  std::vector<Placement> pl(mesh_ndim, Replicate{});
  std::vector<std::pair<std::int64_t, std::vector<int>>> order;
  for (int i = 0; i < P.mesh_ndim; ++i) {
    if (p[i].kind == kPar) pl[P.full_dim[i]] = Partial{p[i].op};
    if (p[i].kind != kShard) continue;
    pl[P.full_dim[i]] = Shard{p[i].dim};
    if (std::any_of(order.begin(), order.end(), [&](auto& o) { return o.first == p[i].dim; })) continue;
    std::vector<int> dims;
    for (int lv = 0; lv < P.mesh_ndim; ++lv)
      for (int j = 0; j < P.mesh_ndim; ++j)
        if (p[j].kind == kShard && p[j].dim == p[i].dim && p[j].level == lv) dims.push_back(P.full_dim[j]);
    order.emplace_back(p[i].dim, std::move(dims));
  }
  return Layout(std::move(pl), order);
}

std::string dims_text(const std::vector<int>& dims) {
  return fmt::format("mesh dim{} {}", dims.size() == 1 ? "" : "s", fmt::join(dims, ","));
}

std::string describe(const PlanStep& s, const Layout& before, DType dtype, std::span<const std::int64_t> mesh) {
  ReduceOp op = ReduceOp::Sum;
  for (const Placement& p : before.placements())
    if (auto* q = std::get_if<Partial>(&p)) op = q->op;
  std::int64_t n = 1;
  for (int m : s.mesh_dims) n *= mesh[static_cast<std::size_t>(m)];
  // The bytes shown are the pairs' (core/reduction_bytes.h): say why.
  const std::string pairs =
      reduces_as_average_pairs(dtype, op, n) ? " (exactly, as int64 pairs (x / n, x % n): twice the bytes)" : "";
  switch (s.kind) {
    case StepKind::AllGather: return fmt::format("gathers dim {} across {}", s.tensor_dim, dims_text(s.mesh_dims));
    case StepKind::AllReduce: return fmt::format("reduces ({}) across {}{}", op, dims_text(s.mesh_dims), pairs);
    case StepKind::ReduceScatter:
      return fmt::format("reduces ({}) across {} and scatters dim {}{}", op, dims_text(s.mesh_dims), s.tensor_dim,
                         pairs);
    case StepKind::AllToAll:
      return fmt::format("moves the split on {} from dim {} to dim {}", dims_text(s.mesh_dims), s.src_dim,
                         s.tensor_dim);
    case StepKind::Exchange: {
      std::size_t remote = 0;
      for (const ExchangeBlock& b : s.blocks) remote += b.src_rank != b.dst_rank;
      if (remote == 0) return "every rank already holds its new region: local copies only";
      return fmt::format("sends each rank exactly the regions it lacks ({} blocks)", remote);
    }
    case StepKind::Slice:
      if (s.tensor_dim < 0)
        return fmt::format("keeps this rank's chunk along {}, no communication", dims_text(s.mesh_dims));
      return fmt::format("keeps this rank's chunk of dim {} along {}, no communication", s.tensor_dim,
                         dims_text(s.mesh_dims));
    case StepKind::ZeroFill:
      return fmt::format("keeps the values on coordinate 0 of {} and zeros the others", dims_text(s.mesh_dims));
    case StepKind::Relabel: return fmt::format("relabels {}: no data moves", dims_text(s.mesh_dims));
  }
  return {};
}

std::string kinds_text(const std::vector<StepKind>& kinds) {
  std::vector<std::string_view> names;
  for (StepKind k : kinds) names.push_back(step_name(k));
  return fmt::format("{}", fmt::join(names, "+"));
}

std::string ratio_text(const planner::Cost& next, const planner::Cost& best, bool bytes_first) {
  auto ratio = [](double a, double b) { return b > 0 ? fmt::format("{:.2f}x", a / b) : std::string("more"); };
  if (bytes_first && next.bytes != best.bytes)
    return fmt::format("{} the bytes", ratio(static_cast<double>(next.bytes), static_cast<double>(best.bytes)));
  return fmt::format("{} the time", ratio(next.time, best.time));
}

}  // namespace

std::optional<std::string> plan_size_problem(std::span<const std::int64_t> mesh, std::span<const std::int64_t> g,
                                             DType dtype) {
  // The texts are made only for a message: every closed-form price of a
  // dispatch miss asks this of an acceptable request (about a hundred times
  // per miss), and formatting them eagerly was a fifth of a miss's work.
  const auto mesh_text = [&] { return fmt::format("mesh shape [{}]", fmt::join(mesh, ",")); };
  const auto shape_text = [&] { return fmt::format("global shape [{}]", fmt::join(g, ",")); };
  if (mesh.empty() || mesh.size() > static_cast<std::size_t>(kMaxMeshDims))
    return fmt::format("{} has {} dims: expected 1 to {}", mesh_text(), mesh.size(), kMaxMeshDims);
  for (std::size_t m = 0; m < mesh.size(); ++m)
    if (mesh[m] < 1) return fmt::format("{}: mesh dim {} has size {}, expected at least 1", mesh_text(), m, mesh[m]);
  const std::optional<std::int64_t> ranks = checked_product(mesh);
  if (!ranks) return fmt::format("{}: its rank count does not fit in int64", mesh_text());
  if (*ranks > kMaxPlanRanks)
    return fmt::format(
        "{} has {} ranks: the planner handles at most {} (it keeps every rank's box of every layout "
        "it tries)",
        mesh_text(), *ranks, kMaxPlanRanks);
  for (std::size_t d = 0; d < g.size(); ++d)
    if (g[d] < 0) return fmt::format("{}: size {} of dim {} is negative", shape_text(), g[d], d);
  if (static_cast<std::int64_t>(g.size()) > kMaxPlanTensorDims)
    return fmt::format(
        "a tensor of {} dims: the planner handles at most {} (the layouts it searches grow with "
        "the dims to the power of the mesh dims)",
        g.size(), kMaxPlanTensorDims);
  if (plan_work(mesh, static_cast<std::int64_t>(g.size())) > kMaxPlanWork) {
    std::int64_t most = 0;
    while (most < kMaxPlanTensorDims && plan_work(mesh, most + 1) <= kMaxPlanWork) ++most;
    return fmt::format(
        "a tensor of {} dims on the {} of {} ranks: the planner handles at most {} dims on this mesh "
        "(its work, ranks x dims x (dims + 2)^(mesh dims of size > 1), is held to {})",
        g.size(), mesh_text(), *ranks, most, kMaxPlanWork);
  }
  const std::optional<std::int64_t> count = checked_product(g);
  if (!count) return fmt::format("{}: its element count does not fit in int64", shape_text());
  const auto isz = static_cast<std::int64_t>(itemsize(dtype));
  if (*count > kMaxPlanBytes / isz)
    return fmt::format("{} of {} ({} elements of {} bytes): more than the planner's {} bytes (64 TiB)", shape_text(),
                       dtype, *count, isz, kMaxPlanBytes);
  return std::nullopt;
}

std::int64_t plan_work(std::span<const std::int64_t> mesh, std::int64_t dims) {
  constexpr std::int64_t kOver = kMaxPlanWork + 1;
  std::int64_t w = std::max<std::int64_t>(dims, 1);
  auto times = [&](std::int64_t f) { w = f > 0 && w > kOver / f ? kOver : std::min(kOver, w * f); };
  for (std::int64_t n : mesh) {
    times(n);
    if (n > 1) times(dims + 2);
  }
  return w;
}

std::size_t PlanRequest::hash() const {
  std::size_t h = kFnvOffsetBasis;
  hash_combine(h, mesh_shape.size());
  for (auto s : mesh_shape) hash_combine(h, static_cast<std::uint64_t>(s));
  hash_combine(h, global_shape.size());
  for (auto s : global_shape) hash_combine(h, static_cast<std::uint64_t>(s));
  hash_combine(h, static_cast<std::uint64_t>(dtype));
  hash_combine(h, from.hash());
  hash_combine(h, to.hash());
  hash_combine(h, cost.hash());
  return h;
}

Box needed_box(std::span<const std::int64_t> mesh_shape, std::span<const std::int64_t> global_shape,
               const Layout& layout, std::span<const std::int64_t> coord) {
  Box box = local_box(mesh_shape, global_shape, layout, coord);
  if (holds_zeros(layout, coord)) std::fill(box.size.begin(), box.size.end(), 0);
  return box;
}

namespace {

// Only size-1 mesh dims differ: they never split, so no data moves.
PlanStep relabel_step(const Plan& plan, int ranks) {
  PlanStep s;
  s.kind = StepKind::Relabel;
  for (int m = 0; m < plan.from.mesh_ndim(); ++m)
    if (plan.from[m] != plan.to[m] || plan.from.level(m) != plan.to.level(m)) s.mesh_dims.push_back(m);
  s.from = plan.from;
  s.to = plan.to;
  s.recv_bytes.assign(ranks, 0);
  s.reason = fmt::format("only mesh dims of size 1 change ({}): no data moves", fmt::join(s.mesh_dims, ","));
  return s;
}

// An exchange to the goal in which no rank receives anything and no rank
// must hold zeros is a local slice: names the mesh dims and the tensor dim
// (-1 for several) it slices.
void exchange_as_slice(PlanStep& s, const Search& search, const Search::Link& l, const Problem& P) {
  s.kind = StepKind::Slice;
  s.blocks.clear();
  const CompactLayout& a = search.state(l.from).layout;
  const CompactLayout& b = search.state(l.to).layout;
  for (int i = 0; i < P.mesh_ndim; ++i)
    if (a[i] != b[i]) s.mesh_dims.push_back(P.full_dim[i]);
  for (int i = 0; i < P.mesh_ndim; ++i)
    if (b[i].kind == kShard && std::find(s.mesh_dims.begin(), s.mesh_dims.end(), P.full_dim[i]) != s.mesh_dims.end())
      s.tensor_dim = s.tensor_dim == -1 || s.tensor_dim == b[i].dim ? b[i].dim : -2;
  if (s.tensor_dim == -2) s.tensor_dim = -1;
}

// Turns a link of the search into a step with exact per-rank bytes.
// Without `with_blocks`, an exchange's blocks are left out (it is only
// being priced): they are one per pair of ranks that share data, up to
// ranks^2 of them.
PlanStep make_step(Search& search, const Search::Link& l, const Problem& P, const Plan& plan,
                   std::vector<std::int64_t>& bytes, bool with_blocks = true) {
  PlanStep s;
  s.kind = l.edge.kind;
  for (int i = 0; i < l.edge.group_ndim; ++i) s.mesh_dims.push_back(P.full_dim[l.edge.group_dims[i]]);
  s.tensor_dim = l.edge.tensor_dim;
  s.src_dim = l.edge.src_dim;
  planner::Eval ev = l.edge.kind == StepKind::Exchange
                         ? search.exchange(l.from, bytes, with_blocks ? &s.blocks : nullptr)
                         : search.eval(l.from, l.to, l.edge, bytes);
  if (l.edge.kind == StepKind::Exchange && with_blocks) {
    const bool remote =
        std::any_of(s.blocks.begin(), s.blocks.end(), [](const ExchangeBlock& b) { return b.src_rank != b.dst_rank; });
    const bool zeros = std::any_of(plan.to.placements().begin(), plan.to.placements().end(), [](const Placement& p) {
      return is_partial(p) && std::get<Partial>(p).op == ReduceOp::Sum;
    });
    if (!remote && !zeros && l.to == search.goal()) {
      exchange_as_slice(s, search, l, P);
    } else {
      for (int m = 0; m < plan.from.mesh_ndim(); ++m) s.mesh_dims.push_back(m);
    }
  }
  s.recv_bytes = bytes;
  s.est_seconds = ev.time;
  return s;
}

// The busiest rank's total bytes and the total time of a plan.
void totals(const std::vector<PlanStep>& steps, int ranks, std::int64_t& busiest, double& time) {
  std::vector<std::int64_t> per(ranks, 0);
  time = 0;
  for (const PlanStep& s : steps) {
    for (int r = 0; r < ranks; ++r) per[r] = checked_add(per[r], s.recv_bytes[r], "bytes a rank receives in a plan");
    time += s.est_seconds;
  }
  busiest = *std::max_element(per.begin(), per.end());
}

// Consecutive slices become one local copy.
void merge_slices(std::vector<PlanStep>& steps, std::vector<int>& step_target, const Search& search, const Problem& P) {
  for (std::size_t i = 0; i + 1 < steps.size();) {
    if (steps[i].kind == StepKind::Slice && steps[i + 1].kind == StepKind::Slice) {
      for (int m : steps[i + 1].mesh_dims) steps[i].mesh_dims.push_back(m);
      if (steps[i].tensor_dim != steps[i + 1].tensor_dim) steps[i].tensor_dim = -1;
      const planner::State& t = search.state(step_target[i + 1]);
      steps[i].est_seconds = planner::local_step_seconds(t.max_numel, P.itemsize, *P.cost);
      step_target[i] = step_target[i + 1];
      steps.erase(steps.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      step_target.erase(step_target.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    } else {
      ++i;
    }
  }
}

// The reason of the first step also says how the plan ranked among those
// the search compared; the runner-up it names goes into the plan as well.
std::string ranking_text(const Search& search, int chosen_pred, StepKind chosen_last, bool bytes_first,
                         std::optional<PlanRunnerUp>& runner_up) {
  const planner::Candidate* best = nullptr;
  const planner::Candidate* next = nullptr;
  for (const planner::Candidate& c : search.candidates()) {
    if (c.pred == chosen_pred && c.last == chosen_last) {
      if (!best || search.better(c.cost, best->cost)) best = &c;
    } else if (!next || search.better(c.cost, next->cost)) {
      next = &c;
    }
  }
  const std::size_t considered = std::max<std::size_t>(search.considered(), 1);
  // A layout reached but never expanded could not lead to a cheaper plan
  // (by its cost so far, plus the search's lower bound where it has one).
  if (considered == 1 && search.num_states() > search.expanded())
    return "; cheapest of all plans (the others could not cost less and were left unexplored)";
  if (considered == 1) return "; the only plan found";
  if (!next || !best) return fmt::format("; cheapest of {} plans (the others lost on a lower bound)", considered);
  std::vector<StepKind> kinds = search.path_kinds(next->pred, next->label);
  kinds.push_back(next->last);
  std::string text = fmt::format("; cheapest of {} plans (next: {}, {})", considered, kinds_text(kinds),
                                 ratio_text(next->cost, best->cost, bytes_first));
  runner_up = PlanRunnerUp{std::move(kinds), next->cost.bytes, next->cost.time};
  return text;
}

}  // namespace

Plan plan_redistribute(const PlanRequest& req) { return plan_redistribute(req, true); }

Plan plan_redistribute(const PlanRequest& req, bool lower_bound, PlanSearchStats* stats) {
  check_mesh_and_shape(req);
  Plan plan;
  plan.mesh_shape = req.mesh_shape;
  plan.global_shape = req.global_shape;
  plan.dtype = req.dtype;
  plan.from = check_layout(req.from, "source", req);
  plan.to = check_layout(req.to, "target", req);
  const int mesh_ndim = static_cast<int>(req.mesh_shape.size());
  const int ranks = static_cast<int>(numel(req.mesh_shape));
  plan.recv_bytes.assign(ranks, 0);
  if (plan.from == plan.to) return plan;

  CompactLayout src, dst;
  Problem P = planner::make_problem(req, plan.from, plan.to, src, dst);
  P.lower_bound = lower_bound;
  const bool src_partial =
      std::any_of(src.begin(), src.end(), [](const CompactPlacement& p) { return p.kind == kPar; });
  if (src == dst) {
    plan.steps.push_back(relabel_step(plan, ranks));
    return plan;
  }

  Search search(P, src, dst);
  std::vector<Search::Link> chain = search.run();
  if (stats) *stats = PlanSearchStats{search.num_states(), search.expanded()};
  std::vector<std::int64_t> bytes;
  std::vector<PlanStep> steps;
  std::vector<int> step_target;  // reduced state each step ends in
  for (const Search::Link& l : chain) {
    steps.push_back(make_step(search, l, P, plan, bytes));
    step_target.push_back(l.to);
  }
  merge_slices(steps, step_target, search, P);

  // Selection rule. Without Partial in the source, the busiest rank of any
  // plan receives at least max_r |needed(r) \ held(r)|, and the direct
  // exchange receives exactly that. The search minimises the sum over steps
  // of each step's busiest rank, an upper bound of the plan's exact busiest
  // total; since the exchange edge from the source is one of its paths, the
  // chain it returns is never above the bound either. It can miss a chain
  // whose steps load different ranks (sum of maxima above the bound, exact
  // total on it) that would be faster; we accept that. Here we compare the
  // exact totals of the chain and of the direct exchange, ties by time, so
  // the lower bound holds whatever the search did.
  bool direct = false;
  if (!src_partial && !(chain.size() == 1 && chain[0].edge.kind == StepKind::Exchange)) {
    const Search::Link exchange{search.source(), search.goal(), planner::edge_of(StepKind::Exchange)};
    std::vector<PlanStep> ex{make_step(search, exchange, P, plan, bytes, false)};
    std::int64_t cb, eb;
    double ct, et;
    totals(steps, ranks, cb, ct);
    totals(ex, ranks, eb, et);
    if (eb < cb || (eb == cb && et < ct)) {
      steps = {make_step(search, exchange, P, plan, bytes)};
      step_target = {search.goal()};
      direct = true;
    }
  }

  // Layouts: the request's at both ends, size-1 dims Replicate in between.
  for (std::size_t i = 0; i < steps.size(); ++i) {
    steps[i].from = i == 0 ? plan.from : steps[i - 1].to;
    steps[i].to = i + 1 == steps.size() ? plan.to : lift(search.state(step_target[i]).layout, P, mesh_ndim);
  }
  // Reasons: what each step does; the first also says how the plan ranked.
  for (PlanStep& s : steps) s.reason = describe(s, s.from, req.dtype, req.mesh_shape);
  steps[0].reason += ranking_text(search, direct ? search.source() : chain.back().from,
                                  direct ? StepKind::Exchange : chain.back().edge.kind, P.bytes_first, plan.runner_up);

  for (const PlanStep& s : steps) {
    for (int r = 0; r < ranks; ++r)
      plan.recv_bytes[r] = checked_add(plan.recv_bytes[r], s.recv_bytes[r], "bytes a rank receives in a plan");
    plan.est_seconds += s.est_seconds;
  }
  plan.steps = std::move(steps);
  return plan;
}

namespace planner {

// The request reduced to its mesh dims of size > 1, with the exchange links
// between every pair of ranks.
Problem make_problem(const PlanRequest& req, const Layout& from, const Layout& to, CompactLayout& src,
                     CompactLayout& dst) {
  const int mesh_ndim = static_cast<int>(req.mesh_shape.size());
  const int ranks = static_cast<int>(numel(req.mesh_shape));
  Problem P;
  for (int m = 0; m < mesh_ndim; ++m)
    if (req.mesh_shape[m] > 1) {
      P.full_dim[P.mesh_ndim] = m;
      P.mesh_shape[P.mesh_ndim] = req.mesh_shape[m];
      ++P.mesh_ndim;
    }
  P.tensor_ndim = static_cast<int>(req.global_shape.size());
  P.global = req.global_shape;
  P.ranks = ranks;
  P.dtype = req.dtype;
  P.itemsize = static_cast<std::int64_t>(itemsize(req.dtype));
  P.cost = &req.cost;
  P.avg_in_one_step = !is_floating(req.dtype);
  P.coords.resize(static_cast<std::size_t>(ranks) * P.mesh_ndim);
  for (int r = 0; r < ranks; ++r) {
    Shape c = unravel_index(r, req.mesh_shape);
    for (int i = 0; i < P.mesh_ndim; ++i) P.coords[static_cast<std::size_t>(r) * P.mesh_ndim + i] = c[P.full_dim[i]];
  }
  std::vector<int> diff;
  for (int mask = 0; mask < (1 << P.mesh_ndim); ++mask) {
    diff.clear();
    for (int i = 0; i < P.mesh_ndim; ++i)
      if (mask & (1 << i)) diff.push_back(P.full_dim[i]);
    P.link_by_mask[static_cast<std::size_t>(mask)] = req.cost.group_link(diff);
    // Every subset of the reduced dims (each of size > 1) is what some pair
    // of distinct ranks differs on.
    if (mask != 0) P.max_bw = std::max(P.max_bw, P.link_by_mask[static_cast<std::size_t>(mask)].bandwidth_Bps);
  }
  src = compact(from, std::span(P.full_dim.data(), P.mesh_ndim));
  dst = compact(to, std::span(P.full_dim.data(), P.mesh_ndim));
  // Partial on mesh dims of size 1 is already the full value.
  const bool src_partial =
      std::any_of(src.begin(), src.end(), [](const CompactPlacement& p) { return p.kind == kPar; });
  P.bytes_first =
      !src_partial || bandwidth_dominates(byte_size(req.global_shape, itemsize(req.dtype)), P.max_bw, req.cost);
  P.exact_busiest = src_partial && P.bytes_first;
  return P;
}

}  // namespace planner

}  // namespace dtensor
