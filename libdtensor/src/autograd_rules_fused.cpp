// Backward rules that route a gradient through the fused backward ops
// (ops/src/backward_ops.cpp, backward_index_ops.cpp): max and min, norm,
// layer_norm and rms_norm with their weight and bias, embedding, pick,
// softmax, and cross_entropy's own node. Every step is a call_op, so it is
// planned and counted like any op; none hand-writes a collective.
#include <cmath>
#include <limits>

#include "dtensor/api/embedding.h"
#include "dtensor/core/error.h"
#include "autograd_rules.h"

namespace dtensor {
namespace {
using namespace rules;

template <class X>
X sign_of(const X& x) {
  const X zero = zeros_like(x);
  return run<"sub">({}, run<"gt">({}, x, zero), run<"lt">({}, x, zero));
}

// The gradient of a p-norm: g * sign(x) |x|^(p-1) / n^(p-1), with p = 1, 2,
// +-inf and 0 on their own. A zero norm gives a zero gradient for p = 2
// (PyTorch's subgradient).
template <class X>
X norm_grad(const X& x, const X& n, const X& g, const ReduceAttrs& attrs) {
  const double p = attrs.p;
  if (p == 0) return zeros_like(x);
  if (std::isinf(p)) {
    // To the first element of largest (smallest) magnitude, as max (min) picks.
    ReduceAttrs plain = attrs;
    plain.p = 2;
    const X ax = run<"abs">({}, x);
    const X routed = p > 0 ? run<"max_backward">(plain, ax, g) : run<"min_backward">(plain, ax, g);
    return run<"mul">({}, routed, sign_of(x));
  }
  if (p == 1) return run<"mul">({}, expand_reduced("norm", g, x, attrs), sign_of(x));
  if (p == 2) {
    const X zero = zeros_like(n);
    const X safe = run<"where">({}, run<"eq">({}, n, zero), plus(zero, 1.0), n);
    const X ratio = run<"where">({}, run<"eq">({}, n, zero), zero, run<"div">({}, g, safe));
    return run<"mul">({}, x, expand_reduced("norm", ratio, x, attrs));
  }
  const X ratio = run<"div">({}, g, run<"pow_scalar">(ScalarAttrs{.value = p - 1}, n));
  const X mag = run<"pow_scalar">(ScalarAttrs{.value = p - 1}, run<"abs">({}, x));
  return run<"mul">({}, run<"mul">({}, sign_of(x), mag), expand_reduced("norm", ratio, x, attrs));
}

// layer_norm(x[, weight][, bias]) and rms_norm(x[, weight]).
template <class X>
InputGrads<X> normalization_backward(const BackwardArgs<X>& a, bool rms) {
  const std::string_view name = rms ? "rms_norm" : "layer_norm";
  const NormAttrs& n = a.attrs.template get<NormAttrs>(name);
  const X& x = a.inputs[0];
  InputGrads<X> out(a.inputs.size());
  if (a.needs_grad(0)) {
    if (n.weight)
      out[0] = rms ? run<"rms_norm_backward">(a.attrs, x, a.grad, a.inputs[1])
                   : run<"layer_norm_backward">(a.attrs, x, a.grad, a.inputs[1]);
    else
      out[0] = rms ? run<"rms_norm_backward">(a.attrs, x, a.grad) : run<"layer_norm_backward">(a.attrs, x, a.grad);
  }
  if (n.weight && a.needs_grad(1))
    out[1] = rms ? run<"rms_norm_weight_backward">(a.attrs, x, a.grad)
                 : run<"layer_norm_weight_backward">(a.attrs, x, a.grad);
  const std::size_t b = n.weight ? 2 : 1;
  if (n.bias && a.needs_grad(b)) out[b] = sum_to(a.grad, a.inputs[b].shape());
  return out;
}

// pick's gradient, one-hot rows scaled by g: cross_entropy_backward with a
// softmax of exactly zero (lse = +inf) gives -g * onehot, in the logits'
// layout (a class-sharded row stays sharded).
template <class X>
X one_hot_rows(const X& logits, const X& targets, const X& g) {
  const X lse = plus(zeros_like(g), std::numeric_limits<double>::infinity());
  return run<"cross_entropy_backward">({}, zeros_like(logits), targets, lse, scale(g, -1.0));
}

// ---- cross_entropy's node ------------------------------------------------------
// The forward runs unrecorded; one node keeps the logits, the targets and
// the rows' log-sum-exp, and its backward is one cross_entropy_backward:
// softmax minus one-hot, computed where the logits live.

template <class X>
class CrossEntropyNode final : public Node {
 public:
  CrossEntropyNode(const X& logits, const X& targets, const X& lse)
      : logits_(detached(logits)), targets_(detached(targets)), lse_(detached(lse)) {
    edges.push_back(edge_of(logits.autograd_meta()));
  }
  std::string name() const override { return "cross_entropy"; }
  std::vector<std::optional<AnyTensor>> apply(const AnyTensor& grad) override {
    const X& g = std::get<X>(grad);
    ExplainTag tag("backward of cross_entropy");
    const auto rows = logits_->shape()[0];
    const X per_row =
        scale(run<"expand">(ShapeAttrs{.shape = {rows}}, reshape_to(g, Shape{1})), 1.0 / static_cast<double>(rows));
    std::vector<std::optional<AnyTensor>> out;
    out.emplace_back(run<"cross_entropy_backward">({}, *logits_, *targets_, *lse_, per_row));
    return out;
  }
  void release() override {
    logits_.reset();
    targets_.reset();
    lse_.reset();
    released = true;
  }

 private:
  std::optional<X> logits_, targets_, lse_;
};

template <class X>
X record_ce(const X& logits, const X& targets, const X& lse, X loss) {
  if (!grad_enabled() || !in_graph(logits.autograd_meta())) return loss;
  attach(loss, std::make_shared<CrossEntropyNode<X>>(logits, targets, lse));
  return loss;
}

}  // namespace

namespace detail {
Tensor record_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& lse, Tensor loss) {
  return record_ce(logits, targets, lse, std::move(loss));
}
DTensor record_cross_entropy(const DTensor& logits, const DTensor& targets, const DTensor& lse, DTensor loss) {
  return record_ce(logits, targets, lse, std::move(loss));
}
}  // namespace detail

void add_fused_rules(RuleList& r) {
  for (std::string_view name : {"max", "min"}) {
    const bool max = name == "max";
    r.emplace_back(name, make_backward([max](const auto& a) {
                     using X = std::decay_t<decltype(a.grad)>;
                     return InputGrads<X>{max ? run<"max_backward">(a.attrs, a.inputs[0], a.grad)
                                              : run<"min_backward">(a.attrs, a.inputs[0], a.grad)};
                   }));
  }
  r.emplace_back("norm", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   return InputGrads<X>{
                       norm_grad(a.inputs[0], a.output, a.grad, a.attrs.template get<ReduceAttrs>("norm"))};
                 }));
  r.emplace_back("layer_norm", make_backward([](const auto& a) { return normalization_backward(a, false); }));
  r.emplace_back("rms_norm", make_backward([](const auto& a) { return normalization_backward(a, true); }));
  // The table's gradient; the indices get none.
  r.emplace_back("embedding", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   InputGrads<X> out(2);
                   if (a.needs_grad(1)) out[1] = run<"embedding_backward">({}, a.inputs[0], a.grad, a.inputs[1]);
                   return out;
                 }));
  r.emplace_back("pick", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   InputGrads<X> out(2);
                   if (a.needs_grad(0)) out[0] = one_hot_rows(a.inputs[0], a.inputs[1], a.grad);
                   return out;
                 }));
  // One kernel in place of the composite chain: as fast in f32 on the CPU,
  // about 2.4x faster in f64. (silu and log_softmax keep their composite
  // rules: there their fused ops are slower on the CPU; gelu's rule in
  // autograd_rules.cpp takes gelu_backward in f32 and f64.)
  r.emplace_back("softmax", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   return InputGrads<X>{run<"softmax_backward">(a.attrs, a.output, a.grad)};
                 }));
}

}  // namespace dtensor
