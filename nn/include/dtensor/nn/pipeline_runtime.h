#pragma once
// Running a pipeline: one rank executes its list of a lowered Schedule
// (pipeline.h), in order, on the stages it holds (pipeline_stage.h). F runs
// a stage's forward on a microbatch and keeps what its backward needs; B
// runs that backward, or I and W its two halves (zero-bubble schedules); SEND_F/RECV_F and SEND_B/RECV_B move the
// residual stream and its gradient to the neighbouring stage's rank over the `pp` communicator. A different schedule is
// a different list, not other code.
//
//   auto lowered = nn::pipeline::lower(nn::pipeline::make_schedule("1f1b", p, m));
//   nn::pipeline::check_runnable(lowered);                 // before any message
//   auto losses = nn::pipeline::run_step(lowered, my_stages, mesh.dim_comm(pp_dim), inputs);
//
// Every wait keeps the communicator's deadline; a failed or stalled peer
// ends the step with the same error type (CommTimeout, PeerFailed, ...)
// naming this rank's stage and action.
#include <optional>
#include <span>
#include <vector>

#include "dtensor/mesh/communicator.h"
#include "dtensor/nn/pipeline.h"
#include "dtensor/nn/pipeline_stage.h"

namespace dtensor::nn::pipeline {

/// One step's microbatches, indexed by microbatch: the tokens (the first
/// stage reads them, every stage takes the activation's batch and sequence
/// sizes from them), the targets (the last stage's loss reads them), and
/// each microbatch's loss scale, its tokens over the whole step's: the
/// backward of the scaled losses accumulates the step's mean gradient, with
/// no division by m afterwards.
template <TensorOrDTensor X>
struct StepInputs {
  std::vector<X> tokens, targets;
  std::vector<double> loss_scales;
};

/// The scales of `microbatches` microbatches of `tokens_each` tokens each.
std::vector<double> equal_loss_scales(std::int64_t microbatches, std::int64_t tokens_each);

/// A ValueError if a schedule over several ranks has no messages (lower()
/// it first). Every kind of action runs: F, B, the split backward's I
/// (backward_input: the input's gradient, sent on at once) and W (the
/// weights', where the schedule puts it), and the messages.
void check_runnable(const Schedule& schedule);

/// The forward-only schedule of `microbatches` microbatches on `placement`'s
/// stages and ranks (validation): each microbatch through every stage in
/// order, with its messages, before the next.
Schedule forward_only(const Schedule& placement, int microbatches);

/// What one rank did in one step, measured: each of its actions (compute
/// and messages) with its start and end in seconds from the step's start on
/// this rank's clock, and the step's length on it (up to its last action).
struct StepTimeline {
  std::vector<TimedAction> actions;
  double seconds = 0;

  /// Time in compute actions (F, B, I, W).
  double busy() const;
  /// (seconds - busy) / seconds: this rank's share of the step spent
  /// waiting on messages or on nothing, its bubble as measured.
  double idle_fraction() const;
};

/// The measured bubble: each rank's idle_fraction, averaged over ranks, as
/// simulate()'s bubble_fraction averages the predicted one.
double bubble_fraction(std::span<const StepTimeline> ranks);

/// Runs rank `pp.rank()`'s actions of `schedule` (lowered, or
/// forward_only()) on `stages`, this rank's stages in
/// schedule.stages_of_rank order. Returns each microbatch's loss (unscaled)
/// on every rank of `pp`: the last stage's rank broadcasts them. Gradients
/// accumulate into the stages' parameters; under a NoGradGuard only the
/// forwards run. With `timeline`, each action's start and end are recorded
/// into it (two clock reads per action). While a trace records, each action
/// is an event on the rank's "scopes" track, named as it prints ("1F3").
template <TensorOrDTensor X>
std::vector<double> run_step(const Schedule& schedule, std::span<GPTStage<X>* const> stages, Communicator& pp,
                             const StepInputs<X>& inputs, StepTimeline* timeline = nullptr);

/// A tied model's two copies of the token embedding's weight (the first
/// stage's wte, the last stage's lm_head: GPTStage::holds_tied_copy) made
/// one again after a step's backward: each copy's gradient becomes the sum
/// of both, first + last (bitwise the same on both), so that the two
/// updates stay equal. Where one rank holds both stages (a V schedule) the
/// sum is local; otherwise the two ranks exchange their gradients over `pp`
/// (one send and one receive each, of the gradient's local bytes in the
/// parameter's layout: a Partial gradient is reduced to it first). Nothing
/// happens untied, on one stage, or on the ranks between. AutogradError if a
/// copy has no gradient.
template <TensorOrDTensor X>
void sum_tied_gradients(const Schedule& placement, std::span<GPTStage<X>* const> stages, Communicator& pp);

/// One forward of `tokens` ([B, n]: the positions after those the caches
/// hold) through every stage in order, for generation: no schedule, no
/// microbatches; each rank runs its stages as the activation reaches them,
/// receiving it from and sending it to the neighbouring stages' ranks.
/// `caches` holds one KVCache per stage of this rank (in `stages` order),
/// each extended by n positions. Returns the logits on the last stage's
/// rank, none elsewhere.
template <TensorOrDTensor X>
std::optional<X> forward_through(const Schedule& placement, std::span<GPTStage<X>* const> stages, Communicator& pp,
                                 const X& tokens, std::span<KVCache<X>> caches);

}  // namespace dtensor::nn::pipeline
