// recompute(): one node standing for a whole function, whose backward
// recomputes the function with recording on and runs a backward through it.
#include <fmt/format.h>

#include "dtensor/api/coalesced.h"
#include "dtensor/core/error.h"
#include "autograd_engine.h"

namespace dtensor {
namespace {

template <class X>
class RecomputeNode final : public Node {
 public:
  RecomputeNode(std::function<X(std::span<const X>)> f, std::span<const X> inputs) : f_(std::move(f)) {
    for (const X& x : inputs) {
      saved_.push_back(detached(x));
      needs_.push_back(in_graph(x.autograd_meta()));
    }
  }
  std::string name() const override { return "recompute"; }
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) override {
    if (released)
      throw AutogradError("[recompute] the saved inputs were freed by an earlier backward; pass retain_graph = true");
    // The recomputation's own graph: fresh leaves for the inputs that need
    // a gradient, so that its backward stops at them.
    EnableGradGuard recording;
    std::vector<X> inputs;
    for (std::size_t i = 0; i < saved_.size(); ++i) {
      X x = detached(saved_[i]);
      if (needs_[i]) x.requires_grad_();
      inputs.push_back(std::move(x));
    }
    const X out = f_(std::span<const X>(inputs));
    if (!in_graph(out.autograd_meta()))
      throw AutogradError("[recompute] the recomputed output does not depend on any input that needs a gradient");
    out.backward(std::get<X>(grad));
    std::vector<std::optional<AnyTensor>> grads(saved_.size());
    for (std::size_t i = 0; i < saved_.size(); ++i)
      if (needs_[i])
        if (auto g = inputs[i].grad()) grads[i] = AnyTensor(*g);
    return grads;
  }
  void release() override {
    saved_.clear();
    released = true;
  }

 private:
  std::function<X(std::span<const X>)> f_;
  std::vector<X> saved_;
  std::vector<bool> needs_;
};

template <class X>
X recompute_impl(const std::function<X(std::span<const X>)>& f, std::span<const X> inputs) {
  bool any = false;
  for (const X& x : inputs) any = any || in_graph(x.autograd_meta());
  if (!grad_enabled() || !any) return f(inputs);
  X out = [&] {
    NoGradGuard unrecorded;
    return f(inputs);
  }();
  auto node = std::make_shared<RecomputeNode<X>>(f, inputs);
  for (const X& x : inputs) node->edges.push_back(edge_of(x.autograd_meta()));
  attach(out, std::move(node));
  return out;
}

using GatheredFn = std::function<DTensor(std::span<const DTensor>, std::span<const DTensor>)>;

// Edges: the inputs, then the parameters.
class GatheredRecomputeNode final : public Node {
 public:
  GatheredRecomputeNode(GatheredFn f, std::span<const DTensor> inputs, std::span<const DTensor> params,
                         std::span<const Layout> gathered)
      : f_(std::move(f)), gathered_(gathered.begin(), gathered.end()) {
    for (const DTensor& x : inputs) {
      inputs_.push_back(detached(x));
      needs_.push_back(in_graph(x.autograd_meta()));
    }
    for (const DTensor& p : params) {
      params_.push_back(detached(p));
      needs_.push_back(in_graph(p.autograd_meta()));
      back_.push_back(p.placements().without_partial());
    }
  }
  std::string name() const override { return "recompute_gathered"; }
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) override {
    if (released)
      throw AutogradError(
          "[recompute_gathered] the saved inputs were freed by an earlier backward; pass "
          "retain_graph = true");
    std::vector<DTensor> gathered = redistribute_all(params_, gathered_);  // unrecorded: the params are detached
    EnableGradGuard recording;
    const std::size_t n = inputs_.size();
    std::vector<DTensor> inputs;
    for (std::size_t i = 0; i < n; ++i) {
      DTensor x = detached(inputs_[i]);
      if (needs_[i]) x.requires_grad_();
      inputs.push_back(std::move(x));
    }
    for (std::size_t i = 0; i < gathered.size(); ++i)
      if (needs_[n + i]) gathered[i].requires_grad_();
    const DTensor out = f_(inputs, gathered);
    if (!in_graph(out.autograd_meta()))
      throw AutogradError(
          "[recompute_gathered] the recomputed output does not depend on anything that needs a "
          "gradient");
    out.backward(std::get<DTensor>(grad));
    std::vector<std::optional<AnyTensor>> grads(n + params_.size());
    for (std::size_t i = 0; i < n; ++i)
      if (needs_[i])
        if (auto g = inputs[i].grad()) grads[i] = AnyTensor(*g);
    // The parameters' gradients leave together: one reduce_scatter.
    std::vector<DTensor> moving;
    std::vector<Layout> to;
    std::vector<std::size_t> which;
    for (std::size_t i = 0; i < gathered.size(); ++i)
      if (needs_[n + i])
        if (auto g = gathered[i].grad()) {
          moving.push_back(*g);
          to.push_back(back_[i]);
          which.push_back(i);
        }
    NoGradGuard unrecorded;
    const std::vector<DTensor> back = redistribute_all(moving, to);
    for (std::size_t k = 0; k < which.size(); ++k) grads[n + which[k]] = AnyTensor(back[k]);
    return grads;
  }
  void release() override {
    inputs_.clear();
    params_.clear();
    released = true;
  }

 private:
  GatheredFn f_;
  std::vector<DTensor> inputs_, params_;
  std::vector<bool> needs_;
  std::vector<Layout> gathered_, back_;
};

}  // namespace

DTensor recompute_gathered(const GatheredFn& f, std::span<const DTensor> inputs, std::span<const DTensor> params,
                            std::span<const Layout> gathered_layouts) {
  if (params.size() != gathered_layouts.size())
    throw ValueError(fmt::format("[recompute_gathered] {} parameters and {} gathered layouts; expected one each",
                                 params.size(), gathered_layouts.size()));
  bool any = false;
  for (const DTensor& x : inputs) any = any || in_graph(x.autograd_meta());
  for (const DTensor& p : params) any = any || in_graph(p.autograd_meta());
  if (!grad_enabled() || !any) {
    NoGradGuard unrecorded;  // the gather packs only tensors it need not record
    const std::vector<DTensor> gathered = redistribute_all(params, gathered_layouts);
    return f(inputs, gathered);
  }
  DTensor out = [&] {
    NoGradGuard unrecorded;
    const std::vector<DTensor> gathered = redistribute_all(params, gathered_layouts);
    return f(inputs, gathered);
  }();
  auto node = std::make_shared<GatheredRecomputeNode>(f, inputs, params, gathered_layouts);
  for (const DTensor& x : inputs) node->edges.push_back(edge_of(x.autograd_meta()));
  for (const DTensor& p : params) node->edges.push_back(edge_of(p.autograd_meta()));
  attach(out, std::move(node));
  return out;
}

Tensor recompute(const std::function<Tensor(std::span<const Tensor>)>& f, std::span<const Tensor> inputs) {
  return recompute_impl<Tensor>(f, inputs);
}
DTensor recompute(const std::function<DTensor(std::span<const DTensor>)>& f, std::span<const DTensor> inputs) {
  return recompute_impl<DTensor>(f, inputs);
}

}  // namespace dtensor
