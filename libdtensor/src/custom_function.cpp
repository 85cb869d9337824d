// record_custom(): one node whose backward is the caller's function.
#include <fmt/format.h>

#include "dtensor/api/autograd.h"
#include "dtensor/core/error.h"
#include "autograd_engine.h"

namespace dtensor {
namespace {

template <class X>
using BackwardOf = std::function<std::vector<std::optional<X>>(const X& grad)>;

template <class X>
class CustomNode final : public Node {
 public:
  CustomNode(std::string name, BackwardOf<X> backward, std::vector<Shape> shapes)
      : name_(std::move(name)), backward_(std::move(backward)), shapes_(std::move(shapes)) {}
  std::string name() const override { return name_; }
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) override {
    if (released) throw_freed_graph(*this);
    std::vector<std::optional<X>> grads = backward_(std::get<X>(grad));
    if (grads.size() != shapes_.size())
      throw AutogradError(fmt::format("[{}] the backward returned {} gradients for {} inputs; expected one each",
                                      name_, grads.size(), shapes_.size()));
    std::vector<std::optional<AnyTensor>> out(grads.size());
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i]) continue;
      if (grads[i]->shape() != shapes_[i])
        throw AutogradError(fmt::format("[{}] the gradient of input {} has shape {}; expected the input's {}", name_,
                                        i, fmt::join(grads[i]->shape(), "x"), fmt::join(shapes_[i], "x")));
      out[i] = AnyTensor(std::move(*grads[i]));
    }
    return out;
  }
  void release() override {
    backward_ = nullptr;  // what the closure holds (saved plans, tensors) goes with it
    released = true;
  }

 private:
  std::string name_;
  BackwardOf<X> backward_;
  std::vector<Shape> shapes_;
};

template <class X>
X record_custom_impl(std::string name, std::span<const X> inputs, X output, BackwardOf<X> backward) {
  bool any = false;
  for (const X& x : inputs) any = any || in_graph(x.autograd_meta());
  if (!grad_enabled() || !any) return output;
  std::vector<Shape> shapes;
  for (const X& x : inputs) shapes.push_back(x.shape());
  auto node = std::make_shared<CustomNode<X>>(std::move(name), std::move(backward), std::move(shapes));
  for (const X& x : inputs) node->edges.push_back(edge_of(x.autograd_meta()));
  X out = detached(output);
  attach(out, std::move(node));
  return out;
}

}  // namespace

Tensor record_custom(std::string name, std::span<const Tensor> inputs, Tensor output, CustomBackward backward) {
  return record_custom_impl<Tensor>(std::move(name), inputs, std::move(output), std::move(backward));
}

DTensor record_custom(std::string name, std::span<const DTensor> inputs, DTensor output,
                      CustomDTensorBackward backward) {
  return record_custom_impl<DTensor>(std::move(name), inputs, std::move(output), std::move(backward));
}

}  // namespace dtensor
