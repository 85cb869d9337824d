#pragma once
// A redistribution plan: a value that prints, costs, compares and caches.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/dtype.h"
#include "dtensor/core/placement.h"
#include "dtensor/core/shape.h"
#include "dtensor/core/units.h"
#include "dtensor/redistribute/cost_model.h"

namespace dtensor {

enum class StepKind : std::uint8_t {
  AllGather,      // S(d) -> R on a group of mesh dims (innermost splits of d)
  AllReduce,      // P -> R on a group of mesh dims
  ReduceScatter,  // P -> S(d) on a group of mesh dims (new innermost splits)
  AllToAll,       // S(i) -> S(j) on one mesh dim
  Exchange,       // any layout without Partial -> target, one all_to_allv
                  // moving exactly the regions each rank lacks
  Slice,          // R -> S(d): local, keep my chunk
  ZeroFill,       // R -> P(sum): local, keep on coordinate 0, zero elsewhere
  Relabel,        // R -> P(avg|max|min): local, nothing to do
};
std::string_view step_name(StepKind kind);

/// True for the steps that issue no communication.
bool is_local(StepKind kind);

/// One region a rank sends to another in an Exchange step (global coords).
struct ExchangeBlock {
  int src_rank;
  int dst_rank;
  Box box;
  bool operator==(const ExchangeBlock&) const = default;
};

struct PlanStep {
  StepKind kind;
  /// The mesh dims acting together (one group), in group order.
  std::vector<int> mesh_dims;
  /// The tensor dim gathered / scattered / split (AllToAll: the new shard
  /// dim; `src_dim` the old one). -1 where none.
  std::int64_t tensor_dim = -1;
  std::int64_t src_dim = -1;
  Layout from;
  Layout to;
  /// Bytes each mesh rank receives in this step (indexed by mesh rank).
  std::vector<std::int64_t> recv_bytes;
  double est_seconds = 0;
  /// Why the planner chose it, for a person.
  std::string reason;
  /// Exchange only: every block moved, sorted by (dst, src, box offset). A
  /// rank's own blocks (src == dst) are local copies and count no bytes.
  std::vector<ExchangeBlock> blocks;

  std::int64_t max_recv_bytes() const;
  bool operator==(const PlanStep&) const = default;
};

/// The cheapest plan the planner compared and did not choose: its steps'
/// kinds in order and the cost model's price of it, for pictures and
/// explanations that show what the choice saved.
struct PlanRunnerUp {
  std::vector<StepKind> kinds;
  /// The bytes into its busiest rank as the search priced them: that
  /// rank's total, or, where the search adds each step's busiest rank, that
  /// sum (never below the total). Never below the chosen plan's
  /// max_recv_bytes() when it is the bytes that decided.
  std::int64_t bytes = 0;
  double est_seconds = 0;
  bool operator==(const PlanRunnerUp&) const = default;
};

struct Plan {
  Shape mesh_shape;
  Shape global_shape;
  DType dtype = DType::Float32;
  Layout from;
  Layout to;
  std::vector<PlanStep> steps;
  /// Total bytes each mesh rank receives over the plan.
  std::vector<std::int64_t> recv_bytes;
  double est_seconds = 0;
  /// Where the search compared more than one plan and priced the next best
  /// (not on closed-form prices, nor where the others lost on a bound).
  std::optional<PlanRunnerUp> runner_up;

  /// The most any one rank receives over the whole plan.
  std::int64_t max_recv_bytes() const;
  /// Number of steps that communicate.
  int num_collectives() const;
  bool operator==(const Plan&) const = default;
};

/// The memory a value holds: its own size and its containers' heap buffers
/// (their capacities), not the allocator's bookkeeping. What the caches
/// report as their bytes.
std::size_t approx_bytes(const Layout& layout);
std::size_t approx_bytes(const Plan& plan);

}  // namespace dtensor

template <>
struct fmt::formatter<dtensor::StepKind> : fmt::formatter<std::string_view> {
  auto format(dtensor::StepKind k, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(dtensor::step_name(k), ctx);
  }
};
/// One line per step: "all_gather on mesh dims [1]: S(0),S(1) -> S(0),R, 3 KiB, 4.1 us".
template <>
struct fmt::formatter<dtensor::PlanStep> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  fmt::format_context::iterator format(const dtensor::PlanStep& s, fmt::format_context& ctx) const;
};
template <>
struct fmt::formatter<dtensor::Plan> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  fmt::format_context::iterator format(const dtensor::Plan& p, fmt::format_context& ctx) const;
};
