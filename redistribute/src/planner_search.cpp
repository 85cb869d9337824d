#include "dtensor/redistribute/detail/planner_search.h"

#include <algorithm>
#include <limits>
#include <queue>

#include "dtensor/core/error.h"
#include "dtensor/core/reduction_bytes.h"

namespace dtensor::planner {

Search::Search(Problem& problem, const CompactLayout& src, const CompactLayout& dst) : problem_(problem) {
  states_.reserve(64);
  intern(src);
  goal_ = intern(dst);
  limit_ = std::max(states_[0].max_numel, states_[goal_].max_numel);
  goal_needs_.assign(problem_.ranks, 1);
  for (int r = 0; r < problem_.ranks; ++r)
    if (holds_zeros(dst, [&](int m) { return problem_.coord(r, m); })) goal_needs_[r] = 0;
  bounded_ = true;
  for (State& s : states_) fill_bound(s);
}

int Search::intern(const CompactLayout& p) {
  std::uint64_t key = state_key(p);
  auto [it, inserted] = index_.try_emplace(key, static_cast<int>(states_.size()));
  if (!inserted) return it->second;
  State s;
  s.layout = p;
  for (int m = 0; m < problem_.mesh_ndim; ++m) s.partial = s.partial || p[m].kind == kPar;
  fill_boxes(s);
  if (bounded_) fill_bound(s);
  states_.push_back(std::move(s));
  return it->second;
}

void Search::fill_boxes(State& s) const {
  fill_rank_boxes(s, s.layout, problem_.global, problem_.ranks, problem_.mesh_shape,
                  [&](int r, int m) { return problem_.coord(r, m); });
}

void Search::fill_leaders(State& s) const {
  if (!s.leader.empty()) return;
  dtensor::fill_leaders(s, problem_.ranks, problem_.tensor_ndim, s.leader, s.leaders);
  // Buckets by leader, so that the exchange looks through each box's
  // holders only, not through every rank for every box.
  const std::size_t L = s.leaders.size();
  std::vector<int> index(problem_.ranks, -1);
  for (std::size_t i = 0; i < L; ++i) index[s.leaders[i]] = static_cast<int>(i);
  s.holder_start.assign(L + 1, 0);
  for (int r = 0; r < problem_.ranks; ++r)
    if (s.leader[r] >= 0) ++s.holder_start[index[s.leader[r]] + 1];
  for (std::size_t i = 0; i < L; ++i) s.holder_start[i + 1] += s.holder_start[i];
  s.holders.resize(s.holder_start[L]);
  std::vector<int> next(s.holder_start.begin(), s.holder_start.end() - 1);
  for (int r = 0; r < problem_.ranks; ++r)
    if (s.leader[r] >= 0) s.holders[next[index[s.leader[r]]]++] = r;
}

bool Search::better(const Cost& a, const Cost& b) const {
  if (problem_.bytes_first) {
    if (a.bytes != b.bytes) return a.bytes < b.bytes;
    return a.time < b.time;
  }
  if (a.time != b.time) return a.time < b.time;
  return a.bytes < b.bytes;
}

double local_step_seconds(std::int64_t max_numel, std::int64_t itemsize, const CostModel& cost) {
  return static_cast<double>(checked_mul(max_numel, itemsize, "bytes of a local step")) / cost.local_copy_Bps;
}

std::int64_t collective_recv_bytes(StepKind kind, std::int64_t n, std::int64_t group_index, const RankBoxes& S,
                                   const RankBoxes& T, int r, int nd, DType dtype, ReduceOp op) {
  const auto isz = static_cast<std::int64_t>(itemsize(dtype));
  switch (kind) {
    case StepKind::AllGather: return checked_mul(T.numel[r] - S.numel[r], isz, "bytes of an all_gather step");
    case StepKind::AllReduce: return all_reduce_recv_bytes(S.numel[r], n, group_index, dtype, op);
    case StepKind::ReduceScatter: return reduce_scatter_recv_bytes(T.numel[r], n, dtype, op);
    case StepKind::AllToAll:
      return checked_mul(T.numel[r] - inter_numel(S, r, T, r, nd), isz, "bytes of an all_to_all step");
    default: return 0;
  }
}

Eval collective_step(StepKind kind, std::span<const int> dims, std::int64_t n, std::int64_t max_bytes,
                     const CostModel& cost) {
  // An all_reduce is a reduce-scatter and an all-gather: twice the hops.
  const std::int64_t hops = kind == StepKind::AllReduce ? 2 * (n - 1) : n - 1;
  return Eval{max_bytes, cost.collective_seconds(dims, hops, max_bytes)};
}

double exchange_seconds(const CostModel& cost, int max_peers, double max_lat, double max_bw_time) {
  return cost.base_latency_s + max_peers * max_lat + max_bw_time;
}

Eval Search::eval(int from, int to, const Edge& e, std::vector<std::int64_t>& bytes) {
  const State& S = states_[from];
  const State& T = states_[to];
  const int ranks = problem_.ranks;
  const std::int64_t isz = problem_.itemsize;
  bytes.assign(ranks, 0);
  switch (e.kind) {
    case StepKind::Slice: return Eval{0, local_step_seconds(T.max_numel, isz, *problem_.cost)};
    case StepKind::ZeroFill: return Eval{0, local_step_seconds(S.max_numel, isz, *problem_.cost)};
    case StepKind::Relabel: return Eval{};
    case StepKind::Exchange: return exchange(from, bytes, nullptr);
    default: break;
  }
  std::int64_t n = 1;
  auto& dims = problem_.full_dims_scratch;
  dims.clear();
  for (int i = 0; i < e.group_ndim; ++i) {
    n = checked_mul(n, problem_.mesh_shape[e.group_dims[i]], "ranks of a group");
    dims.push_back(problem_.full_dim[e.group_dims[i]]);
  }
  // A reduction's op is its group's Partial's (one layout holds one kind).
  const ReduceOp op = S.layout[e.group_dims[0]].kind == kPar ? S.layout[e.group_dims[0]].op : ReduceOp::Sum;
  for (int r = 0; r < ranks; ++r) {
    std::int64_t gr = 0;  // r's index in its group: mixed radix, first group dim most significant
    for (int i = 0; i < e.group_ndim; ++i)
      gr = gr * problem_.mesh_shape[e.group_dims[i]] + problem_.coord(r, e.group_dims[i]);
    bytes[r] = collective_recv_bytes(e.kind, n, gr, S, T, r, problem_.tensor_ndim, problem_.dtype, op);
  }
  return collective_step(e.kind, dims, n, *std::max_element(bytes.begin(), bytes.end()), *problem_.cost);
}

// The holder of leader li's box that sends to rank r: the replica reached
// over the fastest link (sharing r's coordinates on slow dims), then the
// least loaded so far, then the lowest rank.
int Search::best_holder(const State& S, std::size_t li, int r, const std::vector<std::int64_t>& sent) const {
  int best = -1;
  for (int j = S.holder_start[li]; j < S.holder_start[li + 1]; ++j) {
    const int h = S.holders[j];
    if (best < 0) {
      best = h;
      continue;
    }
    const LinkParams& lh = problem_.link(h, r);
    const LinkParams& lb = problem_.link(best, r);
    if (lh.bandwidth_Bps != lb.bandwidth_Bps) {
      if (lh.bandwidth_Bps > lb.bandwidth_Bps) best = h;
      continue;
    }
    if (lh.hop_latency_s != lb.hop_latency_s) {
      if (lh.hop_latency_s < lb.hop_latency_s) best = h;
      continue;
    }
    if (sent[h] < sent[best]) best = h;
  }
  return best;
}

Eval Search::exchange(int from, std::vector<std::int64_t>& bytes, std::vector<ExchangeBlock>* blocks) {
  fill_leaders(states_[from]);
  const State& S = states_[from];
  const State& T = states_[goal_];
  const int ranks = problem_.ranks, tensor_ndim = problem_.tensor_ndim;
  const std::int64_t isz = problem_.itemsize;
  bytes.assign(ranks, 0);
  std::vector<std::int64_t> sent(ranks, 0);
  double max_lat = 0, max_bw_time = 0;
  int max_peers = 0;
  bool remote = false;
  auto make_box = [&](int a, int b) {
    Box box{Shape(tensor_ndim), Shape(tensor_ndim)};
    const std::size_t ia = static_cast<std::size_t>(a) * tensor_ndim, ib = static_cast<std::size_t>(b) * tensor_ndim;
    for (int d = 0; d < tensor_ndim; ++d) {
      std::int64_t lo = std::max(S.off[ia + d], T.off[ib + d]);
      std::int64_t hi = std::min(S.off[ia + d] + S.sz[ia + d], T.off[ib + d] + T.sz[ib + d]);
      box.offset[d] = lo;
      box.size[d] = hi - lo;
    }
    return box;
  };
  for (int r = 0; r < ranks; ++r) {
    if (!needs(r) || T.numel[r] == 0) continue;
    const int own = S.leader[r];
    int peers = 0;
    double bw_time = 0;
    for (std::size_t li = 0; li < S.leaders.size(); ++li) {
      const int l = S.leaders[li];
      std::int64_t n = inter_numel(S, l, T, r, tensor_ndim);
      if (n == 0) continue;
      if (l == own) {
        if (blocks) blocks->push_back(ExchangeBlock{r, r, make_box(l, r)});
        continue;
      }
      const int best = best_holder(S, li, r, sent);
      const std::int64_t b = checked_mul(n, isz, "bytes of an exchange block");
      const LinkParams& link = problem_.link(best, r);
      sent[best] = checked_add(sent[best], b, "bytes an exchange sends from one rank");
      bytes[r] = checked_add(bytes[r], b, "bytes an exchange sends to one rank");
      bw_time += static_cast<double>(b) / link.bandwidth_Bps;
      max_lat = std::max(max_lat, link.hop_latency_s);
      ++peers;
      remote = true;
      if (blocks) blocks->push_back(ExchangeBlock{best, r, make_box(l, r)});
    }
    max_peers = std::max(max_peers, peers);
    max_bw_time = std::max(max_bw_time, bw_time);
  }
  if (blocks)
    std::sort(blocks->begin(), blocks->end(), [](const ExchangeBlock& a, const ExchangeBlock& b) {
      if (a.dst_rank != b.dst_rank) return a.dst_rank < b.dst_rank;
      if (a.src_rank != b.src_rank) return a.src_rank < b.src_rank;
      return a.box.offset < b.box.offset;
    });
  Eval out;
  out.max_bytes = *std::max_element(bytes.begin(), bytes.end());
  if (!remote)  // every rank already holds what it needs: local copies only
    out.time = local_step_seconds(T.max_numel, isz, *problem_.cost);
  else
    out.time = exchange_seconds(*problem_.cost, max_peers, max_lat, max_bw_time);
  return out;
}

std::vector<StepKind> Search::path_kinds(int s, int label) const {
  std::vector<StepKind> kinds;
  if (label >= 0) {
    for (int l = label; labels_[l].parent >= 0; l = labels_[l].parent) kinds.push_back(labels_[l].edge.kind);
    std::reverse(kinds.begin(), kinds.end());
    return kinds;
  }
  while (s != 0 && pred_[s].first >= 0) {
    kinds.push_back(pred_[s].second.kind);
    s = pred_[s].first;
  }
  std::reverse(kinds.begin(), kinds.end());
  return kinds;
}

Cost Search::keyed(const Cost& c, int s) const {
  const State& S = states_[s];
  return Cost{checked_add(c.bytes, S.rest_max, "bytes of a plan"), c.time + S.rest_time};
}

namespace {

constexpr Cost kUnreached{std::numeric_limits<std::int64_t>::max(), std::numeric_limits<double>::infinity()};

}  // namespace

// A*: states leave the queue by cost so far plus their bound, which is
// consistent (planner_bound.cpp), so a state's cost is final when it
// leaves, as in Dijkstra's search (the bound off). Once the goal leaves,
// the search goes on a little for the runner-up (runner_up_may_win).
std::vector<Search::Link> Search::run() {
  expanded_count_ = 0;
  if (problem_.exact_busiest) return run_exact();
  dist_.assign(states_.size(), kUnreached);
  pred_.assign(states_.size(), {-1, Edge{}});
  done_.assign(states_.size(), 0);
  runner_ = RunnerUp{};
  dist_[0] = Cost{};
  open_ = Queue(Later{this});
  open_.push({keyed(Cost{}, 0), 0});
  while (!open_.empty()) {
    const Queued top = open_.top();
    open_.pop();
    const int u = top.id;
    if (done_[u]) continue;
    if (runner_.goal_done && !runner_up_may_win(top.key)) break;
    done_[u] = 1;
    if (!runner_.goal_done) ++expanded_count_;
    if (u == goal_) {
      runner_.goal_done = true;
      runner_.budget = std::max<std::size_t>(16, expanded_count_);
      continue;
    }
    expand(u);
    if (!states_[u].partial) relax_exchange_if_useful(u);
  }
  if (pred_[goal_].first < 0) throw LayoutError("[redistribute] internal: no plan reaches the target layout");
  found_ = dist_[goal_];
  std::vector<Link> chain;
  for (int s = goal_; s != 0; s = pred_[s].first) chain.push_back(Link{pred_[s].first, s, pred_[s].second});
  std::reverse(chain.begin(), chain.end());
  return chain;
}

// The runner-up is the one the plan's reason names: the best complete plan
// whose last step differs from the chosen one's. The search looks for it
// until no state left in the queue could lead to a cheaper one, within a
// budget of expansions; nothing it finds changes the chosen plan.
bool Search::runner_up_may_win(const Cost& key) {
  for (; runner_.seen < cands_.size(); ++runner_.seen) {
    const Candidate& c = cands_[runner_.seen];
    const bool chosen = c.pred == pred_[goal_].first && c.last == pred_[goal_].second.kind;
    if (!chosen && better(c.cost, runner_.cost)) runner_.cost = c.cost;
  }
  return better(key, runner_.cost) && runner_.budget-- != 0;
}

// run(): every step out of u, each target reached more cheaply than before
// queued again.
void Search::expand(int u) {
  out_edges_.clear();
  edges(u, out_edges_);
  for (const auto& [e, target] : out_edges_) {
    const int t = intern(target);
    if (dist_.size() < states_.size()) {  // new states were interned
      dist_.resize(states_.size(), kUnreached);
      pred_.resize(states_.size(), {-1, Edge{}});
      done_.resize(states_.size(), 0);
    }
    if (t == u || (done_[t] && t != goal_)) continue;
    if (t != goal_ && states_[t].max_numel > limit_) continue;  // memory bound
    relax(u, t, e, eval(u, t, e, step_bytes_));
  }
}

// run(): the path to u extended by one step to t, kept where it beats t's
// best path so far; a step to the goal is also a candidate plan.
void Search::relax(int u, int t, const Edge& e, const Eval& ev) {
  const Cost c{checked_add(dist_[u].bytes, ev.max_bytes, "bytes of a plan"), dist_[u].time + ev.time};
  if (t == goal_) {
    cands_.push_back(Candidate{c, u, e.kind});
    if (e.kind != StepKind::Exchange) ++considered_;
  }
  if (better(c, dist_[t])) {
    dist_[t] = c;
    pred_[t] = {u, e};
    open_.push({keyed(c, t), t});
  }
}

// run(): the direct exchange from u to the goal. The holders are the costly
// part of pricing one: it is skipped when even a lower bound on its cost (its
// exact bytes, at the fastest bandwidth with no latency) cannot beat the
// best plan found so far (or, after the goal, the runner-up so far).
void Search::relax_exchange_if_useful(int u) {
  const State& S = states_[u];
  const State& T = states_[goal_];
  std::int64_t most = 0;
  for (int r = 0; r < problem_.ranks; ++r)
    if (needs(r)) most = std::max(most, T.numel[r] - inter_numel(S, r, T, r, problem_.tensor_ndim));
  most = checked_mul(most, problem_.itemsize, "bytes a rank lacks");
  const Cost bound{checked_add(dist_[u].bytes, most, "bytes of a plan"),
                   dist_[u].time + static_cast<double>(most) / problem_.max_bw};
  ++considered_;
  // After the goal, exchanges are priced only to beat a runner-up already
  // found: pricing one from every state left would cost more than the
  // search (the exchange from the source was priced before).
  const bool worth = runner_.goal_done ? runner_.cost.bytes != kUnreached.bytes && better(bound, runner_.cost)
                                       : better(bound, dist_[goal_]);
  if (worth) relax(u, goal_, edge_of(StepKind::Exchange), exchange(u, step_bytes_, nullptr));
}

// The busiest rank's total over a plan can be well below the sum of its
// steps' busiest ranks when steps load different ranks (uneven or empty
// shards), so for a Partial source, where no single step reaches a known
// bound, paths are labels carrying every rank's total. A state keeps the
// labels no other label there beats on every rank and on time; both parts of
// the key (busiest total plus the bound, time plus the bound) only grow
// along a path, so the first label of the goal taken from the queue is the
// best plan over these edges.
std::vector<Search::Link> Search::run_exact() {
  labels_.assign(1, Label{0, -1, Edge{}, Cost{}, keyed(Cost{}, 0), std::vector<std::int64_t>(problem_.ranks, 0), 0});
  dead_.assign(1, 0);
  live_.assign(states_.size(), {});
  live_[0].push_back(0);
  outs_.assign(states_.size(), {});
  expanded_.assign(states_.size(), 0);
  exchanged_.assign(states_.size(), 0);
  best_goal_ = Cost{std::numeric_limits<std::int64_t>::max(), std::numeric_limits<double>::infinity()};
  Queue pq(Later{this});
  pq.push({labels_[0].key, 0});
  int found = -1;
  while (!pq.empty()) {
    const int label = pq.top().id;
    pq.pop();
    if (dead_[label]) continue;
    ++expanded_count_;
    const int u = labels_[label].state;
    if (u == goal_) {
      found = label;
      break;
    }
    expand_exact(u);
    price_exchange_if_useful(label);
    for (std::size_t i = 0; i < outs_[u].size(); ++i)
      if (const int id = offer(label, outs_[u][i]); id >= 0) pq.push({labels_[id].key, id});
  }
  if (found < 0) throw LayoutError("[redistribute] internal: no plan reaches the target layout");
  found_ = labels_[found].cost;
  std::vector<Link> chain;
  for (int l = found; labels_[l].parent >= 0; l = labels_[l].parent)
    chain.push_back(Link{labels_[labels_[l].parent].state, labels_[l].state, labels_[l].edge});
  std::reverse(chain.begin(), chain.end());
  return chain;
}

void Search::expand_exact(int u) {
  if (expanded_[u]) return;
  expanded_[u] = 1;
  EdgeList out_edges;
  edges(u, out_edges);
  std::vector<Out> list;
  std::vector<std::int64_t> bytes;
  for (const auto& [e, tp] : out_edges) {
    const int t = intern(tp);
    if (t == u || (t != goal_ && states_[t].max_numel > limit_)) continue;  // memory bound
    const Eval ev = eval(u, t, e, bytes);
    list.push_back(Out{t, e, ev, bytes});
  }
  // New states were interned: every per-state table grows with them.
  outs_.resize(states_.size());
  live_.resize(states_.size());
  expanded_.resize(states_.size(), 0);
  exchanged_.resize(states_.size(), 0);
  outs_[u] = std::move(list);
}

void Search::price_exchange_if_useful(int label) {
  const Label& f = labels_[label];
  const int u = f.state;
  if (states_[u].partial || exchanged_[u]) return;
  // As in run(): price the exchange only once a label here could beat the
  // best plan found so far with it (the exchange's exact bytes added to the
  // label's, its time at the fastest link with no latency); a later label
  // here may do better than this one on the ranks the exchange loads.
  const State& S = states_[u];
  const State& T = states_[goal_];
  std::int64_t busiest = 0, most = 0;
  for (int r = 0; r < problem_.ranks; ++r) {
    const std::int64_t b = needs(r) ? checked_mul(T.numel[r] - inter_numel(S, r, T, r, problem_.tensor_ndim),
                                                  problem_.itemsize, "bytes a rank lacks")
                                    : 0;
    busiest = std::max(busiest, checked_add(f.total[r], b, "bytes a rank receives in a plan"));
    most = std::max(most, b);
  }
  ++considered_;
  if (!better(Cost{busiest, f.cost.time + static_cast<double>(most) / problem_.max_bw}, best_goal_)) return;
  exchanged_[u] = 1;
  std::vector<std::int64_t> bytes;
  const Eval ev = exchange(u, bytes, nullptr);
  outs_[u].push_back(Out{goal_, edge_of(StepKind::Exchange), ev, std::move(bytes)});
}

int Search::offer(int from_label, const Out& o) {
  const int ranks = problem_.ranks;
  const Label& from = labels_[from_label];
  const State& to = states_[o.to];
  Label next{o.to, from_label, o.edge, Cost{0, from.cost.time + o.ev.time}, Cost{}, from.total, 0};
  for (int r = 0; r < ranks; ++r) {
    next.total[r] = checked_add(next.total[r], o.bytes[r], "bytes a rank receives in a plan");
    next.cost.bytes = std::max(next.cost.bytes, next.total[r]);
    next.key.bytes = std::max(next.key.bytes, next.total[r] + to.rest[r]);
    next.sum = checked_add(next.sum, next.total[r], "bytes all ranks receive in a plan");
  }
  next.key.time = next.cost.time + to.rest_time;
  if (o.to == goal_) {
    cands_.push_back(Candidate{next.cost, from.state, o.edge.kind, from_label});
    if (o.edge.kind != StepKind::Exchange) ++considered_;
  }
  // No plan through this label costs less than its key: one that does not
  // beat a plan found already cannot lead to a better one.
  if (!better(next.key, best_goal_)) return -1;
  if (o.to == goal_) best_goal_ = next.cost;
  // Whether a is nowhere worse than b (the totals' maximum and sum first:
  // they rule out most pairs).
  auto covers = [ranks](const Label& a, const Label& b) {
    if (a.cost.time > b.cost.time || a.cost.bytes > b.cost.bytes || a.sum > b.sum) return false;
    for (int r = 0; r < ranks; ++r)
      if (a.total[r] > b.total[r]) return false;
    return true;
  };
  std::vector<int>& here = live_[o.to];
  for (int l : here)
    if (covers(labels_[l], next)) return -1;
  std::erase_if(here, [&](int l) {
    if (!covers(next, labels_[l])) return false;
    dead_[l] = 1;
    return true;
  });
  const int id = static_cast<int>(labels_.size());
  labels_.push_back(std::move(next));
  dead_.push_back(0);
  here.push_back(id);
  return id;
}

}  // namespace dtensor::planner
