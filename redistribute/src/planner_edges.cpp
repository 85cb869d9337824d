// The search's transitions: every step out of a state, one function per
// kind of collective or local step, each target normalised. Which steps
// exist here decides which plans the planner can find; what each costs is
// Search::eval's.
#include "dtensor/redistribute/detail/planner_search.h"

namespace dtensor::planner {

namespace {

void emit(Search::EdgeList& out, const Edge& e, CompactLayout t) {
  normalize(t);
  out.emplace_back(e, t);
}

}  // namespace

void Search::edges(int si, EdgeList& out) const {
  const CompactLayout p = states_[si].layout;
  gather_edges(p, out);
  reduce_edges(p, out);
  all_to_all_edges(p, out);
  local_edges(p, out);
}

// AllGather S(d) -> R on the innermost splits of d, outer to inner.
void Search::gather_edges(const CompactLayout& p, EdgeList& out) const {
  const int mesh_ndim = problem_.mesh_ndim, tensor_ndim = problem_.tensor_ndim;
  for (int d = 0; d < tensor_ndim; ++d) {
    std::array<int, kMaxMeshDims> order{};
    int L = 0;
    for (int lv = 0; lv < mesh_ndim; ++lv)
      for (int m = 0; m < mesh_ndim; ++m)
        if (p[m].kind == kShard && p[m].dim == d && p[m].level == lv) order[L++] = m;
    for (int len = 1; len <= L; ++len) {
      Edge e = edge_of(StepKind::AllGather);
      e.tensor_dim = d;
      CompactLayout t = p;
      for (int i = L - len; i < L; ++i) {
        e.group_dims[e.group_ndim++] = static_cast<std::int8_t>(order[i]);
        t[order[i]] = CompactPlacement{};
      }
      emit(out, e, t);
    }
  }
}

// Partial mesh dims: AllReduce on any subset, ReduceScatter on any ordered subset.
void Search::reduce_edges(const CompactLayout& p, EdgeList& out) const {
  const int mesh_ndim = problem_.mesh_ndim, tensor_ndim = problem_.tensor_ndim;
  std::array<int, kMaxMeshDims> q{};
  int nq = 0;
  for (int m = 0; m < mesh_ndim; ++m)
    if (p[m].kind == kPar) q[nq++] = m;
  if (nq == 0) return;
  // The only group mask allowed, or -1 for any. An integer Avg reduces every
  // Partial dim in one step, even those the target keeps as P(avg): a mean
  // of some dims' truncated means is not the truncated mean (trunc((trunc(3 /
  // 2) + trunc(1 / 2)) / 2) = 0, trunc(4 / 4) = 1), and the kept dims come
  // back exactly by relabelling the replicated mean.
  int must = -1;
  if (problem_.avg_in_one_step && p[q[0]].op == ReduceOp::Avg) must = (1 << nq) - 1;
  for (int mask = 1; mask < (1 << nq); ++mask) {
    if (must >= 0 && mask != must) continue;
    Edge e = edge_of(StepKind::AllReduce);
    CompactLayout t = p;
    for (int i = 0; i < nq; ++i)
      if (mask & (1 << i)) {
        e.group_dims[e.group_ndim++] = static_cast<std::int8_t>(q[i]);
        t[q[i]] = CompactPlacement{};
      }
    emit(out, e, t);
  }
  // Every ordered sequence of distinct partial dims, by depth-first search.
  std::array<int, kMaxMeshDims> seq{};
  auto dfs = [&](auto&& self, int len, int used) -> void {
    if (len > 0 && (must < 0 || used == must)) {
      for (int d = 0; d < tensor_ndim; ++d) {
        Edge e = edge_of(StepKind::ReduceScatter);
        e.tensor_dim = d;
        CompactLayout t = p;
        for (int i = 0; i < len; ++i) {
          e.group_dims[e.group_ndim++] = static_cast<std::int8_t>(seq[i]);
          t[seq[i]] = CompactPlacement{kShard, ReduceOp::Sum, d, kInnermost + i};
        }
        emit(out, e, t);
      }
    }
    for (int i = 0; i < nq; ++i)
      if (!(used & (1 << i))) {
        seq[len] = q[i];
        self(self, len + 1, used | (1 << i));
      }
  };
  dfs(dfs, 0, 0);
}

// AllToAll: the innermost split of i moves to j (as j's innermost split).
void Search::all_to_all_edges(const CompactLayout& p, EdgeList& out) const {
  const int mesh_ndim = problem_.mesh_ndim, tensor_ndim = problem_.tensor_ndim;
  for (int m = 0; m < mesh_ndim; ++m) {
    if (p[m].kind != kShard) continue;
    bool innermost = true;
    for (int o = 0; o < mesh_ndim; ++o)
      if (p[o].kind == kShard && p[o].dim == p[m].dim && p[o].level > p[m].level) innermost = false;
    if (!innermost) continue;
    for (int j = 0; j < tensor_ndim; ++j) {
      if (j == p[m].dim) continue;
      Edge e = edge_of(StepKind::AllToAll);
      e.group_dims[e.group_ndim++] = static_cast<std::int8_t>(m);
      e.tensor_dim = j;
      e.src_dim = p[m].dim;
      CompactLayout t = p;
      t[m] = CompactPlacement{kShard, ReduceOp::Sum, j, kInnermost};
      emit(out, e, t);
    }
  }
}

// Local steps on replicated mesh dims: a slice, or the target's Partial.
void Search::local_edges(const CompactLayout& p, EdgeList& out) const {
  const int mesh_ndim = problem_.mesh_ndim, tensor_ndim = problem_.tensor_ndim;
  const CompactLayout& dst = states_[goal_].layout;
  bool target_partial = false;
  ReduceOp top = ReduceOp::Sum;
  for (int m = 0; m < mesh_ndim; ++m)
    if (dst[m].kind == kPar) {
      target_partial = true;
      top = dst[m].op;
    }
  bool op_ok = true;  // no Partial of another op in this state
  for (int m = 0; m < mesh_ndim; ++m)
    if (p[m].kind == kPar && (!target_partial || p[m].op != top)) op_ok = false;
  for (int m = 0; m < mesh_ndim; ++m) {
    if (p[m].kind != kRep) continue;
    for (int d = 0; d < tensor_ndim; ++d) {
      Edge e = edge_of(StepKind::Slice);
      e.group_dims[e.group_ndim++] = static_cast<std::int8_t>(m);
      e.tensor_dim = d;
      CompactLayout t = p;
      t[m] = CompactPlacement{kShard, ReduceOp::Sum, d, kInnermost};
      emit(out, e, t);
    }
    // Only the target's Partial op is worth creating.
    if (target_partial && op_ok) {
      Edge e = edge_of(top == ReduceOp::Sum ? StepKind::ZeroFill : StepKind::Relabel);
      e.group_dims[e.group_ndim++] = static_cast<std::int8_t>(m);
      CompactLayout t = p;
      t[m] = CompactPlacement{kPar, top, -1, -1};
      emit(out, e, t);
    }
  }
}

}  // namespace dtensor::planner
