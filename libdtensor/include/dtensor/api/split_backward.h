#pragma once
// A backward in two halves, for zero-bubble pipeline schedules: the input
// gradient now (the I action), the weights' later (W).
//
//   DeferredGradients weights = backward_input(stage_output, grad, {stage_input});
//   send(stage_input.grad());   // the previous stage waits only for this
//   ...
//   weights.run();               // later, where the schedule puts W
#include <memory>
#include <span>

#include "dtensor/api/dtensor_tensor.h"

namespace dtensor {

/// The second half of a backward that backward_input split in two: the
/// gradients it deferred (the weights'), computed by run() when the caller
/// chooses (a zero-bubble pipeline's W action, after the I action sent the
/// input gradient on). It holds the part of the graph they need; dropping
/// it without run() drops those gradients.
class DeferredGradients {
 public:
  DeferredGradients();
  DeferredGradients(DeferredGradients&&) noexcept;
  DeferredGradients& operator=(DeferredGradients&&) noexcept;
  ~DeferredGradients();
  /// Computes the deferred gradients and accumulates them into their leaves,
  /// as backward would have; every rank runs it alike (its collectives
  /// match). AutogradError if it already ran.
  void run();
  /// Whether run() has work left.
  bool pending() const;

  struct State;
  explicit DeferredGradients(std::unique_ptr<State> state);

 private:
  std::unique_ptr<State> state_;
};

/// output.backward(grad) in two halves, for zero-bubble pipelines (ZB-H1,
/// ZBV: the I and W actions; Qi et al. 2024). Now: only what reaches the
/// leaves `inputs` (a stage's input activation) is computed, and their
/// gradients are accumulated. Later, the returned object's run(): the rest
/// (the gradients of every other leaf, the weights). Each op's backward
/// rule runs once per half for just the inputs that half needs (a linear's
/// input gradient now, its weight gradient later), so the two halves do the
/// work of one backward between them and give the same gradients.
/// AutogradError unless every input is a leaf that requires a gradient and
/// the output is reached from at least one of them.
DeferredGradients backward_input(const Tensor& output, const Tensor& grad, std::span<const Tensor> inputs);
DeferredGradients backward_input(const DTensor& output, const DTensor& grad, std::span<const DTensor> inputs);
/// The same for a 0-d loss, whose gradient is one (as loss.backward()).
DeferredGradients backward_input(const Tensor& loss, std::span<const Tensor> inputs);
DeferredGradients backward_input(const DTensor& loss, std::span<const DTensor> inputs);

}  // namespace dtensor
