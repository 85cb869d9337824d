#pragma once
// Pipeline schedules as data: one list of actions per rank, in PyTorch's
// text form (torch.distributed.pipelining), so that a schedule prints,
// parses, validates and simulates without running anything.
//
//   auto schedule = nn::pipeline::make_schedule("1f1b", /*ranks=*/4, /*microbatches=*/8);
//   auto lowered = nn::pipeline::lower(schedule);     // sends and receives inserted, then validated
//   auto result = nn::pipeline::simulate(schedule, {});  // unit costs: makespan 3(m+p-1) = 33
//
// An action is `{stage}{kind}{microbatch}`: `0F3` is stage 0's forward of
// microbatch 3, `1B2` a full backward, `1I2`/`1W2` its input- and
// weight-gradient halves, `2SEND_F1` stage 2 sending microbatch 1's
// activation on (to stage 3), `3RECV_F1` stage 3 receiving it, and
// SEND_B/RECV_B the same for gradients going back (`3SEND_B1`, `2RECV_B1`).
// See docs/pipeline.md.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtensor/redistribute/cost_model.h"

namespace dtensor::nn::pipeline {

enum class ActionKind {
  Forward,         // F
  Backward,        // B: input and weight gradients together
  BackwardInput,   // I: the input gradient only (what the previous stage waits for)
  BackwardWeight,  // W: the weight gradient, deferrable
  SendForward,     // SEND_F
  RecvForward,     // RECV_F
  SendBackward,    // SEND_B
  RecvBackward,    // RECV_B
};

/// "F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B".
std::string_view kind_text(ActionKind kind);
/// Whether the action computes (F, B, I, W) rather than communicates.
bool is_compute(ActionKind kind);

struct Action {
  int stage = 0;
  ActionKind kind = ActionKind::Forward;
  int microbatch = 0;
  bool operator==(const Action&) const = default;
};

/// `0F3`, `2SEND_F1`.
std::string action_text(const Action& action);
/// Parses one action; a ParseError names the token and what was expected.
Action parse_action(std::string_view token);

/// One action list per rank. `stages_of_rank[r]` lists the stages rank r
/// holds (each stage lives on exactly one rank).
struct Schedule {
  std::string name;  // the generator's, or "csv"
  int stages = 0;
  int microbatches = 0;
  std::vector<std::vector<int>> stages_of_rank;
  std::vector<std::vector<Action>> actions;

  int ranks() const { return static_cast<int>(actions.size()); }
  /// The rank holding `stage`; a ValueError if none does.
  int rank_of_stage(int stage) const;
  /// Whether any action sends or receives (a lowered or hand-written full schedule).
  bool has_communication() const;
  bool operator==(const Schedule&) const = default;
};

/// Stages r, r+p, r+2p, ... on rank r (PyTorch's and Megatron's "loop" placement).
std::vector<std::vector<int>> looped_placement(int ranks, int stages_per_rank);
/// Stages r and 2p-1-r on rank r (the "V" of ZBV and DualPipeV).
std::vector<std::vector<int>> v_placement(int ranks);

/// One rank's actions separated by commas: "0F0,0F1,0B0".
std::string rank_text(const std::vector<Action>& actions);
/// Every rank's actions, one row per rank (PyTorch's CSV form: no header).
std::string to_csv(const Schedule& schedule);
/// Reads the CSV form. Stages, microbatches and the placement are taken from
/// the actions (stage count = highest stage + 1, and so on) unless given; a
/// ParseError names the token, the rank (row) and the position in the row.
Schedule from_csv(std::string_view text, std::optional<int> stages = std::nullopt,
                  std::optional<int> microbatches = std::nullopt);

/// The step-by-rank grid: one row per position in the action lists, one
/// column per rank. `marked` = {rank, position} brackets that cell as
/// `[0F3]` (the offending action of a validation error).
std::string grid_text(const Schedule& schedule, std::optional<std::pair<int, int>> marked = std::nullopt);

// ---- Generators: compute-only schedules (F, B, I, W). Each refuses what it
// cannot schedule with a ValueError naming the values and the rule.

/// GPipe: every forward, then every backward. One stage per rank.
Schedule gpipe(int ranks, int microbatches);
/// 1F1B (Megatron's order): p-1-r warm-up forwards on rank r, then one
/// forward and one backward alternately. Needs m >= p.
Schedule one_f_one_b(int ranks, int microbatches);
/// Interleaved 1F1B with v stages per rank in looped placement. Microbatches
/// go in groups of N = m / (m / p) per chunk (PyTorch's and Megatron's
/// rule), so m must be >= p and divisible by m / p (p = 4: 4..7, 8, 10, 12,
/// ... but not 9). Rank r's warm-up is (v-1)N + 2(p-1-r) forwards.
Schedule interleaved(int ranks, int microbatches, int virtual_stages);
/// ZB-H1: 1F1B with the backward split into I and W; rank r defers its
/// first r weight gradients, so every rank holds at most p microbatches
/// (1F1B's rank-0 memory) and the bubble shrinks to (p-1) units. Needs m >= p.
Schedule zero_bubble_h1(int ranks, int microbatches);

/// ZBV: two stages per rank in a V (rank r holds r and 2p-1-r), backward
/// split into I and W. The order is a greedy one at unit costs: a ready I
/// first, else a forward (one going down only while the rank keeps room for
/// the way back up), else a deferred W. Needs p >= 2. Not PyTorch's order:
/// see docs/pipeline.md for where its makespan differs.
Schedule zbv(int ranks, int microbatches);

/// DualPipeV (DeepSeek's DualPipe cut in half): ZBV's V placement, in the
/// order of deepseek-ai/DualPipe's dualpipev.py. Rank r runs 2(p-1-r) down
/// forwards; r+1 pairs of a down and an up forward; p-1-r times an up I, its
/// W and an up forward; then m-2p+r+1 main steps of two F&B pairs (down F
/// with up B, up F with down B; run one after the other, F then B); then the
/// cool-down of full backwards turning into I's, and the W's they owe.
/// Holds at most 2p+1 stage activations per rank. Needs p >= 2 and m >= 2p.
Schedule dualpipev(int ranks, int microbatches);

/// The names make_schedule accepts: gpipe, 1f1b, interleaved, zb-h1, zbv, dualpipev.
std::vector<std::string> schedule_names();
/// By name; `virtual_stages` must be 1 for the one-stage-per-rank schedules
/// (zbv and dualpipev also accept 2, the stages they hold per rank).
Schedule make_schedule(std::string_view name, int ranks, int microbatches, int virtual_stages = 1);

// ---- Lowering and validation.

/// Inserts SEND_F/RECV_F/SEND_B/RECV_B into a compute-only schedule: a send
/// just after the action producing the message, a receive just before the
/// action consuming it, none between stages on the same rank. Within the
/// messages between two compute actions, even ranks send first and odd ranks
/// receive first (Megatron's rule: two neighbours never both block in a
/// send). The result is validated (a ValueError if it would deadlock).
Schedule lower(const Schedule& compute_only);

/// Checks: every stage has m forwards and, per microbatch, one B or one I
/// and one W; a backward only after its forward, W only after its I; every
/// stage's input after the stage before produced it; (when the schedule
/// communicates) every send matched by exactly one receive, each received
/// before its use, none between stages on one rank; and that the schedule
/// runs to the end when every send blocks until its peer reaches the
/// matching receive. A ValueError names the rank, position and action and
/// shows the grid with that cell marked.
///
/// `message_bytes`, where the sizes are known (an action carries none): the
/// bytes each SEND_F/RECV_F/SEND_B/RECV_B moves at its end; then each
/// send's bytes must equal its receive's, else a ValueError naming both
/// ends and both sizes. (The runtime knows only its own stages' layouts, so
/// it leaves this to every backend's recv, which compares the two sizes and
/// throws a CommError naming both.)
using MessageBytes = std::function<std::uint64_t(const Action& message)>;
void validate(const Schedule& schedule, const MessageBytes& message_bytes = {});

// ---- Simulation.

/// Compute time per stage (B = I + W) and the point-to-point model.
struct PipelineCosts {
  double forward = 1, input_backward = 1, weight_backward = 1;
  /// Per stage; stages without an entry use the three values above.
  struct StageCosts {
    double forward = 1, input_backward = 1, weight_backward = 1;
  };
  std::vector<StageCosts> per_stage;
  /// Messages between ranks cost hop_latency + bytes / bandwidth on this link
  /// (redistribute's alpha-beta link); none: messages are free.
  std::optional<LinkParams> link;
  std::int64_t message_bytes = 0;
  /// The cores the ranks share; 0 (or at least one per rank): a core each.
  /// With fewer cores than ranks (thread ranks on a small machine), the
  /// ranks computing at a moment share them equally, as the kernel's fair
  /// scheduler does to a first approximation: while n compute, each
  /// progresses at min(1, cores / n) of its work per second. A rank waiting
  /// for its input takes no core. The costs above are then each action's
  /// work on a core of its own.
  int cores = 0;

  StageCosts of_stage(int stage) const;
  double message_seconds() const;
};

struct TimedAction {
  int rank = 0;
  Action action;
  double start = 0, end = 0;
};

struct SimulationResult {
  double makespan = 0;
  std::vector<double> busy;  // per rank: time computing
  std::vector<double> idle;  // per rank: makespan - busy, the bubble
  /// Mean over ranks of idle / makespan: (p-1)/(m+p-1) for 1F1B at unit costs.
  double bubble_fraction = 0;
  /// Mean idle over mean busy (Narayanan et al.'s "bubble time fraction"):
  /// (p-1)/m for 1F1B, (p-1)/(v m) for interleaved at unit costs.
  double bubble_ratio = 0;
  /// Per rank: the most (stage, microbatch) activations held at once. A
  /// forward stores one; B frees it, or W where the backward is split (I
  /// keeps what W still needs), as PyTorch and the ZB paper count.
  std::vector<int> peak_microbatches;
  std::vector<TimedAction> timeline;  // compute actions, each rank in order
};

/// Runs the compute actions in each rank's order, each as soon as its rank
/// is free and its input has arrived (the producer's end plus the message
/// time when the producer is on another rank), on a core of its own or
/// sharing costs.cores. Accepts compute-only and lowered schedules (the
/// latter's communication actions take no rank time). A rank's busy time is
/// the time its actions were in progress; with shared cores an action takes
/// longer than its cost when more ranks compute than there are cores, and
/// the makespan is at least the whole work over the cores.
SimulationResult simulate(const Schedule& schedule, const PipelineCosts& costs = {});

/// One row per rank, one column per time unit of `unit` (e.g. 1 at unit
/// costs): each cell the compute action running then, '.' when idle.
std::string timeline_text(const Schedule& schedule, const SimulationResult& result, double unit = 1);

}  // namespace dtensor::nn::pipeline

template <>
struct fmt::formatter<dtensor::nn::pipeline::Action> : fmt::formatter<std::string_view> {
  auto format(const dtensor::nn::pipeline::Action& a, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(dtensor::nn::pipeline::action_text(a), ctx);
  }
};
