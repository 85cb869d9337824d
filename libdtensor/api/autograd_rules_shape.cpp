// Backward rules of the einsum family, the reductions and the shape ops,
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

// "ij,jk" -> {"ij", "jk"}.
std::vector<std::string> operand_terms(const std::string& lhs) {
  std::vector<std::string> terms;
  for (std::size_t start = 0;;) {
    auto comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return terms;
}

// The equation with each '...' spelled out as upper-case labels, right
// aligned across the operands as NumPy broadcasts them (an implicit output
// puts them first).
std::string spell_ellipsis(const std::string& eq, std::span<const std::size_t> ranks) {
  if (eq.find("...") == std::string::npos) return eq;
  const auto arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  const std::vector<std::string> terms = operand_terms(lhs);
  const std::string labels = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::size_t widest = 0;
  std::vector<std::size_t> width(terms.size(), 0);
  for (std::size_t i = 0; i < terms.size() && i < ranks.size(); ++i)
    if (terms[i].find("...") != std::string::npos) {
      width[i] = ranks[i] - (terms[i].size() - 3);
      widest = std::max(widest, width[i]);
    }
  std::string out;
  for (std::size_t i = 0; i < terms.size(); ++i) {
    std::string t = terms[i];
    if (auto at = t.find("..."); at != std::string::npos) t.replace(at, 3, labels.substr(widest - width[i], width[i]));
    out += (i ? "," : "") + t;
  }
  const std::string all = labels.substr(0, widest);
  if (arrow == std::string::npos) return out + "->" + all + implicit_output(lhs);
  std::string rhs = eq.substr(arrow + 2);
  if (auto at = rhs.find("..."); at != std::string::npos) rhs.replace(at, 3, all);
  return out + "->" + rhs;
}

// einsum's gradient for operand i: the same contraction with the output's
// gradient in place of operand i and operand i's subscripts as the output
// ("ij,jk->ik" gives "ik,jk->ij" for the first). A label of operand i found
// nowhere else was summed over: its gradient is broadcast back; a label of
// size 1 in operand i that broadcast against a larger size is summed back.
template <class X>
InputGrads<X> einsum_backward(const BackwardArgs<X>& a) {
  std::string spaced;
  for (char c : a.attrs.template get<EinsumAttrs>("einsum").equation)
    if (c != ' ') spaced += c;
  std::vector<std::size_t> ranks;
  for (const X& x : a.inputs) ranks.push_back(x.shape().size());
  const std::string eq = spell_ellipsis(spaced, ranks);
  const auto arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  const std::string out_labels = arrow == std::string::npos ? implicit_output(lhs) : eq.substr(arrow + 2);
  const std::vector<std::string> terms = operand_terms(lhs);
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
    Shape kept_sizes;  // operand i's sizes of the kept labels
    Shape kept_shape = a.inputs[i].shape();
    for (std::size_t d = 0; d < mine.size(); ++d) {
      if (std::count(mine.begin(), mine.end(), mine[d]) > 1)
        throw AutogradError(
            fmt::format("[backward] einsum '{}': a repeated subscript in one operand ('{}') is "
                        "not supported",
                        spaced, mine));
      if (elsewhere.find(mine[d]) != std::string::npos) {
        kept += mine[d];
        kept_sizes.push_back(a.inputs[i].shape()[d]);
      } else {
        kept_shape[d] = 1;
      }
    }
    X g = sum_to(call_op(registered_op<"einsum">(), std::span<const X>(operands),
                         EinsumAttrs{.equation = new_lhs + "->" + kept}),
                 kept_sizes);
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

// The reduced dims (normalised), all of them when none are named.
std::vector<std::int64_t> reduced_dims(const ReduceAttrs& r, std::size_t nd) {
  std::vector<std::int64_t> dims;
  if (r.dims.empty())
    for (std::size_t d = 0; d < nd; ++d) dims.push_back(static_cast<std::int64_t>(d));
  else
    for (auto d : r.dims) dims.push_back(norm_dim(d, nd));
  return dims;
}

/// The reduced output's gradient broadcast back over the reduced dims.
template <class X>
X expand_reduced(const X& g, const X& x, const ReduceAttrs& r) {
  Shape kept = x.shape();
  for (auto d : reduced_dims(r, kept.size())) kept[static_cast<std::size_t>(d)] = 1;
  return run<"expand">(ShapeAttrs{.shape = x.shape()}, reshape_to(g, kept));
}

template <class X>
X softmax_grad(const X& y, const X& g, std::int64_t dim) {
  const X gy = run<"mul">({}, g, y);
  return run<"mul">({}, y, run<"sub">({}, g, run<"sum">(ReduceAttrs{.dims = {dim}, .keepdim = true}, gy)));
}

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
                   return InputGrads<X>{expand_reduced(a.grad, a.inputs[0], a.attrs.template get<ReduceAttrs>("sum"))};
                 }));
  // Over the global count, exact on uneven shards.
  r.emplace_back("mean", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   const auto& attrs = a.attrs.template get<ReduceAttrs>("mean");
                   double count = 1;
                   for (auto d : reduced_dims(attrs, a.inputs[0].shape().size()))
                     count *= static_cast<double>(a.inputs[0].shape()[static_cast<std::size_t>(d)]);
                   return InputGrads<X>{scale(expand_reduced(a.grad, a.inputs[0], attrs), 1.0 / count)};
                 }));
  r.emplace_back("softmax", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   const auto dim = norm_dim(a.attrs.template get<DimAttrs>("softmax").dim, a.inputs[0].shape().size());
                   return InputGrads<X>{softmax_grad(a.output, a.grad, dim)};
                 }));
  r.emplace_back("log_softmax", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   const auto dim =
                       norm_dim(a.attrs.template get<DimAttrs>("log_softmax").dim, a.inputs[0].shape().size());
                   const X total = run<"sum">(ReduceAttrs{.dims = {dim}, .keepdim = true}, a.grad);
                   return InputGrads<X>{run<"sub">({}, a.grad, run<"mul">({}, run<"exp">({}, a.output), total))};
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
                     inverse[static_cast<std::size_t>(norm_dim(perm[i], perm.size()))] = static_cast<std::int64_t>(i);
                   return InputGrads<X>{run<"permute">(DimsAttrs{.dims = inverse}, a.grad)};
                 }));
  r.emplace_back("expand", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   return InputGrads<X>{sum_to(a.grad, a.inputs[0].shape())};
                 }));
  // sum_to_shape sums leading and size-1 dims: its gradient is broadcast
  // back over them.
  r.emplace_back("sum_to_shape", make_backward([](const auto& a) {
                   using X = std::decay_t<decltype(a.grad)>;
                   const Shape& x = a.inputs[0].shape();
                   Shape kept(x.size() - a.grad.shape().size(), 1);
                   kept.insert(kept.end(), a.grad.shape().begin(), a.grad.shape().end());
                   return InputGrads<X>{run<"expand">(ShapeAttrs{.shape = x}, reshape_to(a.grad, kept))};
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
                   const auto dim = norm_dim(n.dim, x.shape().size());
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
    const auto dim = norm_dim(a.attrs.template get<DimAttrs>(stacked ? "stack" : "cat").dim, nd);
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
