// validate(): the rules a schedule must keep (counts, order, messages) and
// the proof that it cannot deadlock when every send blocks until its peer
// reaches the matching receive (pytorch#172668: two ranks both in send).
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/nn/pipeline.h"
#include "pipeline_detail.h"

namespace dtensor::nn::pipeline {

namespace {

using Key = std::tuple<int, ActionKind, int>;  // stage, kind, microbatch
Key key_of(const Action& a) { return {a.stage, a.kind, a.microbatch}; }
Key key_of(int stage, ActionKind kind, int microbatch) { return {stage, kind, microbatch}; }

[[noreturn]] void fail(const Schedule& schedule, int rank, int position, const std::string& what) {
  detail::fail_at(schedule, rank, position, what);
}

void check_placement(const Schedule& schedule) {
  if (schedule.stages < 1 || schedule.microbatches < 1 || schedule.ranks() < 1)
    throw ValueError(
        fmt::format("[pipeline] invalid schedule '{}': {} stages, {} microbatches, {} ranks; expected "
                    "at least 1 of each",
                    schedule.name, schedule.stages, schedule.microbatches, schedule.ranks()));
  if (static_cast<int>(schedule.stages_of_rank.size()) != schedule.ranks())
    throw ValueError(fmt::format("[pipeline] invalid schedule '{}': a placement for {} ranks and actions for {}",
                                 schedule.name, schedule.stages_of_rank.size(), schedule.ranks()));
  std::vector<int> holders(schedule.stages, 0);
  for (const auto& held : schedule.stages_of_rank)
    for (int stage : held) {
      if (stage < 0 || stage >= schedule.stages)
        throw ValueError(fmt::format("[pipeline] invalid schedule '{}': a rank holds stage {}; expected 0..{}",
                                     schedule.name, stage, schedule.stages - 1));
      ++holders[stage];
    }
  for (int stage = 0; stage < schedule.stages; ++stage)
    if (holders[stage] != 1)
      throw ValueError(fmt::format("[pipeline] invalid schedule '{}': stage {} is held by {} ranks; expected one",
                                   schedule.name, stage, holders[stage]));
}

// The stage a message goes to or comes from, and whether the action is
// legal at all on this rank.
std::string message_problem(const Schedule& schedule, int rank, const Action& a) {
  const bool forward = a.kind == ActionKind::SendForward || a.kind == ActionKind::RecvForward;
  const bool sends = a.kind == ActionKind::SendForward || a.kind == ActionKind::SendBackward;
  // SEND_F goes up a stage, RECV_F comes from below, SEND_B goes down, RECV_B comes from above.
  const int peer_stage = a.stage + ((forward == sends) ? 1 : -1);
  if (peer_stage < 0 || peer_stage >= schedule.stages)
    return fmt::format("stage {} has no stage {} to {}", a.stage, peer_stage, sends ? "send to" : "receive from");
  if (schedule.rank_of_stage(peer_stage) == rank)
    return fmt::format("stages {} and {} are both on rank {}; they pass tensors without a message", a.stage, peer_stage,
                       rank);
  return "";
}

// Order and count rules, one rank at a time: returns every action's key
// seen anywhere (for the cross-rank checks that follow).
std::set<Key> check_each_rank(const Schedule& schedule) {
  std::set<Key> seen_anywhere;
  const bool communicates = schedule.has_communication();
  for (int rank = 0; rank < schedule.ranks(); ++rank) {
    std::set<Key> seen;
    const auto& list = schedule.actions[rank];
    const auto& held = schedule.stages_of_rank[rank];
    for (int position = 0; position < static_cast<int>(list.size()); ++position) {
      const Action& a = list[position];
      const int s = a.stage, mb = a.microbatch;
      auto before = [&](ActionKind kind) { return seen.contains(key_of(s, kind, mb)); };
      if (s < 0 || s >= schedule.stages || mb < 0 || mb >= schedule.microbatches)
        fail(schedule, rank, position,
             fmt::format("expected stage < {} and microbatch < {}", schedule.stages, schedule.microbatches));
      if (std::ranges::find(held, s) == held.end())
        fail(schedule, rank, position,
             fmt::format("stage {} is not on rank {} (it holds {})", s, rank, fmt::join(held, ", ")));
      if (before(a.kind)) fail(schedule, rank, position, "the same action a second time");
      auto remote = [&](int stage) { return schedule.rank_of_stage(stage) != rank; };
      switch (a.kind) {
        case ActionKind::Forward:
          if (communicates && s > 0 && remote(s - 1) && !before(ActionKind::RecvForward))
            fail(schedule, rank, position, fmt::format("its input was not received before (no {}RECV_F{})", s, mb));
          break;
        case ActionKind::Backward:
        case ActionKind::BackwardInput:
          if (!before(ActionKind::Forward))
            fail(schedule, rank, position, fmt::format("a backward before its forward {}F{}", s, mb));
          if (before(ActionKind::Backward) || before(ActionKind::BackwardInput))
            fail(schedule, rank, position, "a second backward of the same microbatch (B and I both)");
          if (communicates && s + 1 < schedule.stages && remote(s + 1) && !before(ActionKind::RecvBackward))
            fail(schedule, rank, position, fmt::format("its gradient was not received before (no {}RECV_B{})", s, mb));
          break;
        case ActionKind::BackwardWeight:
          if (!before(ActionKind::BackwardInput))
            fail(schedule, rank, position, fmt::format("W before its I ({}I{})", s, mb));
          break;
        default:
          if (auto problem = message_problem(schedule, rank, a); !problem.empty())
            fail(schedule, rank, position, problem);
          if (a.kind == ActionKind::SendForward && !before(ActionKind::Forward))
            fail(schedule, rank, position, fmt::format("sends before its forward {}F{} produced it", s, mb));
          if (a.kind == ActionKind::SendBackward && !before(ActionKind::Backward) && !before(ActionKind::BackwardInput))
            fail(schedule, rank, position,
                 fmt::format("sends before its backward {}B{} or {}I{} produced it", s, mb, s, mb));
      }
      seen.insert(key_of(a));
    }
    seen_anywhere.insert(seen.begin(), seen.end());
  }
  return seen_anywhere;
}

void check_completeness(const Schedule& schedule, const std::set<Key>& seen) {
  for (int stage = 0; stage < schedule.stages; ++stage) {
    const int rank = schedule.rank_of_stage(stage);
    const int end = static_cast<int>(schedule.actions[rank].size());
    for (int mb = 0; mb < schedule.microbatches; ++mb) {
      auto has = [&](ActionKind kind) { return seen.contains(key_of(stage, kind, mb)); };
      if (!has(ActionKind::Forward))
        fail(schedule, rank, end,
             fmt::format("stage {} never runs forward {}F{} (expected m = {} forwards)", stage, stage, mb,
                         schedule.microbatches));
      if (!has(ActionKind::Backward) && !(has(ActionKind::BackwardInput) && has(ActionKind::BackwardWeight)))
        fail(schedule, rank, end,
             fmt::format("stage {} has no backward of microbatch {} (expected {}B{}, or {}I{} "
                         "and {}W{})",
                         stage, mb, stage, mb, stage, mb, stage, mb));
    }
  }
}

// Every send has its one receive on the peer and every receive its send
// (with the send's bytes, where they are given).
void check_messages_match(const Schedule& schedule, const std::set<Key>& seen, const MessageBytes& bytes) {
  for (int rank = 0; rank < schedule.ranks(); ++rank) {
    const auto& list = schedule.actions[rank];
    for (int position = 0; position < static_cast<int>(list.size()); ++position) {
      const Action& a = list[position];
      Action peer = a;
      switch (a.kind) {
        case ActionKind::SendForward: peer = {a.stage + 1, ActionKind::RecvForward, a.microbatch}; break;
        case ActionKind::RecvForward: peer = {a.stage - 1, ActionKind::SendForward, a.microbatch}; break;
        case ActionKind::SendBackward: peer = {a.stage - 1, ActionKind::RecvBackward, a.microbatch}; break;
        case ActionKind::RecvBackward: peer = {a.stage + 1, ActionKind::SendBackward, a.microbatch}; break;
        default: continue;
      }
      if (!seen.contains(key_of(peer)))
        fail(schedule, rank, position,
             fmt::format("no matching {} on rank {}", peer, schedule.rank_of_stage(peer.stage)));
      const bool sends = a.kind == ActionKind::SendForward || a.kind == ActionKind::SendBackward;
      if (bytes && sends && bytes(a) != bytes(peer))
        fail(schedule, rank, position,
             fmt::format("sends {} bytes; its receive {} on rank {} expects {} bytes", bytes(a), peer,
                         schedule.rank_of_stage(peer.stage), bytes(peer)));
    }
  }
}

}  // namespace

void detail::fail_at(const Schedule& schedule, int rank, int position, const std::string& what) {
  const auto& list = schedule.actions[rank];
  std::string action = position < static_cast<int>(list.size()) ? action_text(list[position]) : "end of its list";
  throw ValueError(fmt::format("[pipeline] invalid schedule '{}': rank {}, position {} ({}): {}\n{}", schedule.name,
                               rank, position, action, what, grid_text(schedule, std::pair{rank, position})));
}

void validate(const Schedule& schedule, const MessageBytes& message_bytes) {
  check_placement(schedule);
  std::set<Key> seen = check_each_rank(schedule);
  check_completeness(schedule, seen);
  check_messages_match(schedule, seen, message_bytes);
  detail::check_progress(schedule);
}

}  // namespace dtensor::nn::pipeline
