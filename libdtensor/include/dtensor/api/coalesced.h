#pragma once
// Redistributing many DTensors at once: what DDP does with its gradient
// buckets, as a general capability of the library.
//
//   std::vector<DTensor> grads = ...;                 // P(sum) over dp
//   std::vector<Layout> want(grads.size(), Layout::parse("R"));
//   auto reduced = redistribute_all(grads, want);     // one all_reduce per 25 MiB bucket
//
// Each move is planned by the planner, as DTensor::redistribute plans it.
// Moves whose plan is one all_reduce, reduce_scatter or all_gather (then
// local steps only, as in an all_reduce then a slice), with the same mesh
// dims, dtype and reduce op, share one collective call per bucket; every
// other move (no-op, two collectives, all_to_all, exchange, local steps
// only) runs as its own redistribute, except that a direct exchange
// that is also an all_gather's move (Shard -> Replicate; the planner prefers
// the exchange alone where few ranks hold data) joins that all_gather's
// bucket when other moves run it anyway: the same bytes, one call fewer.
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "dtensor/api/dtensor_tensor.h"
#include "dtensor/core/placement.h"

namespace dtensor {

enum class BucketOrder { AsGiven, LastFirst };

struct CoalesceOptions {
  /// The most bytes (MiB of 2^20 bytes) one bucket holds: moves join a
  /// bucket while the sum of their sizes stays within it; a move larger than
  /// a bucket goes alone. A move's size is the larger of its input and output
  /// shard at mesh coordinate 0 (the largest torch.chunk piece of every
  /// split), the same number on every rank, so every rank cuts the buckets
  /// at the same places and no rank's staging exceeds the bound. 25 MiB is
  /// DDP's default bucket_cap_mb.
  double bucket_mib = 25;
  /// The bound of each collective's first bucket, where it differs: a small
  /// first bucket starts its call sooner (PyTorch DDP's is 1 MiB).
  std::optional<double> first_bucket_mib{};
  /// The order moves fill buckets: as given, or from the last tensor to the
  /// first, the order a backward completes a model's gradients (PyTorch DDP
  /// fills its buckets from the last parameter).
  BucketOrder order = BucketOrder::AsGiven;
};

/// ValueError, naming `caller` and the bad bound, unless bucket_mib and
/// first_bucket_mib (where given) are finite numbers > 0.
void check_coalesce_options(const CoalesceOptions& options, std::string_view caller);

/// Returns, for every i, the value of tensors[i].redistribute(targets[i]):
/// the same local values and the same layout (and cost model); a packed
/// all_reduce adds the same addends, but which rank starts each element's sum
/// moves with the packing, so where a float sum rounds its last bits may
/// differ (as in DDP's buckets); exact sums, and every other kind, are
/// identical bit for bit. Moves that
/// share a collective (above) are packed into buckets in the options'
/// order: a move joins the open bucket of its collective unless that would
/// exceed bucket_mib (first_bucket_mib for that collective's first bucket),
/// which then closes and a new one opens. Buckets run in the
/// order of their first move, after the moves that run alone (in the order
/// given); a bucket of one move is an ordinary redistribute. The
/// communicator counts the bytes each packed call moves (CommStats): for
/// all_gather and reduce_scatter the sum of the per-tensor plans' bytes on
/// every rank; for all_reduce the same summed over the group.
///
/// Every rank of the mesh calls it with the same tensors' layouts, shapes
/// and dtypes in the same order (as with any collective).
///
/// Autograd: while grad mode is on, the call is recorded as one node for
/// all the tensors that require a gradient: their gradients go back to the
/// inputs' layouts (Partial replaced by Replicate, as redistribute()'s
/// backward sends them) by one redistribute_all, run when the last of them
/// has arrived. FSDP's gather of many parameters is one all_gather forward
/// and one reduce_scatter backward.
///
/// Errors: ValueError if the spans differ in length or bucket_mib (or
/// first_bucket_mib) is not a finite number > 0; MeshError if the tensors
/// are not all on tensor 0's mesh (naming the index); LayoutError for a
/// target redistribute rejects.
std::vector<DTensor> redistribute_all(std::span<const DTensor> tensors, std::span<const Layout> targets,
                                      CoalesceOptions options = {});

/// How redistribute_all(tensors, targets, options) splits its moves into
/// calls: each move that runs alone as a list of its index, then each
/// bucket's indices, in the order it runs them (a bucket's in the order it
/// packs them); moves that change nothing are in none. Where no move is an
/// exchange riding along an all_gather (as with DDP's all_reduces and ZeRO's
/// reduce_scatters), a group of these passed in its order to
/// redistribute_all (or start_redistribute_all) with one_call() runs as
/// exactly that one call, packed alike: how DDP's overlap starts the same
/// buckets one by one.
std::vector<std::vector<std::size_t>> coalesced_calls(std::span<const DTensor> tensors, std::span<const Layout> targets,
                                                      CoalesceOptions options = {});

/// Options that make a group of coalesced_calls() one call: no bound, the
/// order given.
inline CoalesceOptions one_call() { return {.bucket_mib = 1e18}; }  // an exabyte: no bound

/// redistribute_all, started: the moves are planned and bucketed as
/// redistribute_all does, the moves that run alone run now, and each
/// bucket's packed collective is started on the rank's communication worker
/// (Communicator::start_*), so the caller computes while the buckets move.
/// wait() returns what redistribute_all returns for the same arguments, bit
/// for bit (the same buckets, the same packing, the same calls), and is
/// where the calls are counted and their errors thrown; each is waited for
/// once (ValueError on a second wait). Not recorded by autograd: the
/// tensors are taken detached (a started redistribution is for values such
/// as gradients, not for a graph). The call may read the inputs' bytes
/// until wait() (a lone tensor whose shards are row ranges in rank order is
/// sent without a packing copy): do not change them in place before it. The
/// mesh must outlive wait(). Every rank
/// starts the same calls in the same order, and may start several before
/// waiting for any.
class StartedRedistribution {
 public:
  struct State;
  explicit StartedRedistribution(std::unique_ptr<State> state);
  StartedRedistribution(StartedRedistribution&&) noexcept;
  StartedRedistribution& operator=(StartedRedistribution&&) noexcept;
  ~StartedRedistribution();
  std::vector<DTensor> wait();

 private:
  std::unique_ptr<State> state_;
};

/// Errors as redistribute_all's, thrown before anything starts.
StartedRedistribution start_redistribute_all(std::span<const DTensor> tensors, std::span<const Layout> targets,
                                             CoalesceOptions options = {});

/// One DTensor's redistribute, started now and finished by wait(), and
/// recorded by autograd (unlike start_redistribute_all) when x needs a
/// gradient: the tool of Domino's tensor-parallel overlap, where one half
/// batch's collective runs under the other half's computation.
///
///   StartedRedistribute pending = start_redistribute(partial_sum, Layout::parse("R"));
///   DTensor other = compute(other_half);        // runs while the all_reduce moves
///   DTensor reduced = pending.wait();           // x.redistribute(R)'s value
///
/// The backward mirrors the forward: the gradient's layout change (to x's
/// layout with Partial replaced by Replicate, as redistribute()'s backward
/// sends it) starts where the forward waited, and is waited for where the
/// forward started. The backward runs nodes newest first, so whatever the
/// forward recorded between start and wait runs between them in the
/// backward too, under the gradient's collective. That holds even where the
/// forward moves nothing (x already in `target`: Megatron's identity before
/// a column-parallel linear, whose gradient arrives Partial and is
/// all_reduced).
///
/// wait() returns the value of start_redistribute_all({x}, {target}).wait()
/// (the forward and the backward each plan and run the same calls as that),
/// and is where the forward's calls are counted and their errors thrown;
/// the backward's are counted where it waits. With started = false both
/// wait at once: the same values, calls and order of calls, unoverlapped
/// (the reference an overlapped run is compared with, bit for bit).
/// ValueError on a second wait(). Errors as redistribute's, thrown by
/// start_redistribute before anything starts.
class StartedRedistribute {
 public:
  struct State;
  explicit StartedRedistribute(std::shared_ptr<State> state);
  DTensor wait();

 private:
  std::shared_ptr<State> state_;
};
StartedRedistribute start_redistribute(const DTensor& x, const Layout& target, bool started = true);

}  // namespace dtensor
