// The backward family, part one: the derivative ops of the activations,
// softmax and the normalizations. Each is an ordinary registered op (meta,
// per-mesh-dim strategy, a kernel per device), so that a backward pass is
// dispatched, planned and explained like any forward op. Every one is
// linear in its incoming gradient, so a Partial(sum) gradient with the other
// inputs Replicate passes through as Partial(sum) without communication.
#include "backward_families.h"
#include "backward_kernels.h"
#include "dtensor/core/error.h"

namespace dtensor {
namespace backward {

void check_floating(std::string_view op, std::string_view what, DType dtype) {
  if (!is_floating(dtype))
    throw DTypeError(fmt::format("[{}] {} is {}; expected f32, f64, bf16 or f16", op, what, dtype));
}

void check_like(std::string_view op, std::string_view what, const TensorMeta& t, std::string_view ref_name,
                const TensorMeta& ref) {
  if (t.shape != ref.shape)
    throw ShapeError(fmt::format("[{}] {} of shape {}; expected {}'s shape {}", op, what, fmt::join(t.shape, "x"),
                                 ref_name, fmt::join(ref.shape, "x")));
  if (t.dtype != ref.dtype)
    throw DTypeError(fmt::format("[{}] {} is {}; expected {}'s dtype {}", op, what, t.dtype, ref_name, ref.dtype));
}

DimStrategy partial_gradient(std::size_t num_inputs, std::size_t grad_input) {
  std::vector<Placement> ins(num_inputs, Replicate{});
  ins[grad_input] = Partial{ReduceOp::Sum};
  return {std::move(ins), Partial{ReduceOp::Sum}};
}

}  // namespace backward

namespace {

using backward::check_floating;
using backward::check_like;
using backward::partial_gradient;

// (x or y, grad) of one shape: the same dims sharded together, grad Partial.
std::vector<DimStrategy> elementwise_pair(const StrategyQuery& q, std::int64_t unsharded_dim) {
  std::vector<DimStrategy> per_dim{{{Replicate{}, Replicate{}}, Replicate{}}};
  for (std::int64_t d = 0; d < static_cast<std::int64_t>(q.inputs[0].shape.size()); ++d)
    if (d != unsharded_dim) per_dim.push_back({{Shard{d}, Shard{d}}, Shard{d}});
  per_dim.push_back(partial_gradient(2, 1));
  return per_dim;
}

TensorMeta pair_meta(std::string_view op, std::string_view first, std::span<const TensorMeta> in) {
  check_floating(op, first, in[0].dtype);
  check_like(op, "grad", in[1], first, in[0]);
  return in[0];
}

void add_activation_backward(OpRegistry& registry, std::string name, device::Activation fn, std::string doc) {
  OpDef def;
  def.name = name;
  def.num_inputs = 2;
  def.doc = std::move(doc);
  def.meta = [name](std::span<const TensorMeta> in, const OpAttrs&) { return pair_meta(name, "x", in); };
  def.dim_strategy = [](const StrategyQuery& q) { return elementwise_pair(q, -1); };
  def.prefer_kept_layouts = true;
  device::bind_kernels<device::BackwardKernels>(def, [fn](const device::BackwardKernels& k) {
    return [&k, fn](const KernelArgs& a) { return k.activation_backward(fn, a.inputs[0], a.inputs[1]); };
  });
  registry.add(std::move(def));
}

// The op's DimAttrs dim, counted from 0 (the one rule: core's wrap_dim).
std::int64_t dim_of(std::string_view op, const Shape& shape, const OpAttrs& attrs) {
  return wrap_dim(op, attrs.get<DimAttrs>(op).dim, static_cast<std::int64_t>(shape.size()));
}

void add_softmax_backward(OpRegistry& registry, std::string name, bool log, std::string doc) {
  OpDef def;
  def.name = name;
  def.num_inputs = 2;
  def.doc = std::move(doc);
  def.meta = [name](std::span<const TensorMeta> in, const OpAttrs& a) {
    const TensorMeta out = pair_meta(name, "y", in);
    dim_of(name, in[0].shape, a);
    return out;
  };
  // The softmax dim must be whole on every rank (its sum is local); the
  // other dims keep their shards.
  def.dim_strategy = [name](const StrategyQuery& q) {
    return elementwise_pair(q, dim_of(name, q.inputs[0].shape, q.attrs));
  };
  def.prefer_kept_layouts = true;
  device::bind_kernels<device::BackwardKernels>(def, [name, log](const device::BackwardKernels& k) {
    return [&k, name, log](const KernelArgs& a) {
      return k.softmax_backward(a.inputs[0], a.inputs[1], static_cast<int>(dim_of(name, a.inputs[0].shape(), a.attrs)),
                                log);
    };
  });
  registry.add(std::move(def));
}

// ---- layer_norm, rms_norm: (x, grad[, weight]) -> dx; (x, grad) -> dweight --

void check_norm_inputs(std::string_view op, std::span<const TensorMeta> in, const NormAttrs& n, bool with_weight) {
  const std::size_t expected = with_weight && n.weight ? 3 : 2;
  if (in.size() != expected)
    throw ValueError(fmt::format("[{}] got {} tensor inputs; expected {} (x, grad{})", op, in.size(), expected,
                                 expected == 3 ? ", weight as NormAttrs::weight says" : ""));
  pair_meta(op, "x", in);
  const auto nd = static_cast<std::int64_t>(in[0].shape.size());
  if (n.normalized_ndim < 1 || n.normalized_ndim > nd)
    throw ShapeError(
        fmt::format("[{}] normalized_ndim {} for a tensor of {} dims; expected 1..{}", op, n.normalized_ndim, nd, nd));
  if (expected == 3) {
    const TensorMeta trailing{Shape(in[0].shape.end() - n.normalized_ndim, in[0].shape.end()), in[0].dtype};
    check_like(op, "weight", in[2], "the normalized shape", trailing);
  }
}

// Leading dims of x and grad sharded together; the normalized dims whole
// (their statistics are per row). dx keeps the shards; dweight sums over
// the leading dims, so their shards give Partial(sum).
std::vector<DimStrategy> norm_strategy(const StrategyQuery& q, std::int64_t normalized_ndim, bool weight_grad) {
  const std::size_t nin = q.inputs.size();
  auto ins = [&](Placement p) {
    std::vector<Placement> v(nin, Replicate{});
    v[0] = v[1] = p;
    return v;
  };
  std::vector<DimStrategy> per_dim{{ins(Replicate{}), Replicate{}}};
  const auto lead = static_cast<std::int64_t>(q.inputs[0].shape.size()) - normalized_ndim;
  for (std::int64_t d = 0; d < lead; ++d)
    per_dim.push_back({ins(Shard{d}), weight_grad ? Placement{Partial{ReduceOp::Sum}} : Placement{Shard{d}}});
  per_dim.push_back(partial_gradient(nin, 1));
  return per_dim;
}

void add_norm_backward(OpRegistry& registry, std::string name, bool rms, bool weight_grad, std::string doc) {
  OpDef def;
  def.name = name;
  def.num_inputs = -1;
  def.doc = std::move(doc);
  def.meta = [name, weight_grad](std::span<const TensorMeta> in, const OpAttrs& a) {
    const NormAttrs& n = a.get<NormAttrs>(name);
    if (in.size() < 2) throw ValueError(fmt::format("[{}] got {} tensor inputs; expected x and grad", name, in.size()));
    check_norm_inputs(name, in, n, !weight_grad);
    if (!weight_grad) return in[0];
    return TensorMeta{Shape(in[0].shape.end() - n.normalized_ndim, in[0].shape.end()), in[0].dtype};
  };
  def.dim_strategy = [name, weight_grad](const StrategyQuery& q) {
    return norm_strategy(q, q.attrs.get<NormAttrs>(name).normalized_ndim, weight_grad);
  };
  device::bind_kernels<device::BackwardKernels>(def, [name, rms, weight_grad](const device::BackwardKernels& k) {
    return [&k, name, rms, weight_grad](const KernelArgs& a) {
      const NormAttrs& n = a.attrs.get<NormAttrs>(name);
      const int nnd = static_cast<int>(n.normalized_ndim);
      if (weight_grad) return k.norm_weight_backward(a.inputs[0], a.inputs[1], nnd, n.eps, rms);
      const Tensor weight = a.inputs.size() == 3 ? a.inputs[2] : Tensor();
      return k.norm_backward(a.inputs[0], a.inputs[1], weight, nnd, n.eps, rms);
    };
  });
  registry.add(std::move(def));
}

}  // namespace

void register_backward_ops(OpRegistry& registry) {
  using device::Activation;
  add_activation_backward(registry, "gelu_backward", Activation::Gelu,
                          "gelu_backward(x, grad): grad * gelu'(x), the exact erf form of gelu");
  add_activation_backward(registry, "silu_backward", Activation::Silu,
                          "silu_backward(x, grad): grad * silu'(x) = grad * s * (1 + x * (1 - s)), s = sigmoid(x)");
  add_softmax_backward(registry, "softmax_backward", false,
                       "softmax_backward(y, grad): y * (grad - sum(grad * y)) along DimAttrs::dim, y = softmax(x)");
  add_softmax_backward(registry, "log_softmax_backward", true,
                       "log_softmax_backward(y, grad): grad - exp(y) * sum(grad) along DimAttrs::dim, y = "
                       "log_softmax(x)");
  add_norm_backward(registry, "layer_norm_backward", false, false,
                    "layer_norm_backward(x, grad[, weight]): layer_norm's input gradient (NormAttrs as the forward's; "
                    "the bias gradient is sum(grad) over the leading dims)");
  add_norm_backward(registry, "rms_norm_backward", true, false,
                    "rms_norm_backward(x, grad[, weight]): rms_norm's input gradient (NormAttrs as the forward's)");
  add_norm_backward(registry, "layer_norm_weight_backward", false, true,
                    "layer_norm_weight_backward(x, grad): sum over the leading dims of grad * (x - mean) / sqrt(var + "
                    "eps), the weight's gradient");
  add_norm_backward(registry, "rms_norm_weight_backward", true, true,
                    "rms_norm_weight_backward(x, grad): sum over the leading dims of grad * x / sqrt(mean(x^2) + eps), "
                    "the weight's gradient");
  register_backward_index_ops(registry);
}

}  // namespace dtensor
