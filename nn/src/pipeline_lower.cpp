// lower(): sends and receives around the compute actions; and the blocking
// run that proves a schedule cannot deadlock.
#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/nn/pipeline.h"
#include "pipeline_detail.h"

namespace dtensor::nn::pipeline {

namespace {

// What each (stage, microbatch) has produced so far in the blocking run.
struct Produced {
  std::vector<std::vector<char>> forward, input_gradient;
  Produced(int stages, int microbatches)
      : forward(stages, std::vector<char>(microbatches, 0)), input_gradient(forward) {}
};

// The compute action whose output `a` needs, if it needs one.
std::optional<Action> input_of(const Schedule& schedule, const Action& a) {
  switch (a.kind) {
    case ActionKind::Forward:
      if (a.stage == 0) return std::nullopt;
      return Action{a.stage - 1, ActionKind::Forward, a.microbatch};
    case ActionKind::Backward:
    case ActionKind::BackwardInput:
      if (a.stage + 1 == schedule.stages) return Action{a.stage, ActionKind::Forward, a.microbatch};
      return Action{a.stage + 1, ActionKind::BackwardInput, a.microbatch};  // or its B
    case ActionKind::BackwardWeight: return Action{a.stage, ActionKind::BackwardInput, a.microbatch};
    default: return std::nullopt;
  }
}

bool has_produced(const Produced& produced, const Action& a) {
  if (a.kind == ActionKind::Forward) return produced.forward[a.stage][a.microbatch];
  return produced.input_gradient[a.stage][a.microbatch];
}

// The receive a send meets on its peer.
Action matching_receive(const Action& send) {
  if (send.kind == ActionKind::SendForward) return {send.stage + 1, ActionKind::RecvForward, send.microbatch};
  return {send.stage - 1, ActionKind::RecvBackward, send.microbatch};
}
Action matching_send(const Action& receive) {
  if (receive.kind == ActionKind::RecvForward) return {receive.stage - 1, ActionKind::SendForward, receive.microbatch};
  return {receive.stage + 1, ActionKind::SendBackward, receive.microbatch};
}

std::string where(const Schedule& schedule, const std::vector<std::size_t>& next, int rank) {
  const auto& list = schedule.actions[rank];
  if (next[rank] >= list.size()) return fmt::format("rank {} has finished", rank);
  return fmt::format("rank {} is at position {} ({})", rank, next[rank], list[next[rank]]);
}

// Why `rank` cannot go on, for the deadlock message.
std::string waiting_for(const Schedule& schedule, const std::vector<std::size_t>& next, int rank) {
  const Action& a = schedule.actions[rank][next[rank]];
  if (is_compute(a.kind)) return fmt::format("waiting for its input {}, never produced", *input_of(schedule, a));
  const bool sends = a.kind == ActionKind::SendForward || a.kind == ActionKind::SendBackward;
  Action peer_action = sends ? matching_receive(a) : matching_send(a);
  int peer = schedule.rank_of_stage(peer_action.stage);
  return fmt::format("{}, waiting for rank {} to reach {}, but {}",
                     sends ? "blocked in its send" : "blocked in its receive", peer, peer_action,
                     where(schedule, next, peer));
}

// A message's place in the global order: when its producer ends, then a
// fixed tie-break.
struct MessageKey {
  double time = 0;
  int sender_stage = 0;
  ActionKind kind = ActionKind::SendForward;
  int microbatch = 0;
  auto operator<=>(const MessageKey&) const = default;
};

struct ActionLess {
  bool operator()(const Action& a, const Action& b) const {
    return std::tuple(a.stage, a.kind, a.microbatch) < std::tuple(b.stage, b.kind, b.microbatch);
  }
};

bool on_other_rank(const Schedule& schedule, int rank, int stage) {
  return stage >= 0 && stage < schedule.stages && schedule.rank_of_stage(stage) != rank;
}

bool computes_input_gradient(ActionKind kind) {
  return kind == ActionKind::Backward || kind == ActionKind::BackwardInput;
}

// The messages compute action `a` on `rank` sends (at most one).
std::vector<Action> sends_of(const Schedule& schedule, int rank, const Action& a) {
  if (a.kind == ActionKind::Forward && on_other_rank(schedule, rank, a.stage + 1))
    return {{a.stage, ActionKind::SendForward, a.microbatch}};
  if (computes_input_gradient(a.kind) && on_other_rank(schedule, rank, a.stage - 1))
    return {{a.stage, ActionKind::SendBackward, a.microbatch}};
  return {};
}

// The message compute action `a` on `rank` must receive first, if any.
std::optional<Action> receive_of(const Schedule& schedule, int rank, const Action& a) {
  if (a.kind == ActionKind::Forward && on_other_rank(schedule, rank, a.stage - 1))
    return Action{a.stage, ActionKind::RecvForward, a.microbatch};
  if (computes_input_gradient(a.kind) && on_other_rank(schedule, rank, a.stage + 1))
    return Action{a.stage, ActionKind::RecvBackward, a.microbatch};
  return std::nullopt;
}

// One rank's lowered list. Each send goes in the slot just after its
// producer and each receive just before its consumer (slot i: before
// compute action i); then a receive moves earlier, where needed, so that
// the rank's messages come in the global order.
std::vector<Action> lower_rank(const Schedule& schedule, int rank,
                               const std::map<Action, MessageKey, ActionLess>& key_of_send) {
  struct Placed {
    MessageKey key;
    std::size_t slot;
    Action action;
  };
  const auto& list = schedule.actions[rank];
  std::vector<Placed> messages;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (auto receive = receive_of(schedule, rank, list[i]))
      messages.push_back({key_of_send.at(matching_send(*receive)), i, *receive});
    for (const Action& send : sends_of(schedule, rank, list[i]))
      messages.push_back({key_of_send.at(send), i + 1, send});
  }
  std::ranges::sort(messages, {}, &Placed::key);
  // Only receives move: a send's slot already ascends with its key (its
  // producer ends later the later it runs), and a later key's receive can
  // never sit before an earlier send (its consumer starts after the key).
  for (std::size_t j = messages.size(); j-- > 1;) {
    Placed& earlier = messages[j - 1];
    if (earlier.action.kind == ActionKind::RecvForward || earlier.action.kind == ActionKind::RecvBackward)
      earlier.slot = std::min(earlier.slot, messages[j].slot);
  }
  std::vector<Action> out;
  auto message = messages.begin();
  for (std::size_t slot = 0; slot <= list.size(); ++slot) {
    for (; message != messages.end() && message->slot == slot; ++message) out.push_back(message->action);
    if (slot < list.size()) out.push_back(list[slot]);
  }
  return out;
}

}  // namespace

void detail::check_progress(const Schedule& schedule) {
  const int ranks = schedule.ranks();
  Produced produced(schedule.stages, schedule.microbatches);
  std::vector<std::size_t> next(ranks, 0);
  auto current = [&](int rank) -> const Action* {
    const auto& list = schedule.actions[rank];
    return next[rank] < list.size() ? &list[next[rank]] : nullptr;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int rank = 0; rank < ranks; ++rank) {
      while (const Action* a = current(rank)) {
        if (is_compute(a->kind)) {
          auto input = input_of(schedule, *a);
          if (input && !has_produced(produced, *input)) break;
          if (a->kind == ActionKind::Forward) produced.forward[a->stage][a->microbatch] = 1;
          if (a->kind == ActionKind::Backward || a->kind == ActionKind::BackwardInput)
            produced.input_gradient[a->stage][a->microbatch] = 1;
        } else if (a->kind == ActionKind::SendForward || a->kind == ActionKind::SendBackward) {
          // A blocking send: it completes together with the peer's receive.
          const Action receive = matching_receive(*a);
          const int peer = schedule.rank_of_stage(receive.stage);
          const Action* peer_at = current(peer);
          if (peer_at == nullptr || !(*peer_at == receive)) break;
          ++next[peer];
        } else {
          break;  // a receive completes when its sender reaches the send
        }
        ++next[rank];
        progress = true;
      }
    }
  }
  std::string stuck;
  int first_stuck = -1;
  for (int rank = 0; rank < ranks; ++rank) {
    if (current(rank) == nullptr) continue;
    if (first_stuck < 0) first_stuck = rank;
    stuck += fmt::format("\n  {}: {}", where(schedule, next, rank), waiting_for(schedule, next, rank));
  }
  if (first_stuck >= 0)
    fail_at(schedule, first_stuck, static_cast<int>(next[first_stuck]),
            "deadlock with blocking sends: no rank can go on" + stuck);
}

Schedule lower(const Schedule& compute_only) {
  if (compute_only.has_communication())
    throw ValueError(
        fmt::format("[pipeline] lower: schedule '{}' already sends and receives; expected a "
                    "compute-only schedule (validate() checks a complete one)",
                    compute_only.name));
  validate(compute_only);
  // One global order of the messages, the same on every rank: by when the
  // unit-cost run produces them. A rank that meets its messages in that
  // order can never wait on a peer that waits on it (the earliest pending
  // message always has both ends ready), however its compute is interleaved.
  std::map<Action, MessageKey, ActionLess> key_of_send;
  for (const TimedAction& t : simulate(compute_only).timeline)
    for (const Action& send : sends_of(compute_only, t.rank, t.action))
      key_of_send[send] = {t.end, send.stage, send.kind, send.microbatch};
  Schedule lowered = compute_only;
  for (int rank = 0; rank < compute_only.ranks(); ++rank)
    lowered.actions[rank] = lower_rank(compute_only, rank, key_of_send);
  validate(lowered);
  return lowered;
}

}  // namespace dtensor::nn::pipeline
