#pragma once
// DDP's gradient all_reduce, or ZeRO's reduce_scatter, started during the
// backward (PyTorch DDP's overlap, Megatron's --overlap-grad-reduce): each
// bucket's collective starts as soon as the backward has completed the last
// gradient in it, on the rank's communication worker, while the backward
// goes on; finish() waits for them and leaves every gradient in the layout
// its update reads: its parameter's (DDP), or the optimizer's state layout
// (ZeRO-1 and 2: Shard where the parameter is Replicate, so each rank
// receives only its part of the sum).
//
//   nn::OverlappedGradientReduction overlap(params);   // hooks the parameters
//   loss.backward();                                   // buckets start here
//   overlap.finish();                                  // gradients reduced
//   optimizer.step();
//
// Overlap changes when, never what: the buckets are the calls
// redistribute_all makes for the same gradients (coalesced_calls), learnt
// in the first step (which reduces them all in finish(), as the blocking
// path does) and started one by one from the second, so the values are
// bit for bit those of the blocking path and the collectives, their counts
// and bytes, the same. The calls are counted when finish() waits for them.
#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "dtensor/api/autograd.h"
#include "dtensor/api/coalesced.h"
#include "dtensor/nn/optim.h"

namespace dtensor::nn {

class OverlappedGradientReduction {
 public:
  /// Hooks every parameter that requires a gradient (on_gradient_ready).
  /// The parameters must outlive this object and keep their addresses.
  /// `reduce_to`: empty (each parameter's own layout), or one layout per
  /// parameter (an optimizer's state_layout(i), for ZeRO). `buckets`: those
  /// of the optimizer's step, which the first step reduces as.
  explicit OverlappedGradientReduction(std::span<DTensor> params, std::vector<Layout> reduce_to = {},
                                       CoalesceOptions buckets = gradient_buckets());
  OverlappedGradientReduction(const OverlappedGradientReduction&) = delete;
  OverlappedGradientReduction& operator=(const OverlappedGradientReduction&) = delete;
  /// Destroyed, it unhooks the parameters first (hooks_ is the last member)
  /// and then waits for what is still in flight (Work's destructor); those
  /// gradients are dropped.

  /// Whether the next backwards start buckets: off for every micro-batch
  /// but the last, whose backward completes the gradients (DDP's no_sync).
  void set_enabled(bool on) { enabled_ = on; }

  /// Waits for the started buckets, reduces what did not start (all of it
  /// in the first step, and any bucket whose gradients came in a layout
  /// other than the learnt one), and writes each reduced gradient into its
  /// parameter. Every rank calls it after the same backwards.
  void finish();

  /// Buckets started during the last backward (0 in the first step).
  std::size_t started_last_step() const { return started_last_step_; }

 private:
  void ready(std::size_t param);
  void start(std::size_t bucket);

  std::vector<DTensor*> params_;
  std::vector<Layout> targets_;  // per parameter: the layout its gradient is reduced to
  CoalesceOptions coalesce_;
  bool enabled_ = true;
  // Learnt in the first finish(): each bucket's parameters and the layouts
  // their gradients came in.
  std::vector<std::vector<std::size_t>> buckets_;
  std::vector<Layout> grad_layouts_;
  std::vector<std::optional<std::size_t>> bucket_of_;
  // This step's state.
  std::vector<std::size_t> pending_;  // per bucket: gradients not yet complete
  std::vector<std::optional<StartedRedistribution>> started_;
  std::size_t started_last_step_ = 0;
  std::vector<GradientReadyHook> hooks_;  // last: removed before the rest goes
};

}  // namespace dtensor::nn
