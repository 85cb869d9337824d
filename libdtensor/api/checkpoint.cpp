// checkpoint(): one node standing for a whole function, whose backward
// recomputes the function with recording on and runs a backward through it.
#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "libdtensor/api/autograd_engine.h"

namespace dtensor {
namespace {

template <class X>
class CheckpointNode final : public Node {
 public:
  CheckpointNode(std::function<X(std::span<const X>)> f, std::span<const X> inputs) : f_(std::move(f)) {
    for (const X& x : inputs) {
      saved_.push_back(detached(x));
      needs_.push_back(in_graph(x.autograd_meta()));
    }
  }
  std::string name() const override { return "checkpoint"; }
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) override {
    if (released)
      throw AutogradError("[checkpoint] the saved inputs were freed by an earlier backward; pass retain_graph = true");
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
      throw AutogradError("[checkpoint] the recomputed output does not depend on any input that needs a gradient");
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
X checkpoint_impl(const std::function<X(std::span<const X>)>& f, std::span<const X> inputs) {
  bool any = false;
  for (const X& x : inputs) any = any || in_graph(x.autograd_meta());
  if (!grad_enabled() || !any) return f(inputs);
  X out = [&] {
    NoGradGuard unrecorded;
    return f(inputs);
  }();
  auto node = std::make_shared<CheckpointNode<X>>(f, inputs);
  for (const X& x : inputs) node->edges.push_back(edge_of(x.autograd_meta()));
  attach(out, std::move(node));
  return out;
}

}  // namespace

Tensor checkpoint(const std::function<Tensor(std::span<const Tensor>)>& f, std::span<const Tensor> inputs) {
  return checkpoint_impl<Tensor>(f, inputs);
}
DTensor checkpoint(const std::function<DTensor(std::span<const DTensor>)>& f, std::span<const DTensor> inputs) {
  return checkpoint_impl<DTensor>(f, inputs);
}

}  // namespace dtensor
