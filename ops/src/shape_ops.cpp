// The shape ops: views (reshape, permute, squeeze, ...), narrow, cat, stack,
// expand and dtype conversion: their metas, local kernels and registration.
// Every strategy comes from the view algebra (view_algebra.h).
#include <algorithm>
#include <numeric>
#include <optional>

#include "device_kernels.h"
#include "dtensor/core/error.h"
#include "families.h"
#include "view_algebra.h"

namespace dtensor {
namespace {

using view::Group;
using view::identity_rule;
using view::permute_rule;
using view::reshape_rule;
using view::RuleFn;
using view::view_strategies;
using view::ViewRule;

// ---- Local kernels ---------------------------------------------------------
// New tensors are made on the input's device; the strided copies go through
// the device's table (device_kernels.h), views, narrow and cat through
// Tensor's own device-aware copies.

Tensor view_kernel(const KernelArgs& a) { return a.inputs[0].clone().view(a.output_box.size); }

Tensor permute_local(const device::Kernels& k, const Tensor& x, const std::vector<int>& perm) {
  Shape shape, strides;
  const Shape in_strides = row_major_strides(x.shape());
  for (int p : perm) {
    shape.push_back(x.shape()[p]);
    strides.push_back(in_strides[p]);
  }
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  k.gather_strided(x, out, strides);
  return out;
}

// (dispatch has checked that the inputs share one device.)
Tensor concat_local(std::span<const Tensor> xs, int dim, const Shape& out_shape) {
  Tensor out = Tensor::empty(out_shape, xs[0].dtype(), xs[0].device());
  Shape at(out_shape.size(), 0);
  for (const Tensor& x : xs) {
    copy_box(x, full_box(x.shape()), out, at);
    at[dim] += x.shape()[dim];
  }
  return out;
}

// ---- Attribute helpers -----------------------------------------------------

/// The target shape with one -1 inferred; ShapeError if it does not fit.
Shape infer_shape(std::string_view op, const Shape& target, const Shape& from) {
  Shape out = target;
  std::int64_t known = 1;
  int infer = -1;
  for (int d = 0; d < static_cast<int>(out.size()); ++d) {
    if (out[d] == -1) {
      if (infer >= 0)
        throw ShapeError(fmt::format("[{}] shape [{}] has more than one -1", op, fmt::join(target, ", ")));
      infer = d;
    } else if (out[d] < 0) {
      throw ShapeError(fmt::format("[{}] shape [{}] has a negative size", op, fmt::join(target, ", ")));
    } else {
      known *= out[d];
    }
  }
  const std::int64_t n = numel(from);
  if (infer >= 0) {
    if (known == 0 || n % known != 0)
      throw ShapeError(fmt::format("[{}] shape [{}] does not fit {} elements (input {})", op, fmt::join(target, ", "),
                                   n, fmt::join(from, "x")));
    out[infer] = n / known;
  }
  if (numel(out) != n)
    throw ShapeError(fmt::format("[{}] shape [{}] ({} elements) does not fit an input of shape {} ({} elements)", op,
                                 fmt::join(target, ", "), numel(out), fmt::join(from, "x"), n));
  return out;
}

std::vector<int> perm_of(std::string_view op, const std::vector<std::int64_t>& dims, std::int64_t ndim) {
  if (static_cast<std::int64_t>(dims.size()) != ndim)
    throw ShapeError(fmt::format("[{}] permutation [{}] of a {}-d tensor", op, fmt::join(dims, ", "), ndim));
  std::vector<int> perm;
  std::vector<bool> seen(ndim, false);
  for (auto d : dims) {
    int w = wrap_dim(op, d, ndim);
    if (seen[w])
      throw ShapeError(fmt::format("[{}] dim {} repeats in the permutation [{}]", op, d, fmt::join(dims, ", ")));
    seen[w] = true;
    perm.push_back(w);
  }
  return perm;
}

std::vector<int> transpose_perm(const TransposeAttrs& attrs, std::int64_t ndim) {
  std::vector<int> perm(ndim);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[wrap_dim("transpose", attrs.dim0, ndim)], perm[wrap_dim("transpose", attrs.dim1, ndim)]);
  return perm;
}

std::int64_t ndim_of(const TensorMeta& m) { return static_cast<std::int64_t>(m.shape.size()); }

// ---- Registration ----------------------------------------------------------

using KernelMaker = std::function<Kernel(const device::Kernels&)>;

// A kernel that needs no device table (views, narrow, cat: Tensor's copies
// serve every device).
KernelMaker any_device(Kernel kernel) {
  return [kernel = std::move(kernel)](const device::Kernels&) { return kernel; };
}

// What the CPU kernel does with bf16/f16 inputs (OpDef::cpu_handles_half):
// a kernel that only moves elements (views, copies, gathers) takes them as
// they are; one that computes gets them widened to f32.
enum class HalfInputs { AsTheyAre, Widened };

void add_op(OpRegistry& reg, std::string name, int num_inputs, std::string doc, MetaFn meta, RuleFn rule,
            const KernelMaker& kernel, HalfInputs half = HalfInputs::AsTheyAre) {
  OpDef def;
  def.cpu_handles_half = half == HalfInputs::AsTheyAre;
  def.name = std::move(name);
  def.num_inputs = num_inputs;
  def.doc = std::move(doc);
  def.meta = std::move(meta);
  def.strategy = [rule = std::move(rule)](const StrategyQuery& q) {
    return view_strategies(rule(q.inputs, q.attrs, q.output), q);
  };
  device::bind_kernels(def, kernel);
  reg.add(std::move(def));
}

/// A pure reshape: its meta gives the output shape; rule and kernel follow.
void add_reshape_op(OpRegistry& reg, std::string name, std::string doc,
                    std::function<Shape(std::span<const TensorMeta>, const OpAttrs&)> shape_fn) {
  add_op(
      reg, std::move(name), 1, std::move(doc),
      [shape_fn](std::span<const TensorMeta> in, const OpAttrs& attrs) {
        return TensorMeta{shape_fn(in, attrs), in[0].dtype};
      },
      [](std::span<const TensorMeta> in, const OpAttrs&, const TensorMeta& out) {
        return reshape_rule(in[0].shape, out.shape);
      },
      any_device(view_kernel));
}

void check_same_dtype(std::string_view op, std::span<const TensorMeta> in) {
  if (in.empty()) throw ValueError(fmt::format("[{}] needs at least one tensor", op));
  for (std::size_t i = 1; i < in.size(); ++i)
    if (in[i].dtype != in[0].dtype)
      throw DTypeError(fmt::format("[{}] input {} is {} but input 0 is {}", op, i, in[i].dtype, in[0].dtype));
}

// -- Pure reshapes: output dims from input dims by the reshape groups.

Shape flatten_shape(std::span<const TensorMeta> in, const OpAttrs& op_attrs) {
  const auto& attrs = op_attrs.get<FlattenAttrs>("flatten");
  const Shape& s = in[0].shape;
  const std::int64_t nd = std::max<std::int64_t>(1, ndim_of(in[0]));
  if (s.empty()) return Shape{1};
  int a = wrap_dim("flatten", attrs.start_dim, nd), b = wrap_dim("flatten", attrs.end_dim, nd);
  if (a > b) throw ShapeError(fmt::format("[flatten] start dim {} after end dim {}", attrs.start_dim, attrs.end_dim));
  Shape out(s.begin(), s.begin() + a);
  out.push_back(std::accumulate(s.begin() + a, s.begin() + b + 1, std::int64_t{1}, std::multiplies<>()));
  out.insert(out.end(), s.begin() + b + 1, s.end());
  return out;
}

Shape unflatten_shape(std::span<const TensorMeta> in, const OpAttrs& op_attrs) {
  const auto& attrs = op_attrs.get<UnflattenAttrs>("unflatten");
  const Shape& s = in[0].shape;
  int d = wrap_dim("unflatten", attrs.dim, ndim_of(in[0]));
  if (attrs.sizes.empty()) throw ValueError("[unflatten] expects the sizes in UnflattenAttrs::sizes, got none");
  Shape sizes = infer_shape("unflatten", attrs.sizes, Shape{s[d]});
  Shape out(s.begin(), s.begin() + d);
  out.insert(out.end(), sizes.begin(), sizes.end());
  out.insert(out.end(), s.begin() + d + 1, s.end());
  return out;
}

Shape squeeze_shape(std::span<const TensorMeta> in, const OpAttrs& op_attrs) {
  const auto& dims = op_attrs.get<DimsAttrs>("squeeze").dims;
  const Shape& s = in[0].shape;
  std::vector<bool> drop(s.size(), false);
  if (dims.empty()) {
    for (std::size_t d = 0; d < s.size(); ++d) drop[d] = s[d] == 1;
  } else {
    for (auto d : dims) {
      int w = wrap_dim("squeeze", d, ndim_of(in[0]));
      drop[w] = s[w] == 1;  // PyTorch: a dim that is not 1 stays
    }
  }
  Shape out;
  for (std::size_t d = 0; d < s.size(); ++d)
    if (!drop[d]) out.push_back(s[d]);
  return out;
}

Shape unsqueeze_shape(std::span<const TensorMeta> in, const OpAttrs& attrs) {
  Shape out = in[0].shape;
  int d = wrap_dim("unsqueeze", attrs.get<DimAttrs>("unsqueeze").dim, ndim_of(in[0]) + 1);
  out.insert(out.begin() + d, 1);
  return out;
}

void register_reshapes(OpRegistry& reg) {
  auto reshape_shape = [](std::string_view op) {
    return [op](std::span<const TensorMeta> in, const OpAttrs& attrs) {
      return infer_shape(op, attrs.get<ShapeAttrs>(op).shape, in[0].shape);
    };
  };
  add_reshape_op(reg, "reshape", "reshape to ShapeAttrs::shape (one -1 inferred)", reshape_shape("reshape"));
  add_reshape_op(reg, "view", "view as ShapeAttrs::shape (one -1 inferred); same as reshape", reshape_shape("view"));
  add_reshape_op(reg, "flatten", "merge dims start_dim..end_dim (inclusive) into one", flatten_shape);
  add_reshape_op(reg, "unflatten", "split dim into sizes (one -1 inferred)", unflatten_shape);
  add_reshape_op(reg, "squeeze", "drop size-1 dims DimsAttrs::dims (all size-1 dims if empty)", squeeze_shape);
  add_reshape_op(reg, "unsqueeze", "insert a size-1 dim at DimAttrs::dim", unsqueeze_shape);
}

// -- Permutations: a shard follows its dim.

using PermFn = std::function<std::vector<int>(const OpAttrs&, std::int64_t)>;

void add_permutation(OpRegistry& reg, std::string name, std::string doc, PermFn perm_fn) {
  add_op(
      reg, std::move(name), 1, std::move(doc),
      [perm_fn](std::span<const TensorMeta> in, const OpAttrs& attrs) {
        Shape out;
        for (int p : perm_fn(attrs, ndim_of(in[0]))) out.push_back(in[0].shape[p]);
        return TensorMeta{out, in[0].dtype};
      },
      [perm_fn](std::span<const TensorMeta> in, const OpAttrs& attrs, const TensorMeta&) {
        return permute_rule(perm_fn(attrs, ndim_of(in[0])));
      },
      [perm_fn](const device::Kernels& k) -> Kernel {
        return [&k, perm_fn](const KernelArgs& a) {
          return permute_local(k, a.inputs[0], perm_fn(a.attrs, a.inputs[0].dim()));
        };
      });
}

void register_permutations(OpRegistry& reg) {
  add_permutation(reg, "permute", "reorder dims: output dim i is input dim DimsAttrs::dims[i]",
                  [](const OpAttrs& attrs, std::int64_t nd) {
                    return perm_of("permute", attrs.get<DimsAttrs>("permute").dims, nd);
                  });
  add_permutation(reg, "transpose", "swap dims TransposeAttrs::dim0 and dim1",
                  [](const OpAttrs& attrs, std::int64_t nd) {
                    return transpose_perm(attrs.get<TransposeAttrs>("transpose"), nd);
                  });
}

// -- expand: size-1 dims broadcast to ShapeAttrs::shape (-1 keeps a size);
// new leading dims may be added. Broadcast dims must be whole.

TensorMeta expand_meta(std::span<const TensorMeta> in, const OpAttrs& attrs) {
  const Shape& s = in[0].shape;
  const Shape& t = attrs.get<ShapeAttrs>("expand").shape;
  if (t.size() < s.size())
    throw ShapeError(
        fmt::format("[expand] shape [{}] has fewer dims than the input {}", fmt::join(t, ", "), fmt::join(s, "x")));
  const std::size_t lead = t.size() - s.size();
  Shape out(t.size());
  for (std::size_t o = 0; o < t.size(); ++o) {
    if (o < lead) {
      if (t[o] < 0) throw ShapeError(fmt::format("[expand] new dim {} needs a size, got {}", o, t[o]));
      out[o] = t[o];
    } else {
      const std::int64_t have = s[o - lead];
      if (t[o] == -1 || t[o] == have)
        out[o] = have;
      else if (have == 1 && t[o] >= 0)
        out[o] = t[o];
      else
        throw ShapeError(fmt::format("[expand] dim {} of size {} cannot expand to {} (shape [{}] from {})", o - lead,
                                     have, t[o], fmt::join(t, ", "), fmt::join(s, "x")));
    }
  }
  return TensorMeta{out, in[0].dtype};
}

ViewRule expand_rule(std::span<const TensorMeta> in, const OpAttrs&, const TensorMeta& out) {
  ViewRule r;
  const int lead = static_cast<int>(out.shape.size() - in[0].shape.size());
  for (int o = 0; o < static_cast<int>(out.shape.size()); ++o) {
    if (o < lead)
      r.groups.push_back(Group{{}, {o}, false});
    else
      r.groups.push_back(Group{{o - lead}, {o}, in[0].shape[o - lead] == out.shape[o]});
  }
  return r;
}

Kernel expand_kernel(const device::Kernels& k) {
  return [&k](const KernelArgs& a) {
    const Tensor& x = a.inputs[0];
    const int lead = static_cast<int>(a.output_box.size.size()) - x.dim();
    const Shape xs = row_major_strides(x.shape());
    Shape strides(a.output_box.size.size(), 0);
    for (int d = 0; d < x.dim(); ++d) strides[lead + d] = x.shape()[d] == a.output_box.size[lead + d] ? xs[d] : 0;
    Tensor out = Tensor::empty(a.output_box.size, x.dtype(), x.device());
    k.gather_strided(x, out, strides);
    return out;
  };
}

// -- narrow: the narrowed dim must be whole; others keep their shards.

TensorMeta narrow_meta(std::span<const TensorMeta> in, const OpAttrs& op_attrs) {
  const auto& attrs = op_attrs.get<NarrowAttrs>("narrow");
  Shape out = in[0].shape;
  int d = wrap_dim("narrow", attrs.dim, ndim_of(in[0]));
  std::int64_t start = attrs.start;
  if (start < 0) start += out[d];
  if (start < 0 || attrs.length < 0 || start + attrs.length > out[d])
    throw ShapeError(fmt::format("[narrow] start {} length {} outside dim {} of size {}", attrs.start, attrs.length,
                                 attrs.dim, out[d]));
  out[d] = attrs.length;
  return TensorMeta{out, in[0].dtype};
}

Tensor narrow_kernel(const KernelArgs& a) {
  const auto& attrs = a.attrs.get<NarrowAttrs>("narrow");
  const Tensor& x = a.inputs[0];
  const int d = wrap_dim("narrow", attrs.dim, x.dim());
  std::int64_t start = attrs.start;
  if (start < 0) start += x.shape()[d];
  Box box{Shape(x.dim(), 0), x.shape()};
  box.offset[d] = start;
  box.size[d] = attrs.length;
  return slice_box(x, box);
}

// -- cat and stack: the joined dim must be whole on every input; other dims
// carry the same shard on every input.

TensorMeta cat_meta(std::span<const TensorMeta> in, const OpAttrs& attrs) {
  check_same_dtype("cat", in);
  const std::int64_t nd = ndim_of(in[0]);
  if (nd == 0) throw ShapeError("[cat] cannot concatenate 0-d tensors");
  int d = wrap_dim("cat", attrs.get<DimAttrs>("cat").dim, nd);
  Shape out = in[0].shape;
  for (std::size_t i = 1; i < in.size(); ++i) {
    bool ok = ndim_of(in[i]) == nd;
    for (int k = 0; ok && k < nd; ++k) ok = k == d || in[i].shape[k] == out[k];
    if (!ok)
      throw ShapeError(fmt::format("[cat] input {} has shape {}, which does not match input 0 ({}) off dim {}", i,
                                   fmt::join(in[i].shape, "x"), fmt::join(in[0].shape, "x"), d));
    out[d] += in[i].shape[d];
  }
  return TensorMeta{out, in[0].dtype};
}

TensorMeta stack_meta(std::span<const TensorMeta> in, const OpAttrs& attrs) {
  check_same_dtype("stack", in);
  for (std::size_t i = 1; i < in.size(); ++i)
    if (in[i].shape != in[0].shape)
      throw ShapeError(fmt::format("[stack] input {} has shape {} but input 0 has {}", i, fmt::join(in[i].shape, "x"),
                                   fmt::join(in[0].shape, "x")));
  int d = wrap_dim("stack", attrs.get<DimAttrs>("stack").dim, ndim_of(in[0]) + 1);
  Shape out = in[0].shape;
  out.insert(out.begin() + d, static_cast<std::int64_t>(in.size()));
  return TensorMeta{out, in[0].dtype};
}

ViewRule stack_rule(std::span<const TensorMeta> in, const OpAttrs& attrs, const TensorMeta&) {
  const int nd = static_cast<int>(ndim_of(in[0]));
  const int d = wrap_dim("stack", attrs.get<DimAttrs>("stack").dim, nd + 1);
  ViewRule r;
  for (int o = 0; o <= nd; ++o)
    r.groups.push_back(o == d ? Group{{}, {o}, false} : Group{{o < d ? o : o - 1}, {o}, true});
  return r;
}

Tensor stack_kernel(const KernelArgs& a) {
  const int d = wrap_dim("stack", a.attrs.get<DimAttrs>("stack").dim, a.inputs[0].dim() + 1);
  std::vector<Tensor> xs;
  for (const Tensor& x : a.inputs) {
    Shape s = x.shape();
    s.insert(s.begin() + d, 1);
    xs.push_back(x.view(s));
  }
  return concat_local(xs, d, a.output_box.size);
}

void register_joins(OpRegistry& reg) {
  add_op(
      reg, "cat", -1, "concatenate the inputs along DimAttrs::dim", cat_meta,
      [](std::span<const TensorMeta> in, const OpAttrs& attrs, const TensorMeta&) {
        return identity_rule(static_cast<int>(ndim_of(in[0])),
                             wrap_dim("cat", attrs.get<DimAttrs>("cat").dim, ndim_of(in[0])));
      },
      any_device([](const KernelArgs& a) {
        return concat_local(a.inputs, wrap_dim("cat", a.attrs.get<DimAttrs>("cat").dim, a.inputs[0].dim()),
                            a.output_box.size);
      }));
  add_op(reg, "stack", -1, "stack the inputs along a new dim DimAttrs::dim", stack_meta, stack_rule,
         any_device(stack_kernel));
}

// -- to: elementwise conversion; Partial passes only between floating dtypes
// (a sum of parts rounded to integers is not the rounded sum). The kernel
// converts to the output's dtype, which on the CPU is the compute dtype of
// a bf16/f16 target (dispatch rounds once after).

Kernel to_kernel(const device::Kernels& k) {
  return [&k](const KernelArgs& a) {
    const Tensor& x = a.inputs[0];
    Tensor out = Tensor::empty(x.shape(), a.output.dtype, x.device());
    k.cast(x, out);
    return out;
  };
}

}  // namespace

void register_shape_ops(OpRegistry& reg) {
  register_reshapes(reg);
  register_permutations(reg);
  add_op(reg, "expand", 1, "broadcast size-1 dims to ShapeAttrs::shape (-1 keeps a size)", expand_meta, expand_rule,
         expand_kernel);
  add_op(
      reg, "narrow", 1, "elements start .. start+length of dim (NarrowAttrs)", narrow_meta,
      [](std::span<const TensorMeta> in, const OpAttrs& attrs, const TensorMeta&) {
        return identity_rule(static_cast<int>(ndim_of(in[0])),
                             wrap_dim("narrow", attrs.get<NarrowAttrs>("narrow").dim, ndim_of(in[0])));
      },
      any_device(narrow_kernel));
  register_joins(reg);
  add_op(
      reg, "to", 1, "convert to ToAttrs::dtype",
      [](std::span<const TensorMeta> in, const OpAttrs& attrs) {
        return TensorMeta{in[0].shape, attrs.get<ToAttrs>("to").dtype};
      },
      [](std::span<const TensorMeta> in, const OpAttrs& attrs, const TensorMeta&) {
        ViewRule r = identity_rule(static_cast<int>(ndim_of(in[0])));
        r.linear = is_floating(in[0].dtype) && is_floating(attrs.get<ToAttrs>("to").dtype);
        return r;
      },
      to_kernel, HalfInputs::Widened);
}

}  // namespace dtensor
