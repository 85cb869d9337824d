// Backward rules of the einsum family, sum and mean, and the shape ops,
// written with the front end's ops (see autograd_rules.cpp).
#include <algorithm>
#include <string>

#include "dtensor/core/error.h"
#include "libdtensor/api/autograd_rules.h"

namespace dtensor {
namespace {
using namespace rules;

template <class X>
X transpose_last(const X& x) {
  const auto nd = static_cast<std::int64_t>(x.dim());
  return run<"transpose">(TransposeAttrs{.dim0 = nd - 2, .dim1 = nd - 1}, x);
}

// The NumPy output of an equation without "->": the labels that appear
// once, in alphabetical order.
std::string implicit_output(const std::string& lhs) {
  std::string out;
  for (char c : lhs)
    if (std::isalpha(static_cast<unsigned char>(c)) && std::count(lhs.begin(), lhs.end(), c) == 1) out += c;
  std::sort(out.begin(), out.end());
  return out;
}

// einsum's gradient for operand i: the same contraction with the output's
// gradient in place of operand i and operand i's subscripts as the output
// ("ij,jk->ik" gives "ik,jk->ij" for the first). A label of operand i found
// nowhere else was summed over: its gradient is broadcast back.
template <class X>
InputGrads<X> einsum_backward(const BackwardArgs<X>& a) {
  std::string eq;
  for (char c : a.attrs.template get<EinsumAttrs>("einsum").equation)
    if (c != ' ') eq += c;
  if (eq.find('.') != std::string::npos)
    throw AutogradError(
        fmt::format("[backward] einsum '{}': the backward of an equation with '...' is not "
                    "supported; name the dims",
                    eq));
  const auto arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  const std::string out_labels = arrow == std::string::npos ? implicit_output(lhs) : eq.substr(arrow + 2);
  std::vector<std::string> terms;
  for (std::size_t start = 0;;) {
    auto comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  InputGrads<X> grads(terms.size());
  for (std::size_t i = 0; i < terms.size(); ++i) {
    if (!a.needs_grad(i)) continue;
    const std::string& mine = terms[i];
    std::string elsewhere = out_labels;
    std::vector<X> operands{a.grad};
    std::string new_lhs = out_labels;
    for (std::size_t j = 0; j < terms.size(); ++j) {
      if (j == i) continue;
      elsewhere += terms[j];
      operands.push_back(a.inputs[j]);
      new_lhs += "," + terms[j];
    }
    std::string kept;
    Shape kept_shape = a.inputs[i].shape();
    for (std::size_t d = 0; d < mine.size(); ++d) {
      if (std::count(mine.begin(), mine.end(), mine[d]) > 1)
        throw AutogradError(
            fmt::format("[backward] einsum '{}': a repeated subscript in one operand ('{}') is "
                        "not supported",
                        eq, mine));
      if (elsewhere.find(mine[d]) != std::string::npos)
        kept += mine[d];
      else
        kept_shape[d] = 1;
    }
    X g = call_op(registered_op<"einsum">(), std::span<const X>(operands),
                  EinsumAttrs{.equation = new_lhs + "->" + kept});
    if (kept.size() != mine.size())
      g = run<"expand">(ShapeAttrs{.shape = a.inputs[i].shape()}, reshape_to(g, kept_shape));
    grads[i] = g;
  }
  return grads;
}

// matmul (and bmm): 1-D operands become matrices, batch dims broadcast.
template <class X>
InputGrads<X> matmul_backward(const BackwardArgs<X>& a) {
  const X& x = a.inputs[0];
  const X& y = a.inputs[1];
  const X a2 = x.dim() == 1 ? reshape_to(x, Shape{1, x.shape()[0]}) : x;
  const X b2 = y.dim() == 1 ? reshape_to(y, Shape{y.shape()[0], 1}) : y;
  Shape g_shape = a.grad.shape();
  if (x.dim() == 1) g_shape.insert(g_shape.end() - (y.dim() == 1 ? 0 : 1), 1);
  if (y.dim() == 1) g_shape.push_back(1);
  const X g = reshape_to(a.grad, g_shape);
  InputGrads<X> out(2);
  if (a.needs_grad(0)) out[0] = reshape_to(sum_to(run<"matmul">({}, g, transpose_last(b2)), a2.shape()), x.shape());
  if (a.needs_grad(1)) out[1] = reshape_to(sum_to(run<"matmul">({}, transpose_last(a2), g), b2.shape()), y.shape());
  return out;
}

// linear (y = x W^T) and linear_bias.
template <class X>
InputGrads<X> linear_backward(const BackwardArgs<X>& a) {
  const X& x = a.inputs[0];
  const X& w = a.inputs[1];
  InputGrads<X> out(a.inputs.size());
  if (a.needs_grad(0)) out[0] = run<"matmul">({}, a.grad, w);
  const std::string batch = std::string("abcdefghijklmnopqrstuvwx").substr(0, static_cast<std::size_t>(x.dim() - 1));
  if (a.needs_grad(1)) out[1] = run<"einsum">(EinsumAttrs{.equation = batch + "z," + batch + "y->zy"}, a.grad, x);
  if (a.inputs.size() > 2 && a.needs_grad(2)) out[2] = sum_to(a.grad, a.inputs[2].shape());
  return out;
}

// ---- Reductions ----------------------------------------------------------------------

}  // namespace

void add_einsum_rules(RuleList& r) {
  r.emplace_back("einsum", make_backward([](const auto& a) { return einsum_backward(a); }));
  r.emplace_back("matmul", make_backward([](const auto& a) { return matmul_backward(a); }));
  r.emplace_back("bmm", make_backward([](const auto& a) { return matmul_backward(a); }));
  r.emplace_back("linear", make_backward([](const auto& a) { return linear_backward(a); }));
  r.emplace_back("linear_bias", make_backward([](const auto& a) { return linear_backward(a); }));
}

void add_shape_rules(RuleList& r) {
  using rules::run;
  r.emplace_back("sum", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   return InputGrads<X>{
                       expand_reduced("sum", a.grad, a.inputs[0], a.attrs.template get<ReduceAttrs>("sum"))};
                 }));
  // Over the global count, exact on uneven shards.
  r.emplace_back("mean", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   const auto& attrs = a.attrs.template get<ReduceAttrs>("mean");
                   double count = 1;
                   for (auto d : reduced_dims("mean", attrs, a.inputs[0].shape().size()))
                     count *= static_cast<double>(a.inputs[0].shape()[static_cast<std::size_t>(d)]);
                   return InputGrads<X>{scale(expand_reduced("mean", a.grad, a.inputs[0], attrs), 1.0 / count)};
                 }));
  // Shape ops: the gradient reshaped, transposed or summed back.
  auto reshaped = make_backward([](const auto& a) {
    using X = std::decay_t<decltype(a.grad)>;
    return InputGrads<X>{reshape_to(a.grad, a.inputs[0].shape())};
  });
  for (std::string_view name : {"reshape", "view", "flatten", "unflatten", "squeeze", "unsqueeze"})
    r.emplace_back(name, reshaped);
  r.emplace_back("transpose", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   return InputGrads<X>{run<"transpose">(a.attrs, a.grad)};
                 }));
  r.emplace_back("permute", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   const auto& perm = a.attrs.template get<DimsAttrs>("permute").dims;
                   std::vector<std::int64_t> inverse(perm.size());
                   for (std::size_t i = 0; i < perm.size(); ++i)
                     inverse[static_cast<std::size_t>(
                         wrap_dim("permute", perm[i], static_cast<std::int64_t>(perm.size())))] =
                         static_cast<std::int64_t>(i);
                   return InputGrads<X>{run<"permute">(DimsAttrs{.dims = inverse}, a.grad)};
                 }));
  r.emplace_back("expand", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   return InputGrads<X>{sum_to(a.grad, a.inputs[0].shape())};
                 }));
  r.emplace_back("to", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   return InputGrads<X>{run<"to">(ToAttrs{.dtype = a.inputs[0].dtype()}, a.grad)};
                 }));
  // narrow: the gradient padded with zeros back to the input's extent.
  r.emplace_back("narrow", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   const X& x = a.inputs[0];
                   const auto& n = a.attrs.template get<NarrowAttrs>("narrow");
                   const auto dim = wrap_dim("narrow", n.dim, static_cast<std::int64_t>(x.shape().size()));
                   const auto size = x.shape()[static_cast<std::size_t>(dim)];
                   const auto start = n.start < 0 ? n.start + size : n.start;
                   const auto after = size - start - n.length;
                   std::vector<X> parts;
                   if (start > 0)
                     parts.push_back(
                         zeros_like(run<"narrow">(NarrowAttrs{.dim = dim, .start = 0, .length = start}, x)));
                   parts.push_back(a.grad);
                   if (after > 0)
                     parts.push_back(zeros_like(
                         run<"narrow">(NarrowAttrs{.dim = dim, .start = start + n.length, .length = after}, x)));
                   if (parts.size() == 1) return InputGrads<X>{a.grad};
                   return InputGrads<X>{
                       call_op(registered_op<"cat">(), std::span<const X>(parts), DimAttrs{.dim = dim})};
                 }));
  // cat and stack: each input's slice of the gradient.
  auto pieces = [](const auto& a, bool stacked) {
    using X = std::decay_t<decltype(a.grad)>;
    const auto nd = a.grad.shape().size();
    const auto dim = wrap_dim(stacked ? "stack" : "cat", a.attrs.template get<DimAttrs>(stacked ? "stack" : "cat").dim,
                              static_cast<std::int64_t>(nd));
    InputGrads<X> out(a.inputs.size());
    std::int64_t at = 0;
    for (std::size_t i = 0; i < a.inputs.size(); ++i) {
      const auto len = stacked ? 1 : a.inputs[i].shape()[static_cast<std::size_t>(dim)];
      if (a.needs_grad(i))
        out[i] =
            reshape_to(run<"narrow">(NarrowAttrs{.dim = dim, .start = at, .length = len}, a.grad), a.inputs[i].shape());
      at += len;
    }
    return out;
  };
  r.emplace_back("cat", make_backward([pieces](const auto& a) { return pieces(a, false); }));
  r.emplace_back("stack", make_backward([pieces](const auto& a) { return pieces(a, true); }));
}

}  // namespace dtensor
