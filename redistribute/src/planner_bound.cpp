// The search's lower bound (A*): for each state, what every path from it to
// the goal costs at least, in bytes per rank and in time.
//
// Per rank r that needs data in the goal (T_r its goal box, S_r its box in
// the state), the bytes r must still receive:
//   |T_r|          while some mesh dim is Partial where the goal is not
//                  Partial with the same op (it must still be reduced);
//   |T_r \ S_r|    otherwise.
// The bound is consistent, edge by edge (c_r: what r receives in the step,
// V_r: its box after it): a gather, all_to_all or exchange brings exactly
// the elements r's box gains or more, since the elements r lacks after the
// step were lacked before or are new, and an exchange draws them from boxes
// that cover the tensor; slices and reductions only shrink or keep boxes,
// and zero fills and relabels keep them; a reduction that removes the last
// Partial still owed receives at least |V_r| >= |T_r and V_r| (an
// all_reduce over n >= 2 ranks receives count + (n-2)*segment, a
// reduce_scatter (n-1)*|V_r|; an int64 Avg twice that, core/reduction_bytes.h),
// which pays for what the first line counted beyond the second. So for every step, bound_r(before) <= c_r +
// bound_r(after), per rank (run_exact adds it to each rank's total) and for
// the busiest rank (run adds the largest).
//
// Time: a Partial still owed needs a reduction over a group holding one of
// its mesh dims q (at least the base latency and n_q - 1 hops of q's
// link), a rank lacking data needs a gather, all_to_all or exchange (at
// least the base latency), no step does both, and every step takes at
// least its busiest rank's bytes at the fastest link. The sum is shaved by
// a relative 1e-9 so that rounding never lifts it above a true cost.
#include <algorithm>
#include <limits>

#include "dtensor/redistribute/detail/planner_search.h"
#include "objective.h"

namespace dtensor::planner {

void Search::fill_bound(State& s) const {
  const int ranks = problem_.ranks;
  s.rest.assign(ranks, 0);
  s.rest_max = 0;
  s.rest_time = 0;
  if (!problem_.lower_bound) return;
  const State& T = states_[goal_];
  const CostModel& cost = *problem_.cost;
  bool owed = false;
  double reduce_latency = std::numeric_limits<double>::infinity();
  for (int m = 0; m < problem_.mesh_ndim; ++m) {
    const CompactPlacement& p = s.layout[m];
    if (p.kind != kPar || (T.layout[m].kind == kPar && T.layout[m].op == p.op)) continue;
    owed = true;
    reduce_latency = std::min(reduce_latency, static_cast<double>(problem_.mesh_shape[m] - 1) *
                                                  cost.link(problem_.full_dim[m]).hop_latency_s);
  }
  bool lacks = false;
  for (int r = 0; r < ranks; ++r) {
    if (!needs(r)) continue;
    const std::int64_t lack = T.numel[r] - inter_numel(s, r, T, r, problem_.tensor_ndim);
    lacks = lacks || lack > 0;
    s.rest[r] = checked_mul(owed ? T.numel[r] : lack, problem_.itemsize, "bytes a rank must still receive");
    s.rest_max = std::max(s.rest_max, s.rest[r]);
  }
  double t = 0;
  if (owed) t += cost.base_latency_s + reduce_latency;
  if (lacks) t += cost.base_latency_s;
  if (problem_.max_bw > 0) t += static_cast<double>(s.rest_max) / problem_.max_bw;
  s.rest_time = t * (1 - kRoundingSlack);
}

}  // namespace dtensor::planner
