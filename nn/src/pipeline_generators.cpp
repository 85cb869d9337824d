// The schedule generators: compute-only action lists (F, B, I, W) in the
// orders of GPipe, Megatron's 1F1B and interleaved 1F1B, and ZB-H1 (ZBV and
// DualPipeV have their own files).
#include <algorithm>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/nn/pipeline.h"

namespace dtensor::nn::pipeline {

namespace {

void require_positive(std::string_view schedule, std::string_view what, int value) {
  if (value < 1) throw ValueError(fmt::format("[pipeline] {}: {} = {}; expected at least 1", schedule, what, value));
}

// The hang of torchtitan#775: a warm-up waiting for a microbatch that never comes.
void require_microbatches_at_least_ranks(std::string_view schedule, int ranks, int microbatches) {
  if (microbatches < ranks)
    throw ValueError(
        fmt::format("[pipeline] {}: {} microbatches on {} ranks; {} needs m >= p (every rank's "
                    "warm-up of up to p-1 forwards must be followed by a backward)",
                    schedule, microbatches, ranks, schedule));
}

// The empty schedule of one stage per rank, after the checks every such
// generator makes (and m >= p where its warm-up needs it).
Schedule one_stage_per_rank(std::string name, int ranks, int microbatches, bool needs_microbatches_at_least_ranks) {
  require_positive(name, "ranks", ranks);
  require_positive(name, "microbatches", microbatches);
  if (needs_microbatches_at_least_ranks) require_microbatches_at_least_ranks(name, ranks, microbatches);
  Schedule schedule;
  schedule.name = std::move(name);
  schedule.stages = ranks;
  schedule.microbatches = microbatches;
  schedule.stages_of_rank = looped_placement(ranks, 1);
  schedule.actions.resize(ranks);
  return schedule;
}

}  // namespace

Schedule gpipe(int ranks, int microbatches) {
  Schedule schedule = one_stage_per_rank("gpipe", ranks, microbatches, false);
  for (int rank = 0; rank < ranks; ++rank) {
    auto& list = schedule.actions[rank];
    for (int mb = 0; mb < microbatches; ++mb) list.push_back({rank, ActionKind::Forward, mb});
    for (int mb = 0; mb < microbatches; ++mb) list.push_back({rank, ActionKind::Backward, mb});
  }
  return schedule;
}

Schedule one_f_one_b(int ranks, int microbatches) {
  Schedule schedule = one_stage_per_rank("1f1b", ranks, microbatches, true);
  for (int rank = 0; rank < ranks; ++rank) {
    auto& list = schedule.actions[rank];
    const int warmup = ranks - 1 - rank;
    for (int mb = 0; mb < warmup; ++mb) list.push_back({rank, ActionKind::Forward, mb});
    for (int i = 0; i < microbatches - warmup; ++i) {
      list.push_back({rank, ActionKind::Forward, warmup + i});
      list.push_back({rank, ActionKind::Backward, i});
    }
    for (int mb = microbatches - warmup; mb < microbatches; ++mb) list.push_back({rank, ActionKind::Backward, mb});
  }
  return schedule;
}

Schedule zero_bubble_h1(int ranks, int microbatches) {
  Schedule schedule = one_stage_per_rank("zb-h1", ranks, microbatches, true);
  for (int rank = 0; rank < ranks; ++rank) {
    auto& list = schedule.actions[rank];
    const int warmup = ranks - 1 - rank;
    int next_weight = 0;
    for (int mb = 0; mb < warmup; ++mb) list.push_back({rank, ActionKind::Forward, mb});
    // Steady state: F then I; the first `rank` W's wait, which lets the
    // input gradients (all the previous stage waits for) run one unit
    // apart, while keeping at most p activations held (p-1-r + 1 + r).
    for (int i = 0; i < microbatches - warmup; ++i) {
      list.push_back({rank, ActionKind::Forward, warmup + i});
      list.push_back({rank, ActionKind::BackwardInput, i});
      if (i >= rank) list.push_back({rank, ActionKind::BackwardWeight, next_weight++});
    }
    // Cool-down: each remaining I followed by a deferred W, which fills the
    // wait for the next I's gradient; then the W's still owed.
    for (int mb = microbatches - warmup; mb < microbatches; ++mb) {
      list.push_back({rank, ActionKind::BackwardInput, mb});
      list.push_back({rank, ActionKind::BackwardWeight, next_weight++});
    }
    while (next_weight < microbatches) list.push_back({rank, ActionKind::BackwardWeight, next_weight++});
  }
  return schedule;
}

Schedule interleaved(int ranks, int microbatches, int virtual_stages) {
  require_positive("interleaved", "ranks", ranks);
  require_positive("interleaved", "microbatches", microbatches);
  require_positive("interleaved", "virtual stages per rank", virtual_stages);
  // Megatron's microbatch groups: each chunk runs N microbatches before the
  // rank moves to its next chunk. N = m / rounds with rounds = m / p, so N
  // lies in [p, 2p): below p a chunk would wait on its own previous round
  // ("dependency bubbles").
  const int rounds = microbatches / ranks;
  if (rounds == 0 || microbatches % rounds != 0)
    throw ValueError(
        fmt::format("[pipeline] interleaved: {} microbatches on {} ranks; interleaved needs m >= p and m divisible by "
                    "m / p (the number of rounds{}), so that every chunk runs groups of N = m / (m / p) microbatches "
                    "with "
                    "p <= N < 2p",
                    microbatches, ranks, rounds == 0 ? "" : fmt::format(", here {}", rounds)));
  const int group = microbatches / rounds;
  const int total = virtual_stages * microbatches;  // forwards per rank
  Schedule schedule;
  schedule.name = "interleaved";
  schedule.stages = ranks * virtual_stages;
  schedule.microbatches = microbatches;
  schedule.stages_of_rank = looped_placement(ranks, virtual_stages);
  schedule.actions.resize(ranks);
  auto microbatch_of = [&](int k) { return (k / (group * virtual_stages)) * group + k % group; };
  for (int rank = 0; rank < ranks; ++rank) {
    auto forward = [&](int k) {
      int chunk = (k / group) % virtual_stages;
      return Action{chunk * ranks + rank, ActionKind::Forward, microbatch_of(k)};
    };
    auto backward = [&](int k) {
      int chunk = virtual_stages - 1 - (k / group) % virtual_stages;
      return Action{chunk * ranks + rank, ActionKind::Backward, microbatch_of(k)};
    };
    auto& list = schedule.actions[rank];
    const int warmup = std::min((virtual_stages - 1) * group + 2 * (ranks - 1 - rank), total);
    for (int k = 0; k < warmup; ++k) list.push_back(forward(k));
    for (int i = 0; i < total - warmup; ++i) {
      list.push_back(forward(warmup + i));
      list.push_back(backward(i));
    }
    for (int k = total - warmup; k < total; ++k) list.push_back(backward(k));
  }
  return schedule;
}

std::vector<std::string> schedule_names() { return {"gpipe", "1f1b", "interleaved", "zb-h1", "zbv", "dualpipev"}; }

Schedule make_schedule(std::string_view name, int ranks, int microbatches, int virtual_stages) {
  if (name == "interleaved") return interleaved(ranks, microbatches, virtual_stages);
  if (name == "zbv" || name == "dualpipev") {
    if (virtual_stages != 1 && virtual_stages != 2)
      throw ValueError(fmt::format("[pipeline] {}: {} stages per rank; {} holds exactly 2 per rank, in a V", name,
                                   virtual_stages, name));
    return name == "zbv" ? zbv(ranks, microbatches) : dualpipev(ranks, microbatches);
  }
  if (name != "gpipe" && name != "1f1b" && name != "zb-h1")
    throw ValueError(
        fmt::format("[pipeline] unknown schedule '{}'; expected one of gpipe, 1f1b, interleaved, zb-h1, zbv, dualpipev",
                    name));
  if (virtual_stages != 1)
    throw ValueError(
        fmt::format("[pipeline] {}: {} stages per rank; {} holds one stage per rank (use interleaved for more)", name,
                    virtual_stages, name));
  if (name == "gpipe") return gpipe(ranks, microbatches);
  if (name == "1f1b") return one_f_one_b(ranks, microbatches);
  return zero_bubble_h1(ranks, microbatches);
}

}  // namespace dtensor::nn::pipeline
