// record_custom(): one node whose backward is the caller's function.
#include <fmt/format.h>

#include "dtensor/api/autograd.h"
#include "dtensor/core/error.h"
#include "autograd_engine.h"

namespace dtensor {
namespace {

class CustomNode final : public Node {
 public:
  CustomNode(std::string name, CustomBackward backward, std::vector<Shape> shapes)
      : name_(std::move(name)), backward_(std::move(backward)), shapes_(std::move(shapes)) {}
  std::string name() const override { return name_; }
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) override {
    if (released) throw_freed_graph(*this);
    std::vector<std::optional<Tensor>> grads = backward_(std::get<Tensor>(grad));
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
  CustomBackward backward_;
  std::vector<Shape> shapes_;
};

}  // namespace

Tensor record_custom(std::string name, std::span<const Tensor> inputs, Tensor output, CustomBackward backward) {
  bool any = false;
  for (const Tensor& x : inputs) any = any || in_graph(x.autograd_meta());
  if (!grad_enabled() || !any) return output;
  std::vector<Shape> shapes;
  for (const Tensor& x : inputs) shapes.push_back(x.shape());
  auto node = std::make_shared<CustomNode>(std::move(name), std::move(backward), std::move(shapes));
  for (const Tensor& x : inputs) node->edges.push_back(edge_of(x.autograd_meta()));
  Tensor out = detached(output);
  attach(out, std::move(node));
  return out;
}

}  // namespace dtensor
