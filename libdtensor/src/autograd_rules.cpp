// The library's backward rules, written with the front end's ops (call_op),
// so that each backward step is dispatched and planned like any op. One
// generic lambda per op serves Tensor and DTensor alike. The rules through
// a fused backward op (max, min, norm, the norms, embedding, pick, softmax,
// cross_entropy) are in autograd_rules_fused.cpp.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "dtensor/api/functional.h"
#include "dtensor/core/error.h"
#include "autograd_engine.h"
#include "autograd_rules.h"

namespace dtensor {
namespace {
using namespace rules;

// ---- Pointwise ---------------------------------------------------------------------

/// f(x, out, g) -> the input's gradient.
template <class F>
std::shared_ptr<const BackwardRule> unary(F f) {
  return make_backward([f](const auto& a) {
    using X = std::decay_t<decltype(a.grad)>;
    return InputGrads<X>{f(a.inputs[0], a.output, a.grad, a.attrs)};
  });
}

/// fa, fb (a, b, out, g) -> the inputs' gradients at the output's shape;
/// summed back to each input's shape.
template <class Fa, class Fb>
std::shared_ptr<const BackwardRule> binary(Fa fa, Fb fb) {
  return make_backward([fa, fb](const auto& a) {
    using X = std::decay_t<decltype(a.grad)>;
    const X& x = a.inputs[0];
    const X& y = a.inputs[1];
    InputGrads<X> out(2);
    if (a.needs_grad(0)) out[0] = sum_to(fa(x, y, a.output, a.grad), x.shape());
    if (a.needs_grad(1)) out[1] = sum_to(fb(x, y, a.output, a.grad), y.shape());
    return out;
  });
}

double scalar_of(const OpAttrs& attrs, std::string_view op) { return attrs.get<ScalarAttrs>(op).value; }

template <class X>
X gelu_grad(const X& x, const X& g) {
  // gelu'(x) = Phi(x) + x phi(x), with Phi(x) = gelu(x) / x (1/2 at 0): no
  // erf op is needed.
  const X zero = zeros_like(x);
  const X phi_big = run<"where">({}, run<"eq">({}, x, zero), plus(zero, 0.5), run<"div">({}, run<"gelu">({}, x), x));
  const X density = scale(run<"exp">({}, scale(run<"mul">({}, x, x), -0.5)), 1.0 / std::sqrt(2 * std::numbers::pi));
  return run<"mul">({}, g, run<"add">({}, phi_big, run<"mul">({}, x, density)));
}

void add_pointwise(RuleList& r) {
  auto mul = [](const auto& p, const auto& q) { return run<"mul">({}, p, q); };
  r.emplace_back("neg", unary([](const auto&, const auto&, const auto& g, const OpAttrs&) { return scale(g, -1.0); }));
  r.emplace_back("abs", unary([mul](const auto& x, const auto&, const auto& g, const OpAttrs&) {
                   const auto zero = zeros_like(x);
                   return mul(g, run<"sub">({}, run<"gt">({}, x, zero), run<"lt">({}, x, zero)));
                 }));
  r.emplace_back("exp", unary([mul](const auto&, const auto& y, const auto& g, const OpAttrs&) { return mul(g, y); }));
  r.emplace_back("log",
                 unary([](const auto& x, const auto&, const auto& g, const OpAttrs&) { return run<"div">({}, g, x); }));
  r.emplace_back("sqrt", unary([](const auto&, const auto& y, const auto& g, const OpAttrs&) {
                   return run<"div">({}, g, scale(y, 2.0));
                 }));
  r.emplace_back("rsqrt", unary([mul](const auto&, const auto& y, const auto& g, const OpAttrs&) {
                   return mul(g, scale(run<"pow_scalar">(ScalarAttrs{.value = 3}, y), -0.5));
                 }));
  r.emplace_back("tanh", unary([mul](const auto&, const auto& y, const auto& g, const OpAttrs&) {
                   return run<"sub">({}, g, mul(g, mul(y, y)));
                 }));
  r.emplace_back("sigmoid", unary([mul](const auto&, const auto& y, const auto& g, const OpAttrs&) {
                   return mul(g, mul(y, plus(scale(y, -1.0), 1.0)));
                 }));
  r.emplace_back("relu", unary([mul](const auto& x, const auto&, const auto& g, const OpAttrs&) {
                   return mul(g, run<"gt">({}, x, zeros_like(x)));
                 }));
  // gelu: the fused gelu_backward in f32 and f64 (f32 vectorised: one pass
  // over x and the gradient where the chain made twelve; f64 scalar, which
  // beat the chain already); bf16 and f16, which its kernels do not take,
  // keep the chain. silu keeps its chain: on the CPU in f32 it beats the
  // scalar silu_backward (about 1.7x).
  r.emplace_back("gelu", unary([](const auto& x, const auto&, const auto& g, const OpAttrs&) {
                   if (x.dtype() == DType::Float32 || x.dtype() == DType::Float64)
                     return run<"gelu_backward">({}, x, g);
                   return gelu_grad(x, g);
                 }));
  r.emplace_back("silu", unary([mul](const auto& x, const auto&, const auto& g, const OpAttrs&) {
                   const auto s = run<"sigmoid">({}, x);
                   return mul(g, mul(s, plus(mul(x, plus(scale(s, -1.0), 1.0)), 1.0)));
                 }));
  r.emplace_back("add_scalar", unary([](const auto&, const auto&, const auto& g, const OpAttrs&) { return g; }));
  r.emplace_back("mul_scalar", unary([](const auto&, const auto&, const auto& g, const OpAttrs& at) {
                   return scale(g, scalar_of(at, "mul_scalar"));
                 }));
  r.emplace_back("div_scalar", unary([](const auto&, const auto&, const auto& g, const OpAttrs& at) {
                   return scale(g, 1.0 / scalar_of(at, "div_scalar"));
                 }));
  r.emplace_back("pow_scalar", unary([mul](const auto& x, const auto&, const auto& g, const OpAttrs& at) {
                   const double c = scalar_of(at, "pow_scalar");
                   return mul(g, scale(run<"pow_scalar">(ScalarAttrs{.value = c - 1}, x), c));
                 }));
  auto pass = [](const auto&, const auto&, const auto&, const auto& g) { return g; };
  auto negated = [](const auto&, const auto&, const auto&, const auto& g) { return scale(g, -1.0); };
  r.emplace_back("add", binary(pass, pass));
  r.emplace_back("sub", binary(pass, negated));
  r.emplace_back("mul", binary([mul](const auto&, const auto& b, const auto&, const auto& g) { return mul(g, b); },
                               [mul](const auto& a, const auto&, const auto&, const auto& g) { return mul(g, a); }));
  r.emplace_back("div",
                 binary([](const auto&, const auto& b, const auto&, const auto& g) { return run<"div">({}, g, b); },
                        [mul](const auto&, const auto& b, const auto& y, const auto& g) {
                          return scale(run<"div">({}, mul(g, y), b), -1.0);
                        }));
  r.emplace_back("pow", binary([mul](const auto& a, const auto& b, const auto&,
                                     const auto& g) { return mul(g, mul(b, run<"pow">({}, a, plus(b, -1.0)))); },
                               [mul](const auto& a, const auto&, const auto& y, const auto& g) {
                                 return mul(g, mul(y, run<"log">({}, a)));
                               }));
  // Ties go to the first operand, as argmax picks the first.
  r.emplace_back("maximum", binary([mul](const auto& a, const auto& b, const auto&,
                                         const auto& g) { return mul(g, run<"ge">({}, a, b)); },
                                   [mul](const auto& a, const auto& b, const auto&, const auto& g) {
                                     return mul(g, run<"lt">({}, a, b));
                                   }));
  r.emplace_back("minimum", binary([mul](const auto& a, const auto& b, const auto&,
                                         const auto& g) { return mul(g, run<"le">({}, a, b)); },
                                   [mul](const auto& a, const auto& b, const auto&, const auto& g) {
                                     return mul(g, run<"gt">({}, a, b));
                                   }));
  // The gradient goes to the chosen branch only; the condition gets none.
  r.emplace_back("where", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   const X zero = zeros_like(a.grad);
                   InputGrads<X> out(3);
                   if (a.needs_grad(1))
                     out[1] = sum_to(run<"where">({}, a.inputs[0], a.grad, zero), a.inputs[1].shape());
                   if (a.needs_grad(2))
                     out[2] = sum_to(run<"where">({}, a.inputs[0], zero, a.grad), a.inputs[2].shape());
                   return out;
                 }));
}

}  // namespace

// autograd_rules_shape.cpp
void add_einsum_rules(rules::RuleList& r);
void add_shape_rules(rules::RuleList& r);
// autograd_rules_fused.cpp
void add_fused_rules(rules::RuleList& r);

std::vector<std::pair<std::string_view, std::shared_ptr<const BackwardRule>>> builtin_backward_rules() {
  rules::RuleList r;
  add_pointwise(r);
  add_einsum_rules(r);
  add_shape_rules(r);
  add_fused_rules(r);
  return r;
}

// Comparisons and argmax (piecewise constant), and the fused backward ops,
// which only run inside a backward: there are no higher-order gradients.
std::vector<std::string_view> builtin_not_differentiable() {
  return {"eq",
          "ne",
          "lt",
          "le",
          "gt",
          "ge",
          "argmax",
          "gelu_backward",
          "silu_backward",
          "softmax_backward",
          "log_softmax_backward",
          "layer_norm_backward",
          "layer_norm_weight_backward",
          "rms_norm_backward",
          "rms_norm_weight_backward",
          "embedding_backward",
          "cross_entropy_backward",
          "max_backward",
          "min_backward"};
}

}  // namespace dtensor
