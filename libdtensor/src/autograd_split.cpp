// The backward in two halves (backward_input, DeferredGradients::run): the
// zero-bubble pipelines' I and W actions. The first half runs the nodes from
// which one of the given inputs can be reached, asking each for the
// gradients of just the edges that lead there; every other edge's gradient
// is left for the second half, which runs what remains of the graph.
#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "dtensor/api/comm_tree.h"
#include "dtensor/api/split_backward.h"
#include "dtensor/core/error.h"
#include "autograd_engine.h"

namespace dtensor {

struct DeferredGradients::State {
  // A node that computes its edges apart, with the gradient of its output
  // and the edges the second half asks it for.
  struct Split {
    std::shared_ptr<Node> node;
    AnyTensor grad;
    std::vector<bool> rest;
  };
  std::vector<Split> split;
  // Gradients the first half computed for edges it did not want (a node
  // that computes all its edges at once).
  std::vector<std::pair<Edge, AnyTensor>> computed;
  bool ran = false;
};

namespace {

// Which nodes below `root` reach one of `inputs` (an input leaf on one of
// their edges, or a node that does): the nodes the first half runs.
std::unordered_set<Node*> reaching(Node* root, const std::unordered_set<const AutogradMeta*>& inputs) {
  std::unordered_set<Node*> reaches, visited;
  // Iterative post-order: a node is decided after all its edges' nodes.
  std::vector<std::pair<Node*, bool>> stack{{root, false}};
  while (!stack.empty()) {
    auto [n, expanded] = stack.back();
    stack.pop_back();
    if (expanded) {
      for (const Edge& e : n->edges)
        if ((e.leaf && inputs.count(e.leaf.get())) || (e.fn && reaches.count(e.fn.get()))) {
          reaches.insert(n);
          break;
        }
      continue;
    }
    if (!visited.insert(n).second) continue;
    stack.push_back({n, true});
    for (const Edge& e : n->edges)
      if (e.fn && !visited.count(e.fn.get())) stack.push_back({e.fn.get(), false});
  }
  return reaches;
}

// Runs the nodes made ready by `pending` (in the engine's order, newest
// first), each with the gradient summed for it; `wanted(node)` picks the
// edges a node computes now (all: the second half) and `on_rest` is given
// the node and gradient when it leaves some out. A node is freed after it
// runs (as backward without retain_graph does), unless it computed its
// edges apart and the second half will ask it for the rest.
template <class Wanted, class OnRest>
void run_ready(std::unordered_map<Node*, AnyTensor>& pending, std::unordered_map<Node*, int>& deps,
               std::priority_queue<Node*, std::vector<Node*>, Later>& ready, Wanted wanted, OnRest on_rest) {
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    const std::vector<bool> want = wanted(*n);
    std::vector<std::optional<AnyTensor>> grads;
    auto it = pending.find(n);
    const bool partial = std::find(want.begin(), want.end(), false) != want.end();
    const bool kept = it != pending.end() && partial && n->splits_edges();
    if (kept) {
      grads = n->apply_edges(it->second, want);
      on_rest(*n, it->second, want, grads, true);
    } else {
      grads = it != pending.end() ? n->apply(it->second) : n->apply_collected();
      if (partial) on_rest(*n, it != pending.end() ? it->second : AnyTensor{}, want, grads, false);
    }
    if (it != pending.end()) pending.erase(it);
    for (std::size_t i = 0; i < n->edges.size(); ++i) {
      if (!want[i]) continue;
      const Edge& e = n->edges[i];
      if (e.fn) {
        if (i < grads.size() && grads[i]) {
          auto [p, fresh] = pending.try_emplace(e.fn.get(), *grads[i]);
          if (!fresh) p->second = add_grads(p->second, *grads[i]);
        }
        if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
      } else if (e.leaf && i < grads.size() && grads[i]) {
        accumulate(*e.leaf, *grads[i]);
      }
    }
    if (!kept) n->release();
  }
}

template <class X>
DeferredGradients split_backward(const X& output, const X& grad, std::span<const X> inputs) {
  CommScope phase("backward");
  const std::shared_ptr<AutogradMeta>& root = output.autograd_meta();
  if (!root || !root->grad_fn)
    throw AutogradError(
        "[backward_input] the output was not made by recorded ops (it is a leaf, or nothing it came from requires a "
        "gradient): there is nothing to split");
  check_grad_shape(output.shape(), grad.shape());
  std::unordered_set<const AutogradMeta*> input_metas;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto& m = inputs[i].autograd_meta();
    if (!m || !m->requires_grad || m->grad_fn)
      throw AutogradError(
          fmt::format("[backward_input] input {} is not a leaf that requires a gradient; the inputs are the leaves "
                      "whose "
                      "gradients the first half computes (a stage's input: detach() it, then requires_grad_())",
                      i));
    input_metas.insert(m.get());
  }
  Node* top = root->grad_fn.get();
  std::unordered_map<Node*, int> deps = incoming_edges({&top, 1});
  const std::unordered_set<Node*> first_half = reaching(top, input_metas);
  if (!first_half.count(top))
    throw AutogradError("[backward_input] none of the inputs is reached from the output: its gradient is not theirs");

  NoGradGuard no_grad;
  auto state = std::make_unique<DeferredGradients::State>();
  // Keep every node the second half may need alive past this call.
  std::unordered_map<Node*, std::shared_ptr<Node>> owner{{top, root->grad_fn}};
  auto leads = [&](const Edge& e) {
    return (e.leaf && input_metas.count(e.leaf.get())) || (e.fn && first_half.count(e.fn.get()));
  };
  auto wanted = [&](const Node& n) {
    std::vector<bool> want(n.edges.size());
    for (std::size_t i = 0; i < n.edges.size(); ++i) want[i] = leads(n.edges[i]) || !(n.edges[i].fn || n.edges[i].leaf);
    return want;
  };
  auto on_rest = [&](Node& n, const AnyTensor& g, const std::vector<bool>& want,
                     const std::vector<std::optional<AnyTensor>>& grads, bool split) {
    std::vector<bool> rest(want.size());
    for (std::size_t i = 0; i < want.size(); ++i) rest[i] = !want[i];
    if (split) {
      state->split.push_back({owner.at(&n), g, std::move(rest)});
      return;
    }
    for (std::size_t i = 0; i < want.size(); ++i)
      if (rest[i] && i < grads.size() && grads[i]) state->computed.emplace_back(n.edges[i], *grads[i]);
  };
  for (Node* n : first_half)
    for (const Edge& e : n->edges)
      if (e.fn) owner.try_emplace(e.fn.get(), e.fn);
  std::unordered_map<Node*, AnyTensor> pending;
  pending.emplace(top, detached(grad));
  std::priority_queue<Node*, std::vector<Node*>, Later> ready;
  ready.push(top);
  run_ready(pending, deps, ready, wanted, on_rest);
  return DeferredGradients(std::move(state));
}

}  // namespace

DeferredGradients::DeferredGradients() = default;
DeferredGradients::DeferredGradients(std::unique_ptr<State> state) : state_(std::move(state)) {}
DeferredGradients::DeferredGradients(DeferredGradients&&) noexcept = default;
DeferredGradients& DeferredGradients::operator=(DeferredGradients&&) noexcept = default;
DeferredGradients::~DeferredGradients() = default;

bool DeferredGradients::pending() const {
  return state_ && !state_->ran && (!state_->split.empty() || !state_->computed.empty());
}

void DeferredGradients::run() {
  if (!state_) return;
  if (state_->ran) throw AutogradError("[backward_input] the deferred gradients were computed already (run() twice)");
  state_->ran = true;
  CommScope phase("backward");
  NoGradGuard no_grad;
  // The edges the first half left, as gradients into the rest of the graph:
  // the split nodes compute them now, in the engine's order.
  std::sort(state_->split.begin(), state_->split.end(),
            [](const State::Split& a, const State::Split& b) { return a.node->sequence > b.node->sequence; });
  std::vector<std::pair<Edge, AnyTensor>> arriving = std::move(state_->computed);
  for (State::Split& s : state_->split) {
    std::vector<std::optional<AnyTensor>> grads = s.node->apply_edges(s.grad, s.rest);
    for (std::size_t i = 0; i < s.rest.size(); ++i)
      if (s.rest[i] && i < grads.size() && grads[i]) arriving.emplace_back(s.node->edges[i], std::move(*grads[i]));
    s.node->release();
  }
  std::vector<Node*> roots;
  std::unordered_map<Node*, AnyTensor> pending;
  for (auto& [edge, g] : arriving) {
    if (edge.leaf) {
      accumulate(*edge.leaf, g);
    } else if (edge.fn) {
      auto [p, fresh] = pending.try_emplace(edge.fn.get(), g);
      if (fresh)
        roots.push_back(edge.fn.get());
      else
        p->second = add_grads(p->second, g);
    }
  }
  // The rest of the graph: the nodes only the weights' gradients pass
  // through. A root waits for the edges into it from other such nodes.
  std::unordered_map<Node*, int> deps = incoming_edges(roots);
  std::priority_queue<Node*, std::vector<Node*>, Later> ready;
  for (Node* r : roots)
    if (deps[r] == 0) ready.push(r);
  auto all = [](const Node& n) { return std::vector<bool>(n.edges.size(), true); };
  auto none = [](Node&, const AnyTensor&, const std::vector<bool>&, const std::vector<std::optional<AnyTensor>>&,
                 bool) {};
  run_ready(pending, deps, ready, all, none);
  state_->split.clear();
}

DeferredGradients backward_input(const Tensor& output, const Tensor& grad, std::span<const Tensor> inputs) {
  return split_backward(output, grad, inputs);
}
DeferredGradients backward_input(const DTensor& output, const DTensor& grad, std::span<const DTensor> inputs) {
  return split_backward(output, grad, inputs);
}
DeferredGradients backward_input(const Tensor& loss, std::span<const Tensor> inputs) {
  return split_backward(loss, unit_gradient(loss), inputs);
}
DeferredGradients backward_input(const DTensor& loss, std::span<const DTensor> inputs) {
  return split_backward(loss, unit_gradient(loss), inputs);
}

}  // namespace dtensor
