// The pipeline runtime: one rank's actions of a schedule, run in order.
#include "dtensor/nn/pipeline_runtime.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "dtensor/api/autograd.h"
#include "dtensor/api/trace.h"
#include "dtensor/api/pointwise.h"
#include "dtensor/api/split_backward.h"
#include "dtensor/core/error.h"

namespace dtensor::nn::pipeline {

std::vector<double> equal_loss_scales(std::int64_t microbatches, std::int64_t tokens_each) {
  // Each microbatch's tokens over the step's: 1/m when they are equal, but
  // written as the rule, so that unequal microbatches would weigh right.
  const double step_tokens = static_cast<double>(microbatches * tokens_each);
  return std::vector<double>(static_cast<std::size_t>(microbatches), static_cast<double>(tokens_each) / step_tokens);
}

void check_runnable(const Schedule& schedule) {
  if (schedule.ranks() > 1 && !schedule.has_communication())
    throw ValueError(fmt::format("[pipeline] schedule '{}' spans {} ranks but has no SEND/RECV actions; lower() it",
                                 schedule.name, schedule.ranks()));
}

double StepTimeline::busy() const {
  double sum = 0;
  for (const TimedAction& a : actions)
    if (is_compute(a.action.kind)) sum += a.end - a.start;
  return sum;
}

double StepTimeline::idle_fraction() const { return seconds > 0 ? (seconds - busy()) / seconds : 0; }

double bubble_fraction(std::span<const StepTimeline> ranks) {
  if (ranks.empty()) return 0;
  double sum = 0;
  for (const StepTimeline& t : ranks) sum += t.idle_fraction();
  return sum / static_cast<double>(ranks.size());
}

Schedule forward_only(const Schedule& placement, int microbatches) {
  Schedule out{placement.name + " forward", placement.stages, microbatches, placement.stages_of_rank, {}};
  out.actions.resize(static_cast<std::size_t>(placement.ranks()));
  auto add = [&](int stage, ActionKind kind, int mb) {
    out.actions[static_cast<std::size_t>(placement.rank_of_stage(stage))].push_back(Action{stage, kind, mb});
  };
  for (int mb = 0; mb < microbatches; ++mb)
    for (int s = 0; s < placement.stages; ++s) {
      const bool received = s > 0 && placement.rank_of_stage(s - 1) != placement.rank_of_stage(s);
      if (received) add(s, ActionKind::RecvForward, mb);
      add(s, ActionKind::Forward, mb);
      if (s + 1 < placement.stages && placement.rank_of_stage(s + 1) != placement.rank_of_stage(s))
        add(s, ActionKind::SendForward, mb);
    }
  return out;
}

namespace {

using Key = std::pair<int, int>;  // (stage, microbatch)

// A tensor's bytes on this rank, and a tensor made from received bytes.
Tensor local_of(const Tensor& x) { return x.detach(); }
Tensor local_of(const DTensor& x) { return x.detach().to_local(); }
double first_value(const Tensor& x) { return x.to(DType::Float64).data_as<double>()[0]; }
double first_value(const DTensor& x) { return first_value(x.full_tensor()); }

// The layout the residual stream crosses a stage boundary in: the plan's
// at the embedding's output (what every block takes and gives back).
template <TensorOrDTensor X>
struct Boundary;
template <>
struct Boundary<Tensor> {
  static Tensor to_boundary(const Tensor& x, const ActivationLayouts&) { return x; }
  static Shape local_shape(const Tensor&, const Shape& global, const ActivationLayouts&) { return global; }
  static Tensor wrap(Tensor local, const Tensor&, const Shape&, const ActivationLayouts&) { return local; }
};
template <>
struct Boundary<DTensor> {
  static Layout layout(const DTensor& like, const ActivationLayouts& layouts) {
    return layouts[Point::TokenEmbedding].value_or(Layout::replicated(like.mesh().ndim()));
  }
  static DTensor to_boundary(const DTensor& x, const ActivationLayouts& layouts) {
    const Layout want = layout(x, layouts);
    return x.placements() == want ? x : x.redistribute(want);
  }
  static Shape local_shape(const DTensor& tokens, const Shape& global, const ActivationLayouts& layouts) {
    const DeviceMesh& mesh = tokens.mesh();
    return local_box(mesh.shape(), global, layout(tokens, layouts), mesh.coordinate()).size;
  }
  static DTensor wrap(Tensor local, const DTensor& tokens, const Shape& global, const ActivationLayouts& layouts) {
    return DTensor::from_local(std::move(local), tokens.mesh(), layout(tokens, layouts), global, FromLocalCheck::Trust);
  }
};

// One rank's step: the state between its actions, by (stage, microbatch).
template <TensorOrDTensor X>
class StepRunner {
 public:
  StepRunner(const Schedule& schedule, std::span<GPTStage<X>* const> stages, Communicator& pp,
             const StepInputs<X>& inputs)
      : schedule_(schedule), pp_(pp), inputs_(inputs), losses_(static_cast<std::size_t>(schedule.microbatches), 0.0) {
    const auto& mine = schedule.stages_of_rank.at(static_cast<std::size_t>(pp.rank()));
    if (mine.size() != stages.size())
      throw ValueError(fmt::format("[pipeline] rank {} of schedule '{}' holds {} stages; {} were given", pp.rank(),
                                   schedule.name, mine.size(), stages.size()));
    for (std::size_t i = 0; i < mine.size(); ++i) stages_[mine[i]] = stages[i];
  }

  void run(const Action& action) {
    switch (action.kind) {
      case ActionKind::Forward: return forward(action.stage, action.microbatch);
      case ActionKind::Backward: return backward(action.stage, action.microbatch);
      case ActionKind::BackwardInput: return input_gradient(action.stage, action.microbatch);
      case ActionKind::BackwardWeight: return weight_gradient(action.stage, action.microbatch);
      case ActionKind::SendForward: return send(action, forward_out_, action.stage + 1);
      case ActionKind::SendBackward: return send(action, backward_out_, action.stage - 1);
      case ActionKind::RecvForward: return receive(action, forward_in_, action.stage - 1);
      case ActionKind::RecvBackward: return receive(action, backward_in_, action.stage + 1);
    }
  }

  std::vector<double>& losses() { return losses_; }

 private:
  GPTStage<X>& stage(int s) { return *stages_.at(s); }
  bool here(int s) const { return stages_.count(s) > 0; }
  Shape activation_shape(int mb) const {
    const Shape& tokens = inputs_.tokens.at(static_cast<std::size_t>(mb)).shape();
    return {tokens[0], tokens[1], stages_.begin()->second->config.d_model};
  }

  void forward(int s, int mb) {
    const auto m = static_cast<std::size_t>(mb);
    X input = inputs_.tokens.at(m);
    if (!stage(s).is_first()) {
      input = take(forward_in_, {s, mb}, "activation").detach();
      if (grad_enabled()) input.requires_grad_();
    }
    X output = stage(s).forward(input);
    if (stage(s).is_last()) {
      const X loss = stage(s).loss(output, inputs_.targets.at(m));
      losses_[m] = first_value(loss);
      const double scale = inputs_.loss_scales.empty() ? 1.0 : inputs_.loss_scales.at(m);
      output = scale != 1.0 ? mul(loss, scale) : loss;
    } else {
      // The next stage's input: sent, or handed over where it lives here.
      X sent = Boundary<X>::to_boundary(output, stage(s).layouts).detach();
      if (here(s + 1))
        forward_in_.insert_or_assign(Key{s + 1, mb}, std::move(sent));
      else
        forward_out_.insert_or_assign(Key{s, mb}, std::move(sent));
    }
    if (grad_enabled())
      held_.emplace(Key{s, mb}, Held{stage(s).is_first() ? std::nullopt : std::optional(input), output});
  }

  void backward(int s, int mb) {
    Held held = take(held_, {s, mb}, "forward");
    if (stage(s).is_last())
      held.output.backward();
    else
      held.output.backward(take(backward_in_, {s, mb}, "gradient"));
    if (!stage(s).is_first()) pass_back(s, mb, *held.input);
  }

  // I: the input's gradient only (what the previous stage waits for); the
  // weights' half waits in deferred_ for W. The first stage has no input to
  // pass back, so its I does nothing and its W runs the whole backward.
  void input_gradient(int s, int mb) {
    if (stage(s).is_first()) return;
    Held held = take(held_, {s, mb}, "forward");
    const X inputs[] = {*held.input};
    deferred_.emplace(Key{s, mb}, stage(s).is_last()
                                      ? backward_input(held.output, inputs)
                                      : backward_input(held.output, take(backward_in_, {s, mb}, "gradient"), inputs));
    pass_back(s, mb, *held.input);
  }

  // W: the weights' gradients, accumulated into the stage's parameters.
  void weight_gradient(int s, int mb) {
    if (stage(s).is_first()) return backward(s, mb);
    take(deferred_, {s, mb}, "input gradient (I)").run();
  }

  // The gradient of a stage's input, on to the stage before.
  void pass_back(int s, int mb, const X& input) {
    const std::optional<X> grad = input.grad();
    if (!grad)
      throw AutogradError(fmt::format("[pipeline] stage {} microbatch {}: no gradient reached its input", s, mb));
    X sent = Boundary<X>::to_boundary(*grad, stage(s).layouts);
    if (here(s - 1))
      backward_in_.insert_or_assign(Key{s - 1, mb}, std::move(sent));
    else
      backward_out_.insert_or_assign(Key{s, mb}, std::move(sent));
  }

  void send(const Action& action, std::map<Key, X>& outbox, int peer_stage) {
    const Tensor local = local_of(take(outbox, {action.stage, action.microbatch}, "message"));
    pp_.send(local.data(), local.nbytes(), schedule_.rank_of_stage(peer_stage), tag(action));
  }

  void receive(const Action& action, std::map<Key, X>& inbox, int peer_stage) {
    const GPTStage<X>& to = stage(action.stage);
    const X& tokens = inputs_.tokens.at(static_cast<std::size_t>(action.microbatch));
    const Shape global = activation_shape(action.microbatch);
    Tensor local = Tensor::empty(Boundary<X>::local_shape(tokens, global, to.layouts), to.config.dtype);
    pp_.recv(local.data(), local.nbytes(), schedule_.rank_of_stage(peer_stage), tag(action));
    inbox.insert_or_assign(Key{action.stage, action.microbatch},
                           Boundary<X>::wrap(std::move(local), tokens, global, to.layouts));
  }

  // Unique per message, so that a send meets exactly its receive: the
  // boundary (by the sending stage), the microbatch and the direction.
  int tag(const Action& action) const {
    const bool forward = action.kind == ActionKind::SendForward || action.kind == ActionKind::RecvForward;
    const int sender = action.kind == ActionKind::RecvForward    ? action.stage - 1
                       : action.kind == ActionKind::RecvBackward ? action.stage + 1
                                                                 : action.stage;
    return 2 * (sender * schedule_.microbatches + action.microbatch) + (forward ? 0 : 1);
  }

  template <class V>
  static V take(std::map<Key, V>& from, Key key, const char* what) {
    const auto it = from.find(key);
    if (it == from.end())
      throw ValueError(fmt::format("[pipeline] stage {} microbatch {}: its {} is not here yet (an action out of order)",
                                   key.first, key.second, what));
    V out = std::move(it->second);
    from.erase(it);
    return out;
  }

  struct Held {
    std::optional<X> input;  // the leaf the gradient to send arrives at (not on the first stage)
    X output;                // the stage's output, or the scaled loss on the last stage
  };

  const Schedule& schedule_;
  Communicator& pp_;
  const StepInputs<X>& inputs_;
  std::map<int, GPTStage<X>*> stages_;
  std::map<Key, X> forward_in_, forward_out_, backward_in_, backward_out_;
  std::map<Key, Held> held_;
  std::map<Key, DeferredGradients> deferred_;  // split backwards between their I and W
  std::vector<double> losses_;
};

// The same error type, with the rank, stage and action in front.
[[noreturn]] void rethrow_at(const Schedule& schedule, int rank, std::size_t position, const Action& action) {
  const auto where = [&](const std::exception& e) {
    return fmt::format("[pipeline] schedule '{}', rank {}, stage {}, action {} ({}): {}", schedule.name, rank,
                       action.stage, position, action, e.what());
  };
  try {
    throw;
  } catch (const CommTimeout& e) {
    throw CommTimeout(where(e));
  } catch (const PeerFailed& e) {
    throw PeerFailed(where(e));
  } catch (const CommError& e) {
    throw CommError(where(e));
  }
}

}  // namespace

template <TensorOrDTensor X>
std::vector<double> run_step(const Schedule& schedule, std::span<GPTStage<X>* const> stages, Communicator& pp,
                             const StepInputs<X>& inputs, StepTimeline* timeline) {
  check_runnable(schedule);
  if (pp.size() != schedule.ranks())
    throw ValueError(fmt::format("[pipeline] schedule '{}' has {} ranks; the pp communicator {}", schedule.name,
                                 schedule.ranks(), pp.size()));
  StepRunner<X> runner(schedule, stages, pp, inputs);
  const auto& mine = schedule.actions.at(static_cast<std::size_t>(pp.rank()));
  using Clock = std::chrono::steady_clock;
  const Clock::time_point step_start = Clock::now();
  const auto since_start = [&] { return std::chrono::duration<double>(Clock::now() - step_start).count(); };
  if (timeline) *timeline = StepTimeline{};
  for (std::size_t i = 0; i < mine.size(); ++i) {
    const double start = timeline ? since_start() : 0;
    try {
      const TraceRegion traced([&] { return action_text(mine[i]); });
      runner.run(mine[i]);
    } catch (const CommError&) {
      rethrow_at(schedule, pp.rank(), i, mine[i]);
    }
    if (timeline) timeline->actions.push_back({pp.rank(), mine[i], start, since_start()});
  }
  if (timeline) timeline->seconds = timeline->actions.empty() ? 0 : timeline->actions.back().end;
  std::vector<double>& losses = runner.losses();
  pp.broadcast(losses.data(), losses.size() * sizeof(double), schedule.rank_of_stage(schedule.stages - 1));
  return losses;
}

namespace {
// A gradient in its parameter's layout (no Partial left), and a tensor
// made from the peer's bytes of one in the same layout.
Tensor in_parameter_layout(const Tensor& grad, const Tensor&) { return grad; }
DTensor in_parameter_layout(const DTensor& grad, const DTensor& param) {
  return grad.placements() == param.placements() ? grad : grad.redistribute(param.placements());
}
Tensor like(Tensor local, const Tensor&) { return local; }
DTensor like(Tensor local, const DTensor& grad) {
  return DTensor::from_local(std::move(local), grad.mesh(), grad.placements(), grad.shape(), FromLocalCheck::Trust);
}

template <TensorOrDTensor X>
X tied_gradient(X& param, int stage) {
  const std::optional<X> grad = param.grad();
  if (!grad)
    throw AutogradError(fmt::format(
        "[pipeline] stage {}: the tied embedding's weight has no gradient; sum_tied_gradients runs after a step's "
        "backward",
        stage));
  return in_parameter_layout(*grad, param);
}
}  // namespace

template <TensorOrDTensor X>
void sum_tied_gradients(const Schedule& placement, std::span<GPTStage<X>* const> stages, Communicator& pp) {
  GPTStage<X>*first = nullptr, *last = nullptr;
  for (GPTStage<X>* stage : stages) {
    if (stage->is_first()) first = stage;
    if (stage->holds_tied_copy()) last = stage;
  }
  const bool tied = !stages.empty() && stages.front()->config.tie_embeddings && placement.stages > 1;
  if (!tied || (!first && !last)) return;
  NoGradGuard no_grad;
  if (first && last) {
    const X sum = tied_gradient(first->wte->weight, 0) + tied_gradient(last->lm_head->weight, last->stage);
    first->wte->weight.set_grad(sum);
    last->lm_head->weight.set_grad(sum);
    return;
  }
  X& param = first ? first->wte->weight : last->lm_head->weight;
  const X mine = tied_gradient(param, first ? 0 : last->stage);
  const Tensor local = local_of(mine);
  Tensor theirs = Tensor::empty(local.shape(), local.dtype());
  // One tag past every microbatch message's, and the first stage's rank
  // sends first: never two sends facing each other.
  const int tag = 2 * placement.stages * placement.microbatches;
  const int peer = placement.rank_of_stage(first ? placement.stages - 1 : 0);
  if (first) {
    pp.send(local.data(), local.nbytes(), peer, tag);
    pp.recv(theirs.data(), theirs.nbytes(), peer, tag);
  } else {
    pp.recv(theirs.data(), theirs.nbytes(), peer, tag);
    pp.send(local.data(), local.nbytes(), peer, tag);
  }
  const X other = like(std::move(theirs), mine);
  param.set_grad(first ? mine + other : other + mine);
}

template <TensorOrDTensor X>
std::optional<X> forward_through(const Schedule& placement, std::span<GPTStage<X>* const> stages, Communicator& pp,
                                 const X& tokens, std::span<KVCache<X>> caches) {
  const auto& mine = placement.stages_of_rank.at(static_cast<std::size_t>(pp.rank()));
  if (mine.size() != stages.size() || caches.size() != stages.size())
    throw ValueError(fmt::format("[pipeline] rank {} holds {} stages; {} stages and {} caches were given", pp.rank(),
                                 mine.size(), stages.size(), caches.size()));
  const Shape global{tokens.shape()[0], tokens.shape()[1], stages[0]->config.d_model};
  std::optional<X> x;  // the activation, while it is on this rank
  for (int s = 0; s < placement.stages; ++s) {
    const auto at = std::find(mine.begin(), mine.end(), s);
    if (at == mine.end()) {
      x.reset();
      continue;
    }
    const auto i = static_cast<std::size_t>(at - mine.begin());
    GPTStage<X>& stage = *stages[i];
    const int tag = 2 * s * placement.microbatches;  // the runtime's tag for microbatch 0 reaching stage s
    if (s > 0 && !x) {
      Tensor local = Tensor::empty(Boundary<X>::local_shape(tokens, global, stage.layouts), stage.config.dtype);
      pp.recv(local.data(), local.nbytes(), placement.rank_of_stage(s - 1), tag - 2 * placement.microbatches);
      x = Boundary<X>::wrap(std::move(local), tokens, global, stage.layouts);
    }
    x = stage.forward(s == 0 ? tokens : *x, caches[i]);
    if (stage.is_last()) return x;
    x = Boundary<X>::to_boundary(*x, stage.layouts);
    if (placement.rank_of_stage(s + 1) != pp.rank()) {
      const Tensor local = local_of(*x);
      pp.send(local.data(), local.nbytes(), placement.rank_of_stage(s + 1), tag);
    }
  }
  return std::nullopt;
}

template std::optional<Tensor> forward_through(const Schedule&, std::span<GPTStage<Tensor>* const>, Communicator&,
                                               const Tensor&, std::span<KVCache<Tensor>>);
template std::optional<DTensor> forward_through(const Schedule&, std::span<GPTStage<DTensor>* const>, Communicator&,
                                                const DTensor&, std::span<KVCache<DTensor>>);

template void sum_tied_gradients(const Schedule&, std::span<GPTStage<Tensor>* const>, Communicator&);
template void sum_tied_gradients(const Schedule&, std::span<GPTStage<DTensor>* const>, Communicator&);
template std::vector<double> run_step(const Schedule&, std::span<GPTStage<Tensor>* const>, Communicator&,
                                      const StepInputs<Tensor>&, StepTimeline*);
template std::vector<double> run_step(const Schedule&, std::span<GPTStage<DTensor>* const>, Communicator&,
                                      const StepInputs<DTensor>&, StepTimeline*);

}  // namespace dtensor::nn::pipeline
