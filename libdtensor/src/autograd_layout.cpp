// The layout changes' backward: the gradient goes back to the forward
// source layout with Partial replaced by Replicate (sending a gradient back
// to Partial is wasted work: every piece of a sum gets the whole gradient).
// The planner finds the collective: S->R forward gives a reduce_scatter when
// the gradient arrives Partial, R->S an all_gather, S(i)->S(j) an
// all_to_all back.
#include "dtensor/core/error.h"
#include "autograd_engine.h"

namespace dtensor {
namespace {

class RedistributeNode final : public Node {
 public:
  explicit RedistributeNode(Layout source) : target_(source.without_partial()) {}
  std::string name() const override { return "redistribute"; }
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) override {
    return {AnyTensor(std::get<DTensor>(grad).redistribute(target_))};
  }
  void release() override { released = true; }

 private:
  Layout target_;
};

// from_local and distribute_tensor: the gradient of the local (or full)
// tensor is the DTensor gradient brought to the source layout (or to
// Replicate), this rank's part of it.
class FromLocalNode final : public Node {
 public:
  FromLocalNode(Layout layout, bool whole) : target_(layout.without_partial()), whole_(whole) {}
  std::string name() const override { return whole_ ? "distribute_tensor" : "from_local"; }
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) override {
    const DTensor& g = std::get<DTensor>(grad);
    Tensor local = g.redistribute(whole_ ? Layout::replicated(g.mesh().ndim()) : target_).to_local();
    return {AnyTensor(detached(local))};
  }
  void release() override { released = true; }

 private:
  Layout target_;
  bool whole_;
};

// to_local: the local gradient, read as a shard of grad_layout.
class ToLocalNode final : public Node {
 public:
  ToLocalNode(const DTensor& like, Layout grad_layout) : like_(detached(like)), layout_(std::move(grad_layout)) {}
  std::string name() const override { return "to_local"; }
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) override {
    const Tensor& g = std::get<Tensor>(grad);
    return {AnyTensor(DTensor::from_local(g, like_->mesh(), layout_, like_->shape(), FromLocalCheck::Trust)
                          .with_cost_model(like_->cost_model()))};
  }
  void release() override { released = true; }

 private:
  std::optional<DTensor> like_;
  Layout layout_;
};

}  // namespace

void record_redistribute(const DTensor& in, DTensor& out) {
  if (!grad_enabled() || !in_graph(in.autograd_meta())) return;
  auto node = std::make_shared<RedistributeNode>(in.placements());
  node->edges.push_back(edge_of(in.autograd_meta()));
  attach(out, std::move(node));
}

void record_from_local(const Tensor& local, DTensor& out) {
  if (!grad_enabled() || !in_graph(local.autograd_meta())) return;
  auto node = std::make_shared<FromLocalNode>(out.placements(), false);
  node->edges.push_back(edge_of(local.autograd_meta()));
  attach(out, std::move(node));
}

void record_distribute(bool source_requires_grad, const Tensor& full, DTensor& out) {
  if (!source_requires_grad) return;
  // Every rank records (the backward's gather is collective); only the
  // source's edge leads anywhere.
  auto node = std::make_shared<FromLocalNode>(out.placements(), true);
  node->edges.push_back(edge_of(full.defined() ? full.autograd_meta() : nullptr));
  attach(out, std::move(node));
}

Tensor record_to_local(const DTensor& in, const Tensor& local, const Layout& grad_layout) {
  Tensor out = detached(local);
  auto node = std::make_shared<ToLocalNode>(in, grad_layout);
  node->edges.push_back(edge_of(in.autograd_meta()));
  attach(out, std::move(node));
  return out;
}

}  // namespace dtensor
