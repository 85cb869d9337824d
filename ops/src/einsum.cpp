// The einsum family: einsum, matmul, bmm, linear and linear_bias. Each op is
// translated into one einsum over labelled dims (matmul's broadcast batch
// dims and 1-D cases, linear's x W^T); one strategy rule and one kernel
// serve them all, as Shardy's factor rules do.
#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "device_kernels.h"
#include "dtensor/core/error.h"
#include "families.h"

namespace dtensor {
namespace {

// ---- The einsum form ------------------------------------------------------

/// One label (a char) per dim of each input and of the output.
struct Einsum {
  std::vector<std::string> inputs;
  std::string output;
};

std::string shape_text(const Shape& s) {
  return s.empty() ? std::string("scalar") : fmt::format("{}", fmt::join(s, "x"));
}

std::string shapes_text(std::span<const TensorMeta> in) {
  std::vector<std::string> parts;
  for (const auto& m : in) parts.push_back(shape_text(m.shape));
  return fmt::format("{}", fmt::join(parts, ", "));
}

bool has(std::string_view labels, char c) { return labels.find(c) != std::string_view::npos; }
int count(std::string_view labels, char c) { return static_cast<int>(std::count(labels.begin(), labels.end(), c)); }

/// Parses an equation ("bij,bjk->bik", "ij->", "...ij,...jk", "ii") against
/// the inputs' ranks; "..." becomes fresh labels, right-aligned as in
/// broadcasting. Without "->" the output is the ellipsis dims then the labels
/// that appear once, in alphabetical order (NumPy's rule).
Einsum parse_equation(std::string_view op, const std::string& equation, std::span<const TensorMeta> in) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq += c;
  auto fail = [&](const std::string& why) {
    return ValueError(fmt::format("[{}] equation '{}': {}", op, equation, why));
  };
  const auto arrow = eq.find("->");
  std::string lhs = arrow == std::string::npos ? eq : eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (std::size_t start = 0;;) {
    auto comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != in.size())
    throw fail(fmt::format("it names {} operands, got {} tensors", terms.size(), in.size()));
  // Labels in use, to draw the ellipsis labels from the rest.
  std::string used;
  for (char c : eq)
    if (std::isalpha(static_cast<unsigned char>(c)))
      used += c;
    else if (c != '.' && c != ',' && c != '-' && c != '>')
      throw fail(fmt::format("unexpected character '{}'", c));
  std::string pool;
  for (char c : std::string("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))
    if (!has(used, c)) pool += c;

  auto split_ellipsis = [&](const std::string& term, std::string& before, std::string& after) {
    auto dots = term.find("...");
    if (dots == std::string::npos) {
      if (term.find('.') != std::string::npos) throw fail(fmt::format("stray '.' in '{}'", term));
      before = term;
      return false;
    }
    before = term.substr(0, dots);
    after = term.substr(dots + 3);
    if (after.find('.') != std::string::npos || before.find('.') != std::string::npos)
      throw fail(fmt::format("more than one '...' in '{}'", term));
    return true;
  };
  Einsum e;
  std::vector<int> ell_dims(terms.size(), 0);
  std::vector<std::pair<std::string, std::string>> parts(terms.size());
  std::vector<bool> has_ell(terms.size(), false);
  int ell_max = 0;
  for (std::size_t i = 0; i < terms.size(); ++i) {
    has_ell[i] = split_ellipsis(terms[i], parts[i].first, parts[i].second);
    const int explicit_dims = static_cast<int>(parts[i].first.size() + parts[i].second.size());
    const int ndim = static_cast<int>(in[i].shape.size());
    if (has_ell[i] ? explicit_dims > ndim : explicit_dims != ndim)
      throw fail(fmt::format("operand {} '{}' has {} labels for a tensor of shape {} ({} dims)", i, terms[i],
                             explicit_dims, shape_text(in[i].shape), ndim));
    ell_dims[i] = has_ell[i] ? ndim - explicit_dims : 0;
    ell_max = std::max(ell_max, ell_dims[i]);
  }
  if (ell_max > static_cast<int>(pool.size())) throw fail("too many dims under '...'");
  const std::string ell = pool.substr(0, static_cast<std::size_t>(ell_max));
  for (std::size_t i = 0; i < terms.size(); ++i)
    e.inputs.push_back(parts[i].first + ell.substr(ell.size() - static_cast<std::size_t>(ell_dims[i])) +
                       parts[i].second);

  if (arrow == std::string::npos) {
    std::string once;
    for (char c : used)
      if (!has(once, c) && count(used, c) == 1) once += c;
    std::sort(once.begin(), once.end());
    e.output = ell + once;
  } else {
    std::string before, after;
    std::string out_term = eq.substr(arrow + 2);
    if (out_term.find("->") != std::string::npos || out_term.find(',') != std::string::npos)
      throw fail("the output must be one term");
    e.output = split_ellipsis(out_term, before, after) ? before + ell + after : before;
  }
  for (char c : e.output) {
    if (count(e.output, c) > 1) throw fail(fmt::format("label '{}' appears twice in the output", c));
    if (std::none_of(e.inputs.begin(), e.inputs.end(), [&](const std::string& l) { return has(l, c); }))
      throw fail(fmt::format("output label '{}' is in no operand", c));
  }
  return e;
}

/// Size of every label. Holders of a label must agree or have size 1
/// (broadcast); a label repeated within one operand (a diagonal) must have
/// one size there. ShapeError naming the op, the label and the shapes.
std::map<char, std::int64_t> label_sizes(std::string_view op, const Einsum& e, std::span<const TensorMeta> in) {
  std::map<char, std::int64_t> sizes;
  for (std::size_t i = 0; i < e.inputs.size(); ++i)
    for (std::size_t d = 0; d < e.inputs[i].size(); ++d) {
      const char c = e.inputs[i][d];
      const std::int64_t s = in[i].shape[d];
      auto [it, fresh] = sizes.emplace(c, s);
      if (fresh || it->second == s) continue;
      const bool repeated_here = count(e.inputs[i], c) > 1;
      if (!repeated_here && s == 1) continue;
      if (!repeated_here && it->second == 1) {
        it->second = s;
        continue;
      }
      throw ShapeError(fmt::format("[{}] dim '{}' has sizes {} and {} in inputs of shapes {}", op, c, it->second, s,
                                   shapes_text(in)));
    }
  // A repeated label must agree within its operand even where another
  // operand broadcasts it.
  for (std::size_t i = 0; i < e.inputs.size(); ++i)
    for (std::size_t d = 0; d < e.inputs[i].size(); ++d) {
      const char c = e.inputs[i][d];
      if (count(e.inputs[i], c) > 1 && in[i].shape[d] != sizes[c])
        throw ShapeError(fmt::format("[{}] dim '{}' has sizes {} and {} in inputs of shapes {}", op, c, sizes[c],
                                     in[i].shape[d], shapes_text(in)));
    }
  return sizes;
}

/// Whether dim d of operand i is a size-1 dim broadcast against a larger one.
bool broadcast_dim(const Einsum& e, const std::map<char, std::int64_t>& sizes, std::span<const TensorMeta> in,
                   std::size_t i, std::size_t d) {
  return in[i].shape[d] == 1 && sizes.at(e.inputs[i][d]) != 1;
}

// ---- Translations of the named ops ----------------------------------------

constexpr std::string_view kBatchLabels = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// torch.matmul: 1-D operands gain and lose a dim, batch dims broadcast.
Einsum matmul_einsum(std::string_view op, std::span<const TensorMeta> in) {
  const Shape& a = in[0].shape;
  const Shape& b = in[1].shape;
  if (a.empty() || b.empty())
    throw ShapeError(
        fmt::format("[{}] needs operands of at least 1 dim, got shapes {} and {}", op, shape_text(a), shape_text(b)));
  const std::int64_t ka = a.back();
  const std::int64_t kb = b.size() == 1 ? b[0] : b[b.size() - 2];
  if (ka != kb)
    throw ShapeError(fmt::format("[{}] shapes {} and {}: the contracted dims differ ({} vs {})", op, shape_text(a),
                                 shape_text(b), ka, kb));
  const std::size_t batch_a = a.size() > 2 ? a.size() - 2 : 0;
  const std::size_t batch_b = b.size() > 2 ? b.size() - 2 : 0;
  const std::size_t nb = std::max(batch_a, batch_b);
  if (nb > kBatchLabels.size()) throw ShapeError(fmt::format("[{}] too many batch dims: {}", op, nb));
  const std::string batch(kBatchLabels.substr(0, nb));
  Einsum e;
  e.inputs.push_back(a.size() == 1 ? std::string("k") : batch.substr(nb - batch_a) + "ik");
  e.inputs.push_back(b.size() == 1 ? std::string("k") : batch.substr(nb - batch_b) + "kj");
  e.output = batch + (a.size() == 1 ? "" : "i") + (b.size() == 1 ? "" : "j");
  return e;
}

Einsum bmm_einsum(std::string_view op, std::span<const TensorMeta> in) {
  const Shape& a = in[0].shape;
  const Shape& b = in[1].shape;
  if (a.size() != 3 || b.size() != 3 || a[0] != b[0] || a[2] != b[1])
    throw ShapeError(fmt::format("[{}] expects [b,n,k] and [b,k,m] with equal b and k, got shapes {} and {}", op,
                                 shape_text(a), shape_text(b)));
  return Einsum{{"Bik", "Bkj"}, "Bij"};
}

/// y = x W^T: x [..., in], W [out, in] -> [..., out].
Einsum linear_einsum(std::string_view op, std::span<const TensorMeta> in) {
  const Shape& x = in[0].shape;
  const Shape& w = in[1].shape;
  if (x.empty() || w.size() != 2 || x.back() != w[1])
    throw ShapeError(fmt::format("[{}] expects x [..., in] and weight [out, in], got shapes {} and {}", op,
                                 shape_text(x), shape_text(w)));
  const std::size_t nb = x.size() - 1;
  if (nb > kBatchLabels.size()) throw ShapeError(fmt::format("[{}] too many batch dims: {}", op, nb));
  const std::string batch(kBatchLabels.substr(0, nb));
  return Einsum{{batch + "k", "jk"}, batch + "j"};
}

// ---- Strategy: one rule for the family -------------------------------------

/// Per mesh dim: all Replicate; for each label (not of size 1, not repeated
/// within an operand) its holders sharded on it, with the output sharded on
/// it if it is an output label and Partial(sum) if it is contracted; and, as
/// einsum is linear in each operand, one operand Partial(sum) with the rest
/// Replicate gives Partial(sum). Broadcast size-1 dims stay Replicate. With a
/// bias (the last input, along the output's last dim) the bias is sharded
/// with that dim, Partial(sum) when the output is, Replicate otherwise.
std::vector<DimStrategy> einsum_options(const Einsum& e, const std::map<char, std::int64_t>& sizes,
                                        std::span<const TensorMeta> in, bool bias) {
  const std::size_t n = e.inputs.size();
  const std::size_t total = n + (bias ? 1 : 0);
  const auto last_out = static_cast<std::int64_t>(e.output.size()) - 1;
  std::vector<DimStrategy> options;
  options.push_back({std::vector<Placement>(total, Replicate{}), Replicate{}});
  std::string seen;
  for (const auto& labels : e.inputs)
    for (char c : labels) {
      if (has(seen, c)) continue;
      seen += c;
      if (sizes.at(c) <= 1) continue;
      if (std::any_of(e.inputs.begin(), e.inputs.end(), [&](const std::string& l) { return count(l, c) > 1; }))
        continue;
      DimStrategy s{std::vector<Placement>(total, Replicate{}), Replicate{}};
      for (std::size_t i = 0; i < n; ++i) {
        const auto d = e.inputs[i].find(c);
        if (d != std::string::npos && !broadcast_dim(e, sizes, in, i, d))
          s.inputs[i] = Shard{static_cast<std::int64_t>(d)};
      }
      const auto od = e.output.find(c);
      if (od != std::string::npos) {
        s.output = Shard{static_cast<std::int64_t>(od)};
        if (bias && static_cast<std::int64_t>(od) == last_out) s.inputs[n] = Shard{0};
      } else {
        s.output = Partial{ReduceOp::Sum};
        if (bias) s.inputs[n] = Partial{ReduceOp::Sum};
      }
      options.push_back(std::move(s));
    }
  for (std::size_t i = 0; i < n; ++i) {
    DimStrategy s{std::vector<Placement>(total, Replicate{}), Partial{ReduceOp::Sum}};
    s.inputs[i] = Partial{ReduceOp::Sum};
    if (bias) s.inputs[n] = Partial{ReduceOp::Sum};
    options.push_back(std::move(s));
  }
  return options;
}

// ---- Kernel: local einsum by batched GEMM -----------------------------------
// Written once against a device's table (device_kernels.h): every step moves
// data through it, and every new tensor is made on its input's device.

/// A contiguous tensor with one distinct label per dim.
struct Operand {
  Tensor t;
  std::string labels;
};

/// out[idx] = src[sum idx[d] * src_strides[d]] for every index of out_shape.
Tensor gather(const device::Kernels& k, const Tensor& src, const Shape& out_shape, const Shape& src_strides) {
  Tensor out = Tensor::empty(out_shape, src.dtype(), src.device());
  k.gather_strided(src, out, src_strides);
  return out;
}

/// The operand with its dims in `target` order (a copy unless already so).
Operand permute(const device::Kernels& k, const Operand& x, const std::string& target) {
  if (x.labels == target) return x;
  const Shape strides = row_major_strides(x.t.shape());
  Shape shape, src;
  for (char c : target) {
    const auto d = x.labels.find(c);
    shape.push_back(x.t.shape()[d]);
    src.push_back(strides[d]);
  }
  return Operand{gather(k, x.t, shape, src), target};
}

/// Sums out the labels not in `keep`.
Operand sum_out(const device::Kernels& k, const Operand& x, std::string_view keep) {
  std::string kept, summed;
  for (char c : x.labels) (has(keep, c) ? kept : summed) += c;
  if (summed.empty()) return x;
  Operand p = permute(k, x, kept + summed);
  Shape shape;
  std::int64_t rows = 1, cols = 1;
  for (std::size_t d = 0; d < p.labels.size(); ++d) {
    if (d < kept.size()) {
      shape.push_back(p.t.shape()[d]);
      rows *= p.t.shape()[d];
    } else {
      cols *= p.t.shape()[d];
    }
  }
  Tensor out = Tensor::empty(shape, x.t.dtype(), x.t.device());
  k.sum_last(p.t, out, rows, cols);
  return Operand{out, kept};
}

/// Takes the diagonal of repeated labels and drops broadcast size-1 dims.
Operand prepare(const device::Kernels& k, const Tensor& local, const std::string& labels, const Einsum& e,
                const std::map<char, std::int64_t>& sizes, std::span<const TensorMeta> global, std::size_t i) {
  const Shape strides = row_major_strides(local.shape());
  std::string out_labels;
  Shape shape, src;
  bool copy = false;
  for (std::size_t d = 0; d < labels.size(); ++d) {
    if (broadcast_dim(e, sizes, global, i, d)) continue;
    const auto at = out_labels.find(labels[d]);
    if (at != std::string::npos) {
      src[at] += strides[d];
      copy = true;
      continue;
    }
    out_labels += labels[d];
    shape.push_back(local.shape()[d]);
    src.push_back(strides[d]);
  }
  return Operand{copy ? gather(k, local, shape, src) : local.view(shape), out_labels};
}

std::int64_t extent(const Operand& x, std::string_view labels) {
  std::int64_t n = 1;
  for (char c : labels) n *= x.t.shape()[x.labels.find(c)];
  return n;
}

/// Where the device's GEMM accumulates (Kernels::gemm_accumulates), a bias to
/// fold into the last GEMM: when that GEMM's result has the output's labels
/// in order, C starts as the broadcast bias and the GEMM adds to it (BLAS
/// beta = 1), so bf16/f16 round once on CUDA and no separate pass over the
/// output runs. `applied` tells the caller.
struct BiasFold {
  const Tensor* bias = nullptr;
  std::string_view output;
  bool applied = false;
};

/// A (x) B over their common labels: those in `keep` stay as batch dims, the
/// others are contracted. One GEMM per batch index (one batched GEMM on
/// CUDA); operands are permuted only when no transposition flag fits their
/// layout.
Operand contract(const device::Kernels& dev, Operand a, Operand b, std::string_view keep, BiasFold* fold = nullptr) {
  std::string keep_a(keep), keep_b(keep);
  keep_a += b.labels;
  keep_b += a.labels;
  a = sum_out(dev, a, keep_a);
  b = sum_out(dev, b, keep_b);
  std::string batch, contr, free_a, free_b;
  for (char c : a.labels) (!has(b.labels, c) ? free_a : has(keep, c) ? batch : contr) += c;
  for (char c : b.labels)
    if (!has(a.labels, c)) free_b += c;
  for (char c : batch + contr)
    if (a.t.shape()[a.labels.find(c)] != b.t.shape()[b.labels.find(c)])
      throw Error(fmt::format("[einsum] internal: local sizes of dim '{}' differ ({} vs {})", c,
                              a.t.shape()[a.labels.find(c)], b.t.shape()[b.labels.find(c)]));
  bool ta = false, tb = false;
  if (a.labels == batch + contr + free_a && !free_a.empty() && !contr.empty())
    ta = true;
  else
    a = permute(dev, a, batch + free_a + contr);
  if (b.labels == batch + free_b + contr && !free_b.empty() && !contr.empty())
    tb = true;
  else
    b = permute(dev, b, batch + contr + free_b);
  const std::int64_t nb = extent(a, batch), m = extent(a, free_a), k = extent(a, contr), n = extent(b, free_b);
  Shape shape;
  for (char c : batch + free_a) shape.push_back(a.t.shape()[a.labels.find(c)]);
  for (char c : free_b) shape.push_back(b.t.shape()[b.labels.find(c)]);
  Tensor out = Tensor::empty(shape, a.t.dtype(), a.t.device());
  std::string labels = batch + free_a + free_b;
  bool accumulate = false;
  if (dev.gemm_accumulates(a.t.dtype()) && fold && fold->bias && labels == fold->output && !shape.empty() &&
      fold->bias->numel() == shape.back()) {
    Shape strides(shape.size(), 0);
    strides.back() = 1;
    dev.gather_strided(*fold->bias, out, strides);
    fold->applied = accumulate = true;
  }
  dev.gemm_batched(a.t.dtype(), ta, tb, m, n, k, a.t.data(), ta ? m : k, m * k, b.t.data(), tb ? k : n, k * n,
                   out.data(), n, m * n, nb, accumulate);
  return Operand{out, std::move(labels)};
}

/// The einsum of the local shards. The strategy guarantees that the labels
/// the operands share have the same local extent.
Tensor einsum_local(const device::Kernels& k, const Einsum& e, std::span<const Tensor> locals,
                    std::span<const TensorMeta> global, const std::map<char, std::int64_t>& sizes,
                    BiasFold* fold = nullptr) {
  const std::size_t n = e.inputs.size();
  Operand acc = prepare(k, locals[0], e.inputs[0], e, sizes, global, 0);
  for (std::size_t j = 1; j < n; ++j) {
    std::string keep = e.output;
    for (std::size_t l = j + 1; l < n; ++l) keep += e.inputs[l];
    acc = contract(k, acc, prepare(k, locals[j], e.inputs[j], e, sizes, global, j), keep, j + 1 == n ? fold : nullptr);
  }
  acc = permute(k, sum_out(k, acc, e.output), e.output);
  return acc.t;
}

// ---- Registration ------------------------------------------------------------

using ToEinsum = std::function<Einsum(std::string_view op, std::span<const TensorMeta> in, const OpAttrs& attrs)>;

TensorMeta einsum_meta(std::string_view op, const ToEinsum& to_einsum, std::span<const TensorMeta> in,
                       const OpAttrs& attrs, bool bias) {
  if (in.empty()) throw ValueError(fmt::format("[{}] needs at least one tensor", op));
  for (const auto& m : in)
    if (m.dtype != in[0].dtype)
      throw DTypeError(fmt::format("[{}] inputs have dtypes {} and {}; expected one dtype", op, in[0].dtype, m.dtype));
  const auto operands = bias ? in.first(in.size() - 1) : in;
  const Einsum e = to_einsum(op, operands, attrs);
  const auto sizes = label_sizes(op, e, operands);
  TensorMeta out{{}, in[0].dtype};
  for (char c : e.output) out.shape.push_back(sizes.at(c));
  if (bias && (in.back().shape.size() != 1 || out.shape.empty() || in.back().shape[0] != out.shape.back()))
    throw ShapeError(fmt::format("[{}] bias of shape {} for an output of shape {}; expected [{}]", op,
                                 shape_text(in.back().shape), shape_text(out.shape),
                                 out.shape.empty() ? 0 : out.shape.back()));
  return out;
}

void add_einsum_op(OpRegistry& registry, std::string name, int num_inputs, bool bias, std::string doc,
                   ToEinsum to_einsum) {
  OpDef def;
  def.name = name;
  def.num_inputs = num_inputs;
  def.doc = std::move(doc);
  def.meta = [name, to_einsum, bias](std::span<const TensorMeta> in, const OpAttrs& attrs) {
    return einsum_meta(name, to_einsum, in, attrs, bias);
  };
  def.dim_strategy = [name, to_einsum, bias](const StrategyQuery& q) {
    const auto operands = bias ? q.inputs.first(q.inputs.size() - 1) : q.inputs;
    const Einsum e = to_einsum(name, operands, q.attrs);
    return einsum_options(e, label_sizes(name, e, operands), operands, bias);
  };
  device::bind_kernels(def, [name, to_einsum, bias](const device::Kernels& k) {
    return [&k, name, to_einsum, bias](const KernelArgs& a) {
      const std::size_t n = a.inputs.size() - (bias ? 1 : 0);
      const auto global = a.global.first(n);
      const Einsum e = to_einsum(name, global, a.attrs);
      BiasFold fold{bias ? &a.inputs[n] : nullptr, e.output};
      Tensor out = einsum_local(k, e, a.inputs.first(n), global, label_sizes(name, e, global), &fold);
      if (!bias || fold.applied) return out;
      const Tensor& b = a.inputs[n];
      const std::int64_t cols = out.shape().empty() ? 1 : out.shape().back();
      if (b.numel() != cols)
        throw Error(fmt::format("[{}] internal: a bias shard of {} for {} output columns", name, b.numel(), cols));
      k.add_bias(out, b, cols == 0 ? 0 : out.numel() / cols, cols);
      return out;
    };
  });
  registry.add(std::move(def));
}

}  // namespace

void register_einsum_ops(OpRegistry& registry) {
  add_einsum_op(registry, "einsum", -1, false,
                "Einstein summation over EinsumAttrs::equation (\"bij,bjk->bik\", \"...ij,...jk\", \"ii->i\")",
                [](std::string_view op, std::span<const TensorMeta> in, const OpAttrs& attrs) {
                  return parse_equation(op, attrs.get<EinsumAttrs>(op).equation, in);
                });
  add_einsum_op(registry, "matmul", 2, false, "torch.matmul: 1-D to N-D operands, batch dims broadcast",
                [](std::string_view op, std::span<const TensorMeta> in, const OpAttrs&) {
                  return matmul_einsum(op, in);
                });
  add_einsum_op(registry, "bmm", 2, false, "batched matrix product [b,n,k] x [b,k,m] -> [b,n,m]",
                [](std::string_view op, std::span<const TensorMeta> in, const OpAttrs&) { return bmm_einsum(op, in); });
  add_einsum_op(registry, "linear", 2, false, "y = x W^T: x [..., in], weight [out, in]",
                [](std::string_view op, std::span<const TensorMeta> in, const OpAttrs&) {
                  return linear_einsum(op, in);
                });
  add_einsum_op(registry, "linear_bias", 3, true, "y = x W^T + b: x [..., in], weight [out, in], bias [out]",
                [](std::string_view op, std::span<const TensorMeta> in, const OpAttrs&) {
                  return linear_einsum(op, in);
                });
}

}  // namespace dtensor
