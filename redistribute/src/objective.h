#pragma once
// Internal to redistribute/: what the planner ranks plans by, shared by the
// search's front end (planner.cpp) and the closed-form prices (price.cpp),
// which must agree on it.
#include <cstdint>

#include "dtensor/redistribute/cost_model.h"

namespace dtensor::planner {

/// The relative margin a lower bound on a plan's time gives up (and a
/// proof that no other plan wins demands) so that rounding never lifts a
/// bound above a true cost: t * (1 - kRoundingSlack).
inline constexpr double kRoundingSlack = 1e-9;

/// Whether plans for a Partial source are ranked by the busiest rank's bytes
/// first, time breaking ties, as plans for every other source are, rather
/// than by estimated time. Every plan for a Partial source issues at least
/// one collective, and what one plan saves over another in bytes is at most
/// a small multiple of the tensor's size; while the whole tensor crosses the
/// fastest link in less than one collective's fixed cost, one collective
/// more costs more than any saving in bytes, so time decides. From there on
/// bandwidth dominates and the least traffic wins: the time model prices a
/// local slice at copy speed, which would otherwise keep the search from
/// splitting the work across replicated mesh dims before reducing.
inline bool bandwidth_dominates(std::int64_t tensor_bytes, double fastest_Bps, const CostModel& cost) {
  return static_cast<double>(tensor_bytes) >= cost.base_latency_s * fastest_Bps;
}

}  // namespace dtensor::planner
