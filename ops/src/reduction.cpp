// The reduction family: sum, mean, max, min, norm, argmax (one reduction
// rule), softmax and log_softmax, layer_norm and rms_norm. Each strategy is
// given per mesh dim; the registry's expansion (expand_to_mesh) also offers
// an input's own shard nesting, so that e.g. S(0)[1],S(0)[0] is reduced
// where it lies.
#include <algorithm>
#include <functional>
#include <memory>
#include <optional>

#include "cpu/reduction_kernels.h"
#include "device_kernels.h"
#include "dtensor/core/error.h"
#include "families.h"

namespace dtensor {
namespace {

// How one reduction op shards: what a sharded reduced dim becomes (nothing:
// the dim must be unsharded) and which Partial inputs pass through.
struct ReductionRule {
  std::string name{};
  std::optional<ReduceOp> sharded_reduced{};  // S(reduced dim) -> P(op)
  std::optional<ReduceOp> partial_through{};  // P(op) -> P(op)
  bool integer_ok = true;
  bool single_dim = false;  // argmax: at most one dim, empty = flattened
  bool nonempty = false;    // max/min/argmax of an empty extent is an error
};

// Reduced-dim flags of a call, from attrs.dims (empty: all dims). Throws
// ShapeError naming the op for a dim out of range or given twice.
std::vector<bool> reduced_flags(const ReductionRule& rule, const Shape& shape, const ReduceAttrs& attrs) {
  const auto nd = static_cast<std::int64_t>(shape.size());
  std::vector<bool> flags(static_cast<std::size_t>(nd), attrs.dims.empty());
  if (rule.single_dim && attrs.dims.size() > 1)
    throw ValueError(fmt::format("[{}] reduces over one dim, got dims ({})", rule.name, fmt::join(attrs.dims, ", ")));
  for (auto d : attrs.dims) {
    const std::int64_t r = d < 0 ? d + nd : d;
    const bool scalar_ok = nd == 0 && (d == 0 || d == -1);  // as PyTorch: a 0-d tensor takes dim 0 or -1
    if (!scalar_ok && (r < 0 || r >= nd))
      throw ShapeError(fmt::format("[{}] dim {} out of range for a tensor of {} dims", rule.name, d, nd));
    if (nd == 0) continue;
    if (flags[static_cast<std::size_t>(r)])
      throw ShapeError(fmt::format("[{}] dim {} given twice in dims ({})", rule.name, d, fmt::join(attrs.dims, ", ")));
    flags[static_cast<std::size_t>(r)] = true;
  }
  return flags;
}

Shape reduced_shape(const Shape& shape, const std::vector<bool>& flags, bool keepdim) {
  Shape out;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (!flags[d])
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

void check_dtype(std::string_view op, DType dtype, bool integer_ok) {
  if (is_floating(dtype) || (integer_ok && dtype == DType::Int64)) return;
  throw DTypeError(fmt::format("[{}] got a {} input; expected {}", op, dtype,
                               integer_ok ? "f32, f64, bf16, f16 or i64" : "f32, f64, bf16 or f16"));
}

TensorMeta reduction_meta(const ReductionRule& rule, std::span<const TensorMeta> in, const OpAttrs& op_attrs) {
  const auto& attrs = op_attrs.get<ReduceAttrs>(rule.name);
  check_dtype(rule.name, in[0].dtype, rule.integer_ok);
  const auto flags = reduced_flags(rule, in[0].shape, attrs);
  if (rule.nonempty)
    for (std::size_t d = 0; d < flags.size(); ++d)
      if ((flags[d] || (rule.single_dim && attrs.dims.empty())) && in[0].shape[d] == 0)
        throw ShapeError(fmt::format("[{}] reduces over dim {} of size 0 (shape {}): it has no identity", rule.name, d,
                                     fmt::join(in[0].shape, "x")));
  TensorMeta out{reduced_shape(in[0].shape, flags, attrs.keepdim), in[0].dtype};
  if (rule.single_dim) {
    out.dtype = DType::Int64;
    if (attrs.dims.empty() && !attrs.keepdim) out.shape = {};
  }
  return out;
}

// The reduction rule, per mesh dim: R -> R; S(d) of a kept dim -> S(d's index
// in the output); S(d) of a reduced dim -> P(op) where the op allows it;
// P(op) -> P(op) for the ops it commutes with.
std::vector<DimStrategy> reduction_strategy(const ReductionRule& rule, const StrategyQuery& q) {
  const Shape& shape = q.inputs[0].shape;
  const auto& attrs = q.attrs.get<ReduceAttrs>(rule.name);
  const auto flags = reduced_flags(rule, shape, attrs);
  std::vector<DimStrategy> per_dim{{{Replicate{}}, Replicate{}}};
  std::int64_t out_dim = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const auto dim = static_cast<std::int64_t>(d);
    if (!flags[d]) {
      per_dim.push_back({{Shard{dim}}, Shard{out_dim++}});
    } else {
      if (rule.sharded_reduced) per_dim.push_back({{Shard{dim}}, Partial{*rule.sharded_reduced}});
      if (attrs.keepdim) ++out_dim;
    }
  }
  if (rule.partial_through) per_dim.push_back({{Partial{*rule.partial_through}}, Partial{*rule.partial_through}});
  return per_dim;
}

using KernelMaker = std::function<Kernel(const device::Kernels&)>;

void add_reduction(OpRegistry& registry, ReductionRule rule, std::string doc, const KernelMaker& kernel) {
  OpDef def;
  def.name = rule.name;
  def.num_inputs = 1;
  def.doc = std::move(doc);
  def.meta = [rule](std::span<const TensorMeta> in, const OpAttrs& a) { return reduction_meta(rule, in, a); };
  def.dim_strategy = [rule](const StrategyQuery& q) { return reduction_strategy(rule, q); };
  device::bind_kernels(def, kernel);
  registry.add(std::move(def));
}

// Flags of the reduced dims as the kernel needs them (a plain array).
std::vector<char> kernel_flags(const KernelArgs& a, const ReduceAttrs& attrs) {
  const auto nd = a.inputs[0].dim();
  std::vector<char> flags(static_cast<std::size_t>(nd), attrs.dims.empty());
  for (auto d : attrs.dims)
    if (nd > 0) flags[static_cast<std::size_t>(d < 0 ? d + nd : d)] = true;
  return flags;
}

KernelMaker reduce_kernel(std::string name, cpu::ReduceKind kind, bool mean) {
  return [name, kind, mean](const device::Kernels& k) -> Kernel {
    return [&k, name, kind, mean](const KernelArgs& a) {
      const auto& attrs = a.attrs.get<ReduceAttrs>(name);
      const auto f = kernel_flags(a, attrs);
      const std::unique_ptr<bool[]> flags(new bool[f.size() + 1]);
      std::copy(f.begin(), f.end(), flags.get());
      const std::span<const bool> reduced(flags.get(), f.size());
      // The GLOBAL count of the reduced elements: right for uneven and empty
      // shards, whose partial sums add up to the total (PyTorch #162692).
      // The device scales by it before the store: a bf16/f16 sum stored
      // first and scaled after would round twice.
      std::int64_t count = 1;
      for (std::size_t d = 0; d < f.size(); ++d)
        if (f[d]) count *= a.global[0].shape[d];
      return k.reduce_dims(a.inputs[0], reduced, a.output_box.size, kind, attrs.p, mean ? count : -1);
    };
  };
}

// ---- softmax, log_softmax --------------------------------------------------

// The op's DimAttrs dim, counted from 0 (the one rule: core's wrap_dim).
std::int64_t softmax_dim(std::string_view op, const Shape& shape, const OpAttrs& attrs) {
  return wrap_dim(op, attrs.get<DimAttrs>(op).dim, static_cast<std::int64_t>(shape.size()));
}

void add_softmax(OpRegistry& registry, std::string name, bool log) {
  OpDef def;
  def.name = name;
  def.num_inputs = 1;
  def.doc = log ? "log(softmax(x)) along DimAttrs::dim" : "exp(x) / sum(exp(x)) along DimAttrs::dim";
  def.meta = [name](std::span<const TensorMeta> in, const OpAttrs& a) {
    check_dtype(name, in[0].dtype, false);
    softmax_dim(name, in[0].shape, a);
    return in[0];
  };
  // The softmax dim must be unsharded; other dims keep their shards; not
  // linear, so no Partial input.
  def.dim_strategy = [name](const StrategyQuery& q) {
    const std::int64_t sd = softmax_dim(name, q.inputs[0].shape, q.attrs);
    std::vector<DimStrategy> per_dim{{{Replicate{}}, Replicate{}}};
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(q.inputs[0].shape.size()); ++d)
      if (d != sd) per_dim.push_back({{Shard{d}}, Shard{d}});
    return per_dim;
  };
  device::bind_kernels(def, [name, log](const device::Kernels& k) {
    return [&k, name, log](const KernelArgs& a) {
      return k.softmax(a.inputs[0], static_cast<int>(softmax_dim(name, a.inputs[0].shape(), a.attrs)), log);
    };
  });
  registry.add(std::move(def));
}

// ---- layer_norm, rms_norm ---------------------------------------------------
// The inputs are x, then the weight and the bias that NormAttrs says are
// present.

void check_norm(std::string_view op, std::span<const TensorMeta> in, const NormAttrs& n, bool rms) {
  if (rms && n.bias) throw ValueError(fmt::format("[{}] takes no bias", op));
  const auto nd = static_cast<std::int64_t>(in[0].shape.size());
  if (n.normalized_ndim < 1 || n.normalized_ndim > nd)
    throw ShapeError(
        fmt::format("[{}] normalized_ndim {} for a tensor of {} dims; expected 1..{}", op, n.normalized_ndim, nd, nd));
  const std::size_t expected = 1 + n.weight + n.bias;
  if (in.size() != expected)
    throw ValueError(fmt::format("[{}] got {} tensor inputs; NormAttrs (weight {}, bias {}) ask for {}", op, in.size(),
                                 n.weight, n.bias, expected));
  const Shape trailing(in[0].shape.end() - n.normalized_ndim, in[0].shape.end());
  for (std::size_t i = 1; i < in.size(); ++i) {
    if (in[i].shape != trailing)
      throw ShapeError(fmt::format("[{}] {} of shape {}; expected the normalized shape {}", op,
                                   i == 1 && n.weight ? "weight" : "bias", fmt::join(in[i].shape, "x"),
                                   fmt::join(trailing, "x")));
    if (in[i].dtype != in[0].dtype)
      throw DTypeError(fmt::format("[{}] {} is {}; expected the input's dtype {}", op,
                                   i == 1 && n.weight ? "weight" : "bias", in[i].dtype, in[0].dtype));
  }
}

void add_normalization(OpRegistry& registry, std::string name, bool rms) {
  OpDef def;
  def.name = name;
  def.num_inputs = -1;
  def.doc = rms ? "x / sqrt(mean(x^2) + eps) [* weight] over the trailing NormAttrs::normalized_ndim dims"
                : "(x - mean) / sqrt(var + eps) [* weight + bias] over the trailing NormAttrs::normalized_ndim dims";
  def.meta = [name, rms](std::span<const TensorMeta> in, const OpAttrs& a) {
    if (in.empty()) throw ValueError(fmt::format("[{}] needs an input tensor", name));
    check_dtype(name, in[0].dtype, false);
    check_norm(name, in, a.get<NormAttrs>(name), rms);
    return in[0];
  };
  // Normalized dims unsharded, leading dims keep their shards, weight and
  // bias replicated; not linear, so no Partial input.
  def.dim_strategy = [name](const StrategyQuery& q) {
    const NormAttrs& n = q.attrs.get<NormAttrs>(name);
    const std::size_t nin = q.inputs.size();
    auto with_params = [&](Placement x) {
      std::vector<Placement> ins(nin, Replicate{});
      ins[0] = x;
      return ins;
    };
    std::vector<DimStrategy> per_dim{{with_params(Replicate{}), Replicate{}}};
    const auto lead = static_cast<std::int64_t>(q.inputs[0].shape.size()) - n.normalized_ndim;
    for (std::int64_t d = 0; d < lead; ++d) per_dim.push_back({with_params(Shard{d}), Shard{d}});
    return per_dim;
  };
  device::bind_kernels(def, [name, rms](const device::Kernels& k) {
    return [&k, name, rms](const KernelArgs& a) {
      const NormAttrs& n = a.attrs.get<NormAttrs>(name);
      Tensor weight = n.weight ? a.inputs[1] : Tensor();
      Tensor bias = n.bias ? a.inputs[n.weight ? 2 : 1] : Tensor();
      return k.normalize(a.inputs[0], static_cast<int>(n.normalized_ndim), weight, bias, n.eps, rms);
    };
  });
  registry.add(std::move(def));
}

}  // namespace

void register_reduction_ops(OpRegistry& registry) {
  using K = cpu::ReduceKind;
  add_reduction(registry, {.name = "sum", .sharded_reduced = ReduceOp::Sum, .partial_through = ReduceOp::Sum},
                "sum over ReduceAttrs::dims (empty: all)", reduce_kernel("sum", K::Sum, false));
  add_reduction(registry,
                {.name = "mean",
                 .sharded_reduced = ReduceOp::Sum,
                 .partial_through = ReduceOp::Sum,
                 .integer_ok = false},
                "mean over ReduceAttrs::dims (empty: all); a sharded reduced dim gives P(sum) of local sums over the "
                "global count",
                reduce_kernel("mean", K::Sum, true));
  add_reduction(registry,
                {.name = "max", .sharded_reduced = ReduceOp::Max, .partial_through = ReduceOp::Max, .nonempty = true},
                "max over ReduceAttrs::dims (empty: all)", reduce_kernel("max", K::Max, false));
  add_reduction(registry,
                {.name = "min", .sharded_reduced = ReduceOp::Min, .partial_through = ReduceOp::Min, .nonempty = true},
                "min over ReduceAttrs::dims (empty: all)", reduce_kernel("min", K::Min, false));
  // A p-norm of a sharded dim is not a Partial of norms: the reduced dims
  // must be unsharded (propagation gathers them).
  add_reduction(registry, {.name = "norm", .integer_ok = false},
                "p-norm (ReduceAttrs::p) over ReduceAttrs::dims (empty: all); reduced dims are gathered",
                reduce_kernel("norm", K::Norm, false));
  add_reduction(registry, {.name = "argmax", .single_dim = true, .nonempty = true},
                "index (i64) of the first max along ReduceAttrs::dims[0] (empty: flattened)",
                [](const device::Kernels& k) -> Kernel {
                  return [&k](const KernelArgs& a) {
                    const auto& attrs = a.attrs.get<ReduceAttrs>("argmax");
                    const auto nd = a.inputs[0].dim();
                    int dim = -1;
                    if (!attrs.dims.empty() && nd > 0)
                      dim = static_cast<int>(attrs.dims[0] < 0 ? attrs.dims[0] + nd : attrs.dims[0]);
                    return k.argmax(a.inputs[0], dim, a.output_box.size);
                  };
                });
  add_softmax(registry, "softmax", false);
  add_softmax(registry, "log_softmax", true);
  add_normalization(registry, "layer_norm", false);
  add_normalization(registry, "rms_norm", true);
}

}  // namespace dtensor
