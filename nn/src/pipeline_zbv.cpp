// ZBV: two stages per rank in a V (rank r holds stages r and 2p-1-r), the
// backward split into I and W. The order comes from a greedy run at unit
// costs, as the ZB paper builds its schedules: whenever a rank is free it
// runs a ready I (the critical path), else a ready forward, else a deferred
// W, keeping at most 2p stage activations (1F1B's p full stages) per rank.
#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/nn/pipeline.h"

namespace dtensor::nn::pipeline {

namespace {

constexpr int kNever = -1;

struct GreedyState {
  int ranks, stages, microbatches;
  std::vector<std::vector<int>> forward_end, input_end;  // [stage][microbatch], kNever until done
  std::vector<int> next_forward, next_input;             // per stage, microbatches in order
  std::vector<std::vector<int>> weights_owed;            // per rank: stages whose W waits, in I's order
  std::vector<std::vector<int>> weights_owed_mb;
  std::vector<int> held, down_in_flight;  // per rank: activations held; chunk-0 forwards not yet back up

  GreedyState(int p, int m)
      : ranks(p),
        stages(2 * p),
        microbatches(m),
        forward_end(2 * p, std::vector<int>(m, kNever)),
        input_end(forward_end),
        next_forward(2 * p, 0),
        next_input(2 * p, 0),
        weights_owed(p),
        weights_owed_mb(p),
        held(p, 0),
        down_in_flight(p, 0) {}

  bool done_by(int end, int now) const { return end != kNever && end <= now; }

  bool input_ready(int stage, int now) const {
    const int mb = next_input[stage];
    if (mb >= microbatches || !done_by(forward_end[stage][mb], now)) return false;
    return stage + 1 == stages || done_by(input_end[stage + 1][mb], now);
  }

  bool forward_ready(int stage, int now) const {
    const int mb = next_forward[stage];
    return mb < microbatches && (stage == 0 || done_by(forward_end[stage - 1][mb], now));
  }
};

// The action rank `rank` runs at `now`, if any, with the state updated.
std::optional<Action> pick(GreedyState& g, int rank, int now) {
  const int down = rank, up = 2 * g.ranks - 1 - rank;  // the V's two stages on this rank
  const int capacity = 2 * g.ranks;
  for (int stage : {up, down})
    if (g.input_ready(stage, now)) {
      const int mb = g.next_input[stage]++;
      g.input_end[stage][mb] = now + 1;
      g.weights_owed[rank].push_back(stage);
      g.weights_owed_mb[rank].push_back(mb);
      return Action{stage, ActionKind::BackwardInput, mb};
    }
  // A forward on the way down must leave room for the forwards on the way
  // up of every microbatch already gone down (each comes back to this rank
  // before anything it holds can be freed); one on the way up always runs,
  // so the rank never fills with activations it cannot take further. (A
  // gate of two slots per forward down never exceeds 2p but loses time.)
  const bool up_fits = true;
  const bool down_fits = g.held[rank] + g.down_in_flight[rank] + 1 <= capacity;
  for (int stage : {up, down}) {
    if (!g.forward_ready(stage, now) || !(stage == up ? up_fits : down_fits)) continue;
    const int mb = g.next_forward[stage]++;
    g.forward_end[stage][mb] = now + 1;
    ++g.held[rank];
    g.down_in_flight[rank] += stage == down ? 1 : -1;
    return Action{stage, ActionKind::Forward, mb};
  }
  if (!g.weights_owed[rank].empty()) {
    Action w{g.weights_owed[rank].front(), ActionKind::BackwardWeight, g.weights_owed_mb[rank].front()};
    g.weights_owed[rank].erase(g.weights_owed[rank].begin());
    g.weights_owed_mb[rank].erase(g.weights_owed_mb[rank].begin());
    --g.held[rank];
    return w;
  }
  return std::nullopt;
}

}  // namespace

Schedule zbv(int ranks, int microbatches) {
  if (ranks < 2 || microbatches < 1)
    throw ValueError(
        fmt::format("[pipeline] zbv: {} ranks, {} microbatches; zbv needs p >= 2 (on one rank the V "
                    "folds onto itself) and m >= 1",
                    ranks, microbatches));
  Schedule schedule;
  schedule.name = "zbv";
  schedule.stages = 2 * ranks;
  schedule.microbatches = microbatches;
  schedule.stages_of_rank = v_placement(ranks);
  for (auto& held : schedule.stages_of_rank) std::ranges::sort(held);
  schedule.actions.resize(ranks);
  GreedyState g(ranks, microbatches);
  const std::size_t per_rank = 6 * static_cast<std::size_t>(microbatches);  // 2 stages x (F, I, W)
  // Every step some rank can move (the reservation above); the bound only
  // guards against a bug turning into an endless loop.
  for (int now = 0; now < 16 * (microbatches + ranks) * 6; ++now) {
    bool finished = true;
    for (int rank = 0; rank < ranks; ++rank) {
      if (schedule.actions[rank].size() == per_rank) continue;
      finished = false;
      if (auto action = pick(g, rank, now)) schedule.actions[rank].push_back(*action);
    }
    if (finished) return schedule;
  }
  throw Error(
      fmt::format("[pipeline] zbv: the greedy order for {} ranks and {} microbatches did not finish "
                  "(an internal error)",
                  ranks, microbatches));
}

}  // namespace dtensor::nn::pipeline
