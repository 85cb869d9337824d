// start_redistribute(): one redistribute whose forward and backward
// collectives each run between two nodes of the graph, so that what the
// forward records between start and wait overlaps both.
//
// The start node is made at start (older), the wait node at wait (newer),
// with one edge from the wait node to the start node. The backward reaches
// the wait node first: it starts the gradient's layout change and sends no
// gradient along its edge. The start node becomes ready then, but the
// engine runs the newer nodes recorded in between first (newest first),
// and the start node, which has no gradient of its own, waits for the
// started change in apply_collected() and sends its value to x.
#include <utility>

#include "dtensor/api/autograd.h"
#include "dtensor/api/coalesced.h"
#include "dtensor/core/error.h"
#include "autograd_engine.h"

namespace dtensor {

struct StartedRedistribute::State {
  bool started = true;
  bool waited = false;
  std::optional<StartedRedistribution> forward;   // until wait()
  std::optional<DTensor> forward_value;           // started = false: waited for at once
  Layout grad_target;                             // x's layout, Partial replaced by Replicate
  std::optional<StartedRedistribution> backward;  // between the two nodes' backwards
  std::optional<DTensor> backward_value;
  std::shared_ptr<Node> start_node;  // null when not recorded
};

namespace {

using State = StartedRedistribute::State;

class StartNode final : public Node {
 public:
  explicit StartNode(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::string name() const override { return "start_redistribute"; }
  // Its output is only the wait node's edge, which carries no gradient.
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor&) override { return apply_collected(); }
  std::vector<std::optional<AnyTensor>> apply_collected() override {
    if (released) throw_freed_graph(*this);
    if (state_->backward) state_->backward_value = std::exchange(state_->backward, std::nullopt)->wait().front();
    if (!state_->backward_value) return {};  // no gradient reached the wait node
    return {AnyTensor(*std::exchange(state_->backward_value, std::nullopt))};
  }
  void release() override {
    state_.reset();
    released = true;
  }

 private:
  std::shared_ptr<State> state_;
};

class WaitNode final : public Node {
 public:
  explicit WaitNode(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::string name() const override { return "wait_redistribute"; }
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) override {
    if (released) throw_freed_graph(*this);
    const DTensor& g = std::get<DTensor>(grad);
    const std::array<DTensor, 1> grads{g};
    const std::array<Layout, 1> targets{state_->grad_target};
    StartedRedistribution moving = start_redistribute_all(grads, targets);
    if (state_->started)
      state_->backward.emplace(std::move(moving));
    else
      state_->backward_value = moving.wait().front();
    return {std::nullopt};
  }
  void release() override {
    state_.reset();
    released = true;
  }

 private:
  std::shared_ptr<State> state_;
};

}  // namespace

StartedRedistribute::StartedRedistribute(std::shared_ptr<State> state) : state_(std::move(state)) {}

StartedRedistribute start_redistribute(const DTensor& x, const Layout& target, bool started) {
  auto state = std::make_shared<State>();
  state->started = started;
  state->grad_target = x.placements().without_partial();
  const std::array<DTensor, 1> inputs{x};
  const std::array<Layout, 1> targets{target};
  StartedRedistribution moving = start_redistribute_all(inputs, targets);
  if (started)
    state->forward.emplace(std::move(moving));
  else
    state->forward_value = moving.wait().front();
  if (grad_enabled() && in_graph(x.autograd_meta())) {
    state->start_node = std::make_shared<StartNode>(state);
    state->start_node->edges.push_back(edge_of(x.autograd_meta()));
  }
  return StartedRedistribute(std::move(state));
}

DTensor StartedRedistribute::wait() {
  if (!state_ || state_->waited)
    throw ValueError("[StartedRedistribute::wait] already waited for: each one is waited for once");
  state_->waited = true;
  DTensor out = state_->forward ? std::exchange(state_->forward, std::nullopt)->wait().front()
                                : *std::exchange(state_->forward_value, std::nullopt);
  if (std::shared_ptr<Node> start = std::exchange(state_->start_node, nullptr)) {
    // A fresh tensor (its own meta) with the wait node as its grad_fn.
    out = detached(out);
    auto node = std::make_shared<WaitNode>(state_);
    node->edges.push_back(Edge{std::move(start), nullptr});
    attach(out, std::move(node));
  }
  return out;
}

}  // namespace dtensor
