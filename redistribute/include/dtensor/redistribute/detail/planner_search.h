#pragma once
// Internal to the planner: compact layouts over the mesh dims of size > 1,
// their per-rank boxes, the edges between them and the Dijkstra search.
#include <array>
#include <cstdint>
#include <limits>
#include <queue>
#include <span>
#include <utility>
#include <unordered_map>
#include <vector>

#include "dtensor/redistribute/detail/compact_layout.h"
#include "dtensor/core/reduce_op.h"
#include "dtensor/core/shape.h"
#include "dtensor/redistribute/cost_model.h"
#include "dtensor/redistribute/plan.h"
#include "dtensor/redistribute/planner.h"

namespace dtensor::planner {

// The search runs on compact layouts (dtensor/redistribute/detail/compact_layout.h);
// kRep, kPar and kShard name their placements' kinds.
using enum CompactPlacement::Kind;

/// The request reduced to the mesh dims of size > 1 (size-1 dims never split,
/// so ranks are numbered the same in the full and the reduced mesh).
struct Problem {
  int mesh_ndim = 0;                                    // of the reduced mesh
  std::array<int, kMaxMeshDims> full_dim{};             // reduced -> full mesh dim
  std::array<std::int64_t, kMaxMeshDims> mesh_shape{};  // of the reduced mesh
  int tensor_ndim = 0;
  Shape global;
  int ranks = 1;
  std::vector<std::int64_t> coords;  // ranks * mesh_ndim: rank r's coordinates at [r * mesh_ndim]
  DType dtype = DType::Float32;
  std::int64_t itemsize = 4;
  const CostModel* cost = nullptr;
  // Integer Avg: divisions in stages truncate differently from one division,
  // so a reduction covers every Partial dim at once (reduce_edges).
  bool avg_in_one_step = false;
  // Objective: (bytes, time), or (time, bytes) for a Partial source where
  // latency decides (see bandwidth_dominates in objective.h).
  bool bytes_first = true;
  // Bytes are the busiest rank's exact total over the plan rather than the
  // sum of each step's busiest rank (see Search::run_exact).
  bool exact_busiest = false;
  // Exchange links: a pair's link depends only on the reduced mesh dims the
  // two ranks differ on (the slowest link among them), so one entry per
  // subset of them, not per pair (ranks^2 of them would not fit for large meshes).
  std::array<LinkParams, 1 << kMaxMeshDims> link_by_mask{};
  double max_bw = 0;  // the fastest link between two distinct ranks
  std::vector<int> full_dims_scratch;
  // Whether the search is guided by Search::bound (A*); off only to compare
  // against the plain search, which must find plans of the same cost.
  bool lower_bound = true;

  /// Rank r's coordinate on reduced mesh dim m.
  std::int64_t coord(int r, int m) const { return coords[static_cast<std::size_t>(r) * mesh_ndim + m]; }
  const LinkParams& link(int a, int b) const {
    int mask = 0;
    for (int i = 0; i < mesh_ndim; ++i)
      if (coord(a, i) != coord(b, i)) mask |= 1 << i;
    return link_by_mask[static_cast<std::size_t>(mask)];
  }
};

struct State : RankBoxes {
  CompactLayout layout{};
  bool partial = false;
  // Exchange sources, computed on first use: per rank the first rank holding
  // the same non-empty box (-1 for an empty box), and the leaders in order.
  std::vector<int> leader;
  std::vector<int> leaders;
  // The ranks holding each leader's box, ascending: leaders[i]'s are
  // holders[holder_start[i] .. holder_start[i + 1]).
  std::vector<int> holder_start, holders;
  // The lower bound from here to the goal (Search::bound): per rank the
  // bytes it must still receive, their largest, and a time.
  std::vector<std::int64_t> rest;
  std::int64_t rest_max = 0;
  double rest_time = 0;
};

/// One step of the search, in the reduced mesh's terms (PlanStep's fields
/// once lifted to the full mesh).
struct Edge {
  StepKind kind = StepKind::Relabel;
  std::int8_t group_ndim = 0;                          // group_dims in use
  std::array<std::int8_t, kMaxMeshDims> group_dims{};  // reduced mesh dims, group order
  std::int32_t tensor_dim = -1;                        // gathered / scattered / new shard dim
  std::int32_t src_dim = -1;                           // AllToAll: the old shard dim
};

inline Edge edge_of(StepKind kind) {
  Edge e;
  e.kind = kind;
  return e;
}

struct Cost {
  std::int64_t bytes = 0;
  double time = 0;
};

struct Eval {
  std::int64_t max_bytes = 0;
  double time = 0;
};

// The one-step cost, shared by the search's eval and the closed-form prices
// (price.cpp), so that a price equals the planner's estimate by construction.

/// Time of a local step (slice, zero fill, local copy) whose largest per-rank
/// output has `max_numel` elements.
double local_step_seconds(std::int64_t max_numel, std::int64_t itemsize, const CostModel& cost);
/// Bytes rank r receives in a collective step of `kind` (AllGather,
/// AllReduce, ReduceScatter, AllToAll) of `dtype` over a group of n ranks in
/// which r has index group_index, from boxes S to boxes T; a reduction of
/// `op` moves what core/reduction_bytes.h says (twice the elements for an
/// int64 Avg), the others the elements they move.
std::int64_t collective_recv_bytes(StepKind kind, std::int64_t n, std::int64_t group_index, const RankBoxes& S,
                                   const RankBoxes& T, int r, int nd, DType dtype, ReduceOp op);
/// A collective step of `kind` over the full mesh dims `dims` (n ranks a
/// group) whose busiest rank receives `max_bytes`.
Eval collective_step(StepKind kind, std::span<const int> dims, std::int64_t n, std::int64_t max_bytes,
                     const CostModel& cost);
/// A direct exchange: the base latency, `max_peers` hops of `max_lat`, and the
/// busiest receiver's bandwidth time.
double exchange_seconds(const CostModel& cost, int max_peers, double max_lat, double max_bw_time);

/// A candidate complete plan seen while relaxing the goal: its cost and the
/// state it came from with the last edge.
struct Candidate {
  Cost cost;
  int pred;
  StepKind last;
  int label = -1;  // run_exact: the label it extends
};

class Search {
 public:
  using EdgeList = std::vector<std::pair<Edge, CompactLayout>>;
  Search(Problem& problem, const CompactLayout& src, const CompactLayout& dst);

  /// Runs the search (A* where Problem::lower_bound, else Dijkstra);
  /// returns the chain of (from state, to state, edge).
  struct Link {
    int from;
    int to;
    Edge edge;
  };
  std::vector<Link> run();

  bool better(const Cost& a, const Cost& b) const;
  /// Per-rank bytes and time of one edge between two states.
  Eval eval(int from, int to, const Edge& e, std::vector<std::int64_t>& bytes);
  /// The direct exchange from `from` to the goal; blocks if asked.
  Eval exchange(int from, std::vector<std::int64_t>& bytes, std::vector<ExchangeBlock>* blocks);

  const State& state(int i) const { return states_[i]; }
  int source() const { return 0; }
  int goal() const { return goal_; }
  std::int64_t limit() const { return limit_; }
  const std::vector<Candidate>& candidates() const { return cands_; }
  /// The cost of the chain run() returned.
  const Cost& found() const { return found_; }
  /// A lower bound on the cost of every path from state s to the goal, for
  /// either objective (zero where Problem::lower_bound is off). See
  /// planner_bound.cpp for why it never exceeds the true cost.
  Cost bound(int s) const { return Cost{states_[s].rest_max, states_[s].rest_time}; }
  /// States (labels, in run_exact) taken from the queue and expanded.
  std::size_t expanded() const { return expanded_count_; }
  /// The step kinds of the best known path to a settled state, or of the
  /// path of a label of run_exact.
  std::vector<StepKind> path_kinds(int s, int label = -1) const;
  std::size_t num_states() const { return states_.size(); }
  /// Complete plans compared, counting those a lower bound ruled out.
  std::size_t considered() const { return considered_; }

 private:
  int intern(const CompactLayout& p);
  void fill_boxes(State& s) const;
  void fill_bound(State& s) const;
  void fill_leaders(State& s) const;
  bool needs(int r) const { return goal_needs_[r] != 0; }
  /// exchange(): which holder of leader li's box sends it to rank r, given
  /// the bytes each rank sends so far.
  int best_holder(const State& S, std::size_t li, int r, const std::vector<std::int64_t>& sent) const;
  /// Every edge out of state s (planner_edges.cpp), one function per
  /// transition case; each target is normalised.
  void edges(int s, EdgeList& out) const;
  void gather_edges(const CompactLayout& p, EdgeList& out) const;
  void reduce_edges(const CompactLayout& p, EdgeList& out) const;
  void all_to_all_edges(const CompactLayout& p, EdgeList& out) const;
  void local_edges(const CompactLayout& p, EdgeList& out) const;
  // run_exact and its parts: a state's steps priced once; the exchange
  // from it, once a lower bound says it could win; a path extended by a step
  // (the new label, or -1 where a label there is nowhere worse).
  struct Out {
    int to;
    Edge edge;
    Eval ev;
    std::vector<std::int64_t> bytes;
  };
  // The open list of both searches: ids by key (cost so far plus the
  // bound), best first.
  struct Queued {
    Cost key;
    int id;
  };
  struct Later {
    const Search* search;
    bool operator()(const Queued& a, const Queued& b) const { return search->better(b.key, a.key); }
  };
  using Queue = std::priority_queue<Queued, std::vector<Queued>, Later>;
  Cost keyed(const Cost& c, int s) const;
  // run's parts: after the goal, whether a state with this key could still
  // lead to a better runner-up; a state's steps; one path extended by one
  // step; the direct exchange from a state, once a lower bound says it
  // could win.
  bool runner_up_may_win(const Cost& key);
  void expand(int u);
  void relax(int u, int t, const Edge& e, const Eval& ev);
  void relax_exchange_if_useful(int u);
  std::vector<Link> run_exact();
  void expand_exact(int u);
  void price_exchange_if_useful(int label);
  int offer(int from_label, const Out& o);

  Problem& problem_;
  std::vector<State> states_;
  std::unordered_map<std::uint64_t, int> index_;
  int goal_ = 0;
  std::int64_t limit_ = 0;
  std::vector<char> goal_needs_;
  // run: per state the best known cost and the step it came by, whether it
  // left the queue; the queue; and scratch for a state's steps.
  std::vector<Cost> dist_;
  std::vector<std::pair<int, Edge>> pred_;
  std::vector<char> done_;
  Queue open_;
  EdgeList out_edges_;
  std::vector<std::int64_t> step_bytes_;
  // run, once the goal left the queue: the runner-up so far, the candidates
  // already compared with it, and the expansions left to find it.
  struct RunnerUp {
    bool goal_done = false;
    std::size_t budget = 0;
    Cost cost{std::numeric_limits<std::int64_t>::max(), std::numeric_limits<double>::infinity()};
    std::size_t seen = 0;
  };
  RunnerUp runner_;
  std::vector<Candidate> cands_;
  std::size_t considered_ = 0;
  std::size_t expanded_count_ = 0;
  bool bounded_ = false;  // the goal is known: new states get their bound
  Cost found_;
  // run_exact: a path's per-rank totals, its cost, and where it came from.
  struct Label {
    int state;
    int parent;
    Edge edge;
    Cost cost;  // bytes: the largest total
    Cost key;   // cost plus the state's bound: the queue's order
    std::vector<std::int64_t> total;
    std::int64_t sum;  // of the totals
  };
  std::vector<Label> labels_;
  std::vector<char> dead_;              // per label: beaten after it was queued
  std::vector<std::vector<int>> live_;  // per state: the labels nothing beats
  std::vector<std::vector<Out>> outs_;  // per state: its steps, priced
  std::vector<char> expanded_, exchanged_;
  Cost best_goal_;
};

/// The request reduced for the search (its layouts validated): the problem
/// with its objective chosen, and the two ends as compact layouts.
Problem make_problem(const PlanRequest& req, const Layout& from, const Layout& to, CompactLayout& src,
                     CompactLayout& dst);

}  // namespace dtensor::planner
