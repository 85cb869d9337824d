#pragma once
// Running many one-collective plans as one collective call: the executor
// half of coalesced redistribution (dtensor/api/coalesced.h is the front end
// that plans, buckets and falls back). Like executor.h, the only place that
// talks to a communicator is the .cpp, through the Communicator interface.
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/dtype.h"
#include "dtensor/core/reduce_op.h"
#include "dtensor/core/tensor.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/redistribute/plan.h"

namespace dtensor {

/// The one collective a plan runs, when it runs no other: plans with
/// equal signatures on one mesh can share a call.
struct CollectiveSignature {
  StepKind kind = StepKind::AllReduce;
  std::vector<int> mesh_dims;
  DType dtype = DType::Float32;
  /// AllReduce and ReduceScatter: the Partial's op; nullopt for AllGather.
  std::optional<ReduceOp> op;
  bool operator==(const CollectiveSignature&) const = default;
};

/// The signature of a plan whose first step is an AllReduce, ReduceScatter
/// or AllGather and whose other steps are local (a slice after an
/// all_reduce: the planner's P -> S for small tensors); nullopt for every
/// other plan (no steps, another kind, or a second collective), which must
/// run alone.
std::optional<CollectiveSignature> coalescible_signature(const Plan& plan);

/// Runs plans[i] on locals[i] for every i with one collective call for all
/// of them: the shards are packed into one buffer (rank r's pieces of every
/// tensor together, in the order given, so uneven and empty shards need no
/// padding: the communicator's variable-count forms carry them), the
/// collective runs, the results are unpacked, and each plan's local steps
/// run after it. Returns what
/// execute_plan(plans[i], mesh, locals[i]) returns, value for value (an
/// all_reduce's sums in an order that may differ, so rounding sums may differ
/// in the last bits); the
/// communicator counts the bytes of the one call (all_gather and
/// reduce_scatter: the sum of the plans' bytes on every rank; all_reduce:
/// the same summed over the group, per rank off by the rounding of the
/// split of the packed count).
/// Every rank of the mesh calls it with the same plans in the same order.
/// Errors: ValueError if the spans differ in length or are empty,
/// LayoutError if the signatures are missing or differ (naming plan i and
/// both), DTypeError / LayoutError as execute_plan for a bad shard.
std::vector<Tensor> execute_coalesced(std::span<const Plan* const> plans, const DeviceMesh& mesh,
                                      std::span<const Tensor> locals);

/// execute_coalesced's call, started: packed now, the collective run on the
/// rank's communication worker (Communicator::start_*), unpacked by
/// finish(), which waits for it and returns what execute_coalesced would
/// have, bit for bit (the same packing and the same call). The plans and
/// shards are held by the started call; `mesh` must outlive finish(). A
/// started call dropped unfinished still waits for its collective (Work's
/// destructor). Every rank starts the same calls in the same order.
class StartedCoalesced {
 public:
  struct State;
  explicit StartedCoalesced(std::unique_ptr<State> state);
  StartedCoalesced(StartedCoalesced&&) noexcept;
  StartedCoalesced& operator=(StartedCoalesced&&) noexcept;
  ~StartedCoalesced();
  /// Waits and unpacks; errors of the call are thrown here. ValueError on a
  /// second call.
  std::vector<Tensor> finish();

 private:
  std::unique_ptr<State> state_;
};

/// Errors as execute_coalesced's, thrown before anything starts.
StartedCoalesced start_coalesced(std::span<const Plan* const> plans, const DeviceMesh& mesh,
                                 std::span<const Tensor> locals);

}  // namespace dtensor

/// "all_reduce(sum) on mesh dims [0] of f32".
template <>
struct fmt::formatter<dtensor::CollectiveSignature> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  fmt::format_context::iterator format(const dtensor::CollectiveSignature& s, fmt::format_context& ctx) const;
};
