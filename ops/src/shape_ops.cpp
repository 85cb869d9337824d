// The shape ops: views (reshape, permute, squeeze, ...), narrow, cat, stack,
// expand and dtype conversion: their metas, local kernels and registration.
// Every strategy comes from the view algebra (view_algebra.h).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>

#include "../cuda/gemm_shape_embedding.h"
#include "dtensor/core/cuda.h"
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
// Each serves CPU and CUDA tensors: new tensors are made on the input's
// device, and the loops over data pick their device by the tensor's (view,
// narrow and cat go through Tensor's own device-aware copies).

/// out[idx] = in[sum idx[d] * in_strides[d]] for every index of out's shape
/// (strides in elements; a stride 0 broadcasts).
void gather_strided(const Tensor& in, Tensor& out, const Shape& in_strides) {
  const int nd = out.dim();
  const std::size_t item = itemsize(out.dtype());
  if (out.numel() == 0) return;
  if (in.device() == Device::CUDA) {
    cuda_kernels::gather_strided(in.data(), out.data(), out.shape(), in_strides, item);
    return;
  }
  const std::byte* src = in.bytes();
  std::byte* dst = out.bytes();
  if (nd == 0) {
    std::memcpy(dst, src, item);
    return;
  }
  Shape idx(nd, 0);
  const std::int64_t inner = out.shape()[nd - 1], inner_stride = in_strides[nd - 1];
  std::int64_t o = 0;
  while (true) {
    std::int64_t base = 0;
    for (int d = 0; d < nd - 1; ++d) base += idx[d] * in_strides[d];
    if (inner_stride == 1) {
      std::memcpy(dst + o * item, src + base * item, inner * item);
    } else {
      for (std::int64_t k = 0; k < inner; ++k)
        std::memcpy(dst + (o + k) * item, src + (base + k * inner_stride) * item, item);
    }
    o += inner;
    int d = nd - 2;
    while (d >= 0 && ++idx[d] == out.shape()[d]) idx[d--] = 0;
    if (d < 0) break;
  }
}

Tensor view_kernel(const KernelArgs& a) { return a.inputs[0].clone().view(a.output_box.size); }

Tensor permute_local(const Tensor& x, const std::vector<int>& perm) {
  Shape shape, strides;
  const Shape in_strides = row_major_strides(x.shape());
  for (int p : perm) {
    shape.push_back(x.shape()[p]);
    strides.push_back(in_strides[p]);
  }
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  gather_strided(x, out, strides);
  return out;
}

Tensor concat_local(std::string_view op, std::span<const Tensor> xs, int dim, const Shape& out_shape) {
  cuda_kernels::on_cuda(op, xs);  // ValueError unless all on one device
  Tensor out = Tensor::empty(out_shape, xs[0].dtype(), xs[0].device());
  Shape at(out_shape.size(), 0);
  for (const Tensor& x : xs) {
    copy_box(x, full_box(x.shape()), out, at);
    at[dim] += x.shape()[dim];
  }
  return out;
}

// ---- Attribute helpers -----------------------------------------------------

int wrap_dim(std::string_view op, std::int64_t d, std::int64_t ndim) {
  if (d < -ndim || d >= ndim)
    throw ShapeError(fmt::format("[{}] dim {} out of range for a {}-d tensor (expected {}..{})", op, d, ndim, -ndim,
                                 ndim - 1));
  return static_cast<int>(d < 0 ? d + ndim : d);
}

std::int64_t one_attr(std::string_view op, const std::vector<std::int64_t>& v, std::string_view what) {
  if (v.size() != 1) throw ValueError(fmt::format("[{}] expects one {} in attrs, got {}", op, what, v.size()));
  return v[0];
}

/// The target shape with one -1 inferred; ShapeError if it does not fit.
Shape infer_shape(std::string_view op, const Shape& target, const Shape& from) {
  Shape out = target;
  std::int64_t known = 1;
  int infer = -1;
  for (int d = 0; d < static_cast<int>(out.size()); ++d) {
    if (out[d] == -1) {
      if (infer >= 0) throw ShapeError(fmt::format("[{}] shape [{}] has more than one -1", op, fmt::join(target, ", ")));
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
    if (seen[w]) throw ShapeError(fmt::format("[{}] dim {} repeats in the permutation [{}]", op, d, fmt::join(dims, ", ")));
    seen[w] = true;
    perm.push_back(w);
  }
  return perm;
}

std::vector<int> transpose_perm(const OpAttrs& attrs, std::int64_t ndim) {
  if (attrs.dims.size() != 2)
    throw ValueError(fmt::format("[transpose] expects two dims in attrs.dims, got {}", attrs.dims.size()));
  std::vector<int> perm(ndim);
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[wrap_dim("transpose", attrs.dims[0], ndim)], perm[wrap_dim("transpose", attrs.dims[1], ndim)]);
  return perm;
}

std::int64_t ndim_of(const TensorMeta& m) { return static_cast<std::int64_t>(m.shape.size()); }

// ---- Registration ----------------------------------------------------------

void add_op(OpRegistry& reg, std::string name, int num_inputs, std::string doc, MetaFn meta, RuleFn rule, Kernel kernel) {
  OpDef def;
  def.name = std::move(name);
  def.num_inputs = num_inputs;
  def.doc = std::move(doc);
  def.meta = std::move(meta);
  def.strategy = [rule = std::move(rule)](const StrategyQuery& q) {
    return view_strategies(rule(q.inputs, q.attrs, q.output), q);
  };
  def.kernels[static_cast<int>(Device::CPU)] = std::move(kernel);
  if (cuda::built()) def.kernels[static_cast<int>(Device::CUDA)] = def.kernels[static_cast<int>(Device::CPU)];
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
      view_kernel);
}

void check_same_dtype(std::string_view op, std::span<const TensorMeta> in) {
  if (in.empty()) throw ValueError(fmt::format("[{}] needs at least one tensor", op));
  for (std::size_t i = 1; i < in.size(); ++i)
    if (in[i].dtype != in[0].dtype)
      throw DTypeError(fmt::format("[{}] input {} is {} but input 0 is {}", op, i, in[i].dtype, in[0].dtype));
}

}  // namespace

void register_shape_ops(OpRegistry& reg) {
  // -- Pure reshapes: output dims from input dims by the reshape groups.
  auto reshape_shape = [](std::string_view op) {
    return [op](std::span<const TensorMeta> in, const OpAttrs& attrs) { return infer_shape(op, attrs.dims, in[0].shape); };
  };
  add_reshape_op(reg, "reshape", "reshape to attrs.dims (one -1 inferred)", reshape_shape("reshape"));
  add_reshape_op(reg, "view", "view as attrs.dims (one -1 inferred); same as reshape", reshape_shape("view"));
  add_reshape_op(reg, "flatten", "merge dims attrs.dims[0]..attrs.dims[1] (inclusive) into one",
                 [](std::span<const TensorMeta> in, const OpAttrs& attrs) {
                   const Shape& s = in[0].shape;
                   const std::int64_t nd = std::max<std::int64_t>(1, ndim_of(in[0]));
                   if (attrs.dims.size() != 2)
                     throw ValueError(fmt::format("[flatten] expects start and end dims in attrs.dims, got {}", attrs.dims.size()));
                   if (s.empty()) return Shape{1};
                   int a = wrap_dim("flatten", attrs.dims[0], nd), b = wrap_dim("flatten", attrs.dims[1], nd);
                   if (a > b) throw ShapeError(fmt::format("[flatten] start dim {} after end dim {}", attrs.dims[0], attrs.dims[1]));
                   Shape out(s.begin(), s.begin() + a);
                   out.push_back(std::accumulate(s.begin() + a, s.begin() + b + 1, std::int64_t{1}, std::multiplies<>()));
                   out.insert(out.end(), s.begin() + b + 1, s.end());
                   return out;
                 });
  add_reshape_op(reg, "unflatten", "split dim attrs.dims[0] into sizes attrs.ints (one -1 inferred)",
                 [](std::span<const TensorMeta> in, const OpAttrs& attrs) {
                   const Shape& s = in[0].shape;
                   int d = wrap_dim("unflatten", one_attr("unflatten", attrs.dims, "dim"), ndim_of(in[0]));
                   if (attrs.ints.empty()) throw ValueError("[unflatten] expects the sizes in attrs.ints, got none");
                   Shape sizes = infer_shape("unflatten", attrs.ints, Shape{s[d]});
                   Shape out(s.begin(), s.begin() + d);
                   out.insert(out.end(), sizes.begin(), sizes.end());
                   out.insert(out.end(), s.begin() + d + 1, s.end());
                   return out;
                 });
  add_reshape_op(reg, "squeeze", "drop size-1 dims attrs.dims (all size-1 dims if empty)",
                 [](std::span<const TensorMeta> in, const OpAttrs& attrs) {
                   const Shape& s = in[0].shape;
                   std::vector<bool> drop(s.size(), false);
                   if (attrs.dims.empty()) {
                     for (std::size_t d = 0; d < s.size(); ++d) drop[d] = s[d] == 1;
                   } else {
                     for (auto d : attrs.dims) {
                       int w = wrap_dim("squeeze", d, ndim_of(in[0]));
                       drop[w] = s[w] == 1;  // PyTorch: a dim that is not 1 stays
                     }
                   }
                   Shape out;
                   for (std::size_t d = 0; d < s.size(); ++d)
                     if (!drop[d]) out.push_back(s[d]);
                   return out;
                 });
  add_reshape_op(reg, "unsqueeze", "insert a size-1 dim at attrs.dims[0]",
                 [](std::span<const TensorMeta> in, const OpAttrs& attrs) {
                   Shape out = in[0].shape;
                   int d = wrap_dim("unsqueeze", one_attr("unsqueeze", attrs.dims, "dim"), ndim_of(in[0]) + 1);
                   out.insert(out.begin() + d, 1);
                   return out;
                 });

  // -- Permutations: a shard follows its dim.
  auto permute_kernel = [](std::function<std::vector<int>(const OpAttrs&, std::int64_t)> perm_fn) {
    return [perm_fn](const KernelArgs& a) { return permute_local(a.inputs[0], perm_fn(a.attrs, a.inputs[0].dim())); };
  };
  auto permute_meta = [](std::function<std::vector<int>(const OpAttrs&, std::int64_t)> perm_fn) {
    return [perm_fn](std::span<const TensorMeta> in, const OpAttrs& attrs) {
      Shape out;
      for (int p : perm_fn(attrs, ndim_of(in[0]))) out.push_back(in[0].shape[p]);
      return TensorMeta{out, in[0].dtype};
    };
  };
  auto permute_rule_of = [](std::function<std::vector<int>(const OpAttrs&, std::int64_t)> perm_fn) {
    return [perm_fn](std::span<const TensorMeta> in, const OpAttrs& attrs, const TensorMeta&) {
      return permute_rule(perm_fn(attrs, ndim_of(in[0])));
    };
  };
  std::function<std::vector<int>(const OpAttrs&, std::int64_t)> perm_attr = [](const OpAttrs& attrs, std::int64_t nd) {
    return perm_of("permute", attrs.dims, nd);
  };
  std::function<std::vector<int>(const OpAttrs&, std::int64_t)> transpose_attr = transpose_perm;
  add_op(reg, "permute", 1, "reorder dims: output dim i is input dim attrs.dims[i]", permute_meta(perm_attr),
         permute_rule_of(perm_attr), permute_kernel(perm_attr));
  add_op(reg, "transpose", 1, "swap dims attrs.dims[0] and attrs.dims[1]", permute_meta(transpose_attr),
         permute_rule_of(transpose_attr), permute_kernel(transpose_attr));

  // -- expand: size-1 dims broadcast to attrs.dims (-1 keeps a size); new
  // leading dims may be added. Broadcast dims must be whole.
  add_op(
      reg, "expand", 1, "broadcast size-1 dims to the shape attrs.dims (-1 keeps a size)",
      [](std::span<const TensorMeta> in, const OpAttrs& attrs) {
        const Shape& s = in[0].shape;
        const Shape& t = attrs.dims;
        if (t.size() < s.size())
          throw ShapeError(fmt::format("[expand] shape [{}] has fewer dims than the input {}", fmt::join(t, ", "),
                                       fmt::join(s, "x")));
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
      },
      [](std::span<const TensorMeta> in, const OpAttrs&, const TensorMeta& out) {
        ViewRule r;
        const int lead = static_cast<int>(out.shape.size() - in[0].shape.size());
        for (int o = 0; o < static_cast<int>(out.shape.size()); ++o) {
          if (o < lead)
            r.groups.push_back(Group{{}, {o}, false});
          else
            r.groups.push_back(Group{{o - lead}, {o}, in[0].shape[o - lead] == out.shape[o]});
        }
        return r;
      },
      [](const KernelArgs& a) {
        const Tensor& x = a.inputs[0];
        const int lead = static_cast<int>(a.output_box.size.size()) - x.dim();
        const Shape xs = row_major_strides(x.shape());
        Shape strides(a.output_box.size.size(), 0);
        for (int d = 0; d < x.dim(); ++d)
          strides[lead + d] = x.shape()[d] == a.output_box.size[lead + d] ? xs[d] : 0;
        Tensor out = Tensor::empty(a.output_box.size, x.dtype(), x.device());
        gather_strided(x, out, strides);
        return out;
      });

  // -- narrow: the narrowed dim must be whole; others keep their shards.
  add_op(
      reg, "narrow", 1, "elements attrs.ints[0] .. attrs.ints[0]+attrs.ints[1] of dim attrs.dims[0]",
      [](std::span<const TensorMeta> in, const OpAttrs& attrs) {
        Shape out = in[0].shape;
        int d = wrap_dim("narrow", one_attr("narrow", attrs.dims, "dim"), ndim_of(in[0]));
        if (attrs.ints.size() != 2)
          throw ValueError(fmt::format("[narrow] expects start and length in attrs.ints, got {} values", attrs.ints.size()));
        std::int64_t start = attrs.ints[0], len = attrs.ints[1];
        if (start < 0) start += out[d];
        if (start < 0 || len < 0 || start + len > out[d])
          throw ShapeError(fmt::format("[narrow] start {} length {} outside dim {} of size {}", attrs.ints[0], len,
                                       attrs.dims[0], out[d]));
        out[d] = len;
        return TensorMeta{out, in[0].dtype};
      },
      [](std::span<const TensorMeta> in, const OpAttrs& attrs, const TensorMeta&) {
        return identity_rule(static_cast<int>(ndim_of(in[0])), wrap_dim("narrow", attrs.dims[0], ndim_of(in[0])));
      },
      [](const KernelArgs& a) {
        const Tensor& x = a.inputs[0];
        const int d = wrap_dim("narrow", a.attrs.dims[0], x.dim());
        std::int64_t start = a.attrs.ints[0];
        if (start < 0) start += x.shape()[d];
        Box box{Shape(x.dim(), 0), x.shape()};
        box.offset[d] = start;
        box.size[d] = a.attrs.ints[1];
        return slice_box(x, box);
      });

  // -- cat and stack: the joined dim must be whole on every input; other
  // dims carry the same shard on every input.
  add_op(
      reg, "cat", -1, "concatenate the inputs along attrs.dims[0]",
      [](std::span<const TensorMeta> in, const OpAttrs& attrs) {
        check_same_dtype("cat", in);
        const std::int64_t nd = ndim_of(in[0]);
        if (nd == 0) throw ShapeError("[cat] cannot concatenate 0-d tensors");
        int d = wrap_dim("cat", one_attr("cat", attrs.dims, "dim"), nd);
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
      },
      [](std::span<const TensorMeta> in, const OpAttrs& attrs, const TensorMeta&) {
        return identity_rule(static_cast<int>(ndim_of(in[0])), wrap_dim("cat", attrs.dims[0], ndim_of(in[0])));
      },
      [](const KernelArgs& a) {
        return concat_local("cat", a.inputs, wrap_dim("cat", a.attrs.dims[0], a.inputs[0].dim()), a.output_box.size);
      });
  add_op(
      reg, "stack", -1, "stack the inputs along a new dim attrs.dims[0]",
      [](std::span<const TensorMeta> in, const OpAttrs& attrs) {
        check_same_dtype("stack", in);
        for (std::size_t i = 1; i < in.size(); ++i)
          if (in[i].shape != in[0].shape)
            throw ShapeError(fmt::format("[stack] input {} has shape {} but input 0 has {}", i,
                                         fmt::join(in[i].shape, "x"), fmt::join(in[0].shape, "x")));
        int d = wrap_dim("stack", one_attr("stack", attrs.dims, "dim"), ndim_of(in[0]) + 1);
        Shape out = in[0].shape;
        out.insert(out.begin() + d, static_cast<std::int64_t>(in.size()));
        return TensorMeta{out, in[0].dtype};
      },
      [](std::span<const TensorMeta> in, const OpAttrs& attrs, const TensorMeta&) {
        const int nd = static_cast<int>(ndim_of(in[0]));
        const int d = wrap_dim("stack", attrs.dims[0], nd + 1);
        ViewRule r;
        for (int o = 0; o <= nd; ++o)
          r.groups.push_back(o == d ? Group{{}, {o}, false} : Group{{o < d ? o : o - 1}, {o}, true});
        return r;
      },
      [](const KernelArgs& a) {
        const int d = wrap_dim("stack", a.attrs.dims[0], a.inputs[0].dim() + 1);
        std::vector<Tensor> xs;
        for (const Tensor& x : a.inputs) {
          Shape s = x.shape();
          s.insert(s.begin() + d, 1);
          xs.push_back(x.view(s));
        }
        return concat_local("stack", xs, d, a.output_box.size);
      });

  // -- to: elementwise conversion; Partial passes only between floating
  // dtypes (a sum of parts rounded to integers is not the rounded sum).
  add_op(
      reg, "to", 1, "convert to attrs.dtype",
      [](std::span<const TensorMeta> in, const OpAttrs& attrs) { return TensorMeta{in[0].shape, attrs.dtype}; },
      [](std::span<const TensorMeta> in, const OpAttrs& attrs, const TensorMeta&) {
        ViewRule r = identity_rule(static_cast<int>(ndim_of(in[0])));
        r.linear = is_floating(in[0].dtype) && is_floating(attrs.dtype);
        return r;
      },
      [](const KernelArgs& a) {
        const Tensor& x = a.inputs[0];
        Tensor out = Tensor::empty(x.shape(), a.attrs.dtype, x.device());
        if (x.device() == Device::CUDA) {
          cuda::cast(x.data(), x.dtype(), out.data(), out.dtype(), x.numel());
          return out;
        }
        visit_dtype(x.dtype(), [&](auto zx) {
          using X = decltype(zx);
          visit_dtype(out.dtype(), [&](auto zy) {
            using Y = decltype(zy);
            const X* p = x.data_as<X>();
            Y* q = out.data_as<Y>();
            for (std::int64_t i = 0; i < x.numel(); ++i) q[i] = static_cast<Y>(p[i]);
          });
        });
        return out;
      });
}

}  // namespace dtensor
