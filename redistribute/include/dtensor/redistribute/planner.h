#pragma once
// The planner: a pure function of metadata that finds the cheapest sequence
// of steps turning one layout into another. It never sees a communicator.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtensor/core/cache_stats.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/placement.h"
#include "dtensor/core/shape.h"
#include "dtensor/redistribute/cost_model.h"
#include "dtensor/redistribute/plan.h"

namespace dtensor {

struct PlanRequest {
  Shape mesh_shape;
  Shape global_shape;
  DType dtype = DType::Float32;
  Layout from;
  Layout to;
  CostModel cost{};
  bool operator==(const PlanRequest&) const = default;
  std::size_t hash() const;
};

/// The largest requests the planner takes. It keeps every rank's box of
/// every layout it reaches, and the layouts grow with the tensor dims to the
/// power of the mesh dims that split: its work is about ranks x dims x
/// (dims + 2)^(mesh dims of size > 1), held to kMaxPlanWork; pricing a
/// direct exchange is quadratic in the ranks, held to kMaxPlanRanks. These
/// keep the worst moves within about a second and 100 MB on one core
/// (measured with dtensor-plan; tests/test_bad_sizes.cpp). The byte limit
/// keeps every sum of byte counts over ranks and steps far inside int64.
inline constexpr std::int64_t kMaxPlanRanks = 1024;
inline constexpr std::int64_t kMaxPlanTensorDims = 16;
inline constexpr std::int64_t kMaxPlanWork = std::int64_t{1} << 24;
inline constexpr std::int64_t kMaxPlanBytes = std::int64_t{1} << 46;  // 64 TiB

/// The planner's work measure above for a mesh and a tensor of `dims` dims
/// (saturating at kMaxPlanWork + 1).
std::int64_t plan_work(std::span<const std::int64_t> mesh_shape, std::int64_t dims);

/// What is wrong with a mesh and tensor of that size for the planner, in
/// words naming the value and the limit (mesh sizes below 1, negative sizes,
/// counts that overflow, the limits above), or nullopt.
std::optional<std::string> plan_size_problem(std::span<const std::int64_t> mesh_shape,
                                             std::span<const std::int64_t> global_shape, DType dtype);

/// Searches over intermediate layouts (A*: guided by a lower bound on the
/// cost still to come) with per-mesh-dim and
/// per-group collectives, local steps, and a direct Exchange. Validates the
/// request (LayoutError / ShapeError naming the bad value). Rejects
/// Partial(op1) -> Partial(op2) on the same mesh dim and Shard -> Partial
/// without a reduction in between only where no plan exists.
Plan plan_redistribute(const PlanRequest& request);

/// How one search went, for tests and benchmarks: the layouts it reached
/// and how many it took from its queue and expanded (paths, for a Partial
/// source ranked by bytes).
struct PlanSearchStats {
  std::size_t states = 0;
  std::size_t expanded = 0;
};

/// plan_redistribute with the search's lower bound (A*) on, as there, or
/// off (a plain Dijkstra search): a plan of the same cost either way, off
/// expanding more states. Fills `stats` where given.
Plan plan_redistribute(const PlanRequest& request, bool lower_bound, PlanSearchStats* stats = nullptr);

/// The plan from the calling thread's cache (computed on a miss). A hit
/// costs a hash and a compare of the request: well under a microsecond.
/// The cache keeps the plan_cache_capacity() most recently used plans; the
/// reference stays valid until this thread's cache evicts the plan (after
/// that many other distinct requests) or clear_plan_cache().
const Plan& cached_plan(const PlanRequest& request);

/// What cached_plan(request).est_seconds is, without building a plan where
/// a closed form gives the same number (see closed_form_seconds): what
/// sharding propagation prices its candidates with.
double redistribute_seconds(std::span<const std::int64_t> mesh_shape, std::span<const std::int64_t> global_shape,
                            DType dtype, const Layout& from, const Layout& to, const CostModel& cost);

/// The planner's est_seconds for the moves it answers with a local copy, a
/// local zero-fill or relabel to Partial, or one collective on one mesh dim
/// (all_gather, all_to_all, all_reduce, or their direct exchange), where no
/// other plan can be cheaper; nullopt
/// for every other move. Allocates nothing once warm.
std::optional<double> closed_form_seconds(std::span<const std::int64_t> mesh_shape,
                                          std::span<const std::int64_t> global_shape, DType dtype, const Layout& from,
                                          const Layout& to, const CostModel& cost);

/// The planner's one-step cost of an all_reduce that removes the Partial of
/// `layout` on mesh dim `mesh_dim` and keeps every other mesh dim: the
/// price of a reduction owed by a new Partial, without a search. nullopt
/// where that step is not how the planner would start (mesh dim not Partial
/// or of size 1, no elements, integer Avg) or the request is one the closed
/// forms leave to the planner.
std::optional<double> all_reduce_step_seconds(std::span<const std::int64_t> mesh_shape,
                                              std::span<const std::int64_t> global_shape, DType dtype,
                                              const Layout& layout, int mesh_dim, const CostModel& cost);

/// A cheap lower bound on cached_plan(request).est_seconds (0 where it
/// knows none): at least one collective where some rank lacks data it needs
/// or a Partial must be reduced. Lets propagation skip pricing candidates
/// that cannot win.
double redistribute_lower_bound_seconds(std::span<const std::int64_t> mesh_shape,
                                        std::span<const std::int64_t> global_shape, DType dtype, const Layout& from,
                                        const Layout& to, const CostModel& cost);

/// The plan cache's bound per thread unless DTENSOR_PLAN_CACHE_ENTRIES or
/// set_plan_cache_capacity() says otherwise: a plan and its key take from
/// about 0.5 KiB (one collective) to a few KiB (exchanges), so a full cache
/// holds a few MiB per rank thread.
inline constexpr std::size_t kDefaultPlanCacheEntries = 1024;
/// And whatever the entry bound, the plans one thread keeps take at most
/// this many approx_bytes (an exchange on a 256-rank mesh lists every
/// rank pair's blocks: a few hundred KiB), the oldest going first.
inline constexpr std::size_t kPlanCacheBytes = std::size_t{64} << 20;

/// This thread's cache counters (`bytes`: approx_bytes of the plans and
/// their keys), and a way to empty it (for benchmarks).
CacheStats plan_cache_stats();
void clear_plan_cache();
/// The bound on every thread's plan cache, from 1 to 2^20 entries (else
/// ValueError naming the value); a cache above it shrinks at its next miss.
void set_plan_cache_capacity(std::size_t entries);

/// The region a rank must hold real data for under `layout`: its local box,
/// or nothing where a Partial(sum) mesh dim has a non-zero coordinate (those
/// ranks hold zeros). A 0-d box has no size to empty: whether a rank needs
/// data is holds_zeros (dtensor/core/layout_rules.h), not this box's numel.
Box needed_box(std::span<const std::int64_t> mesh_shape, std::span<const std::int64_t> global_shape,
               const Layout& layout, std::span<const std::int64_t> coord);

}  // namespace dtensor
