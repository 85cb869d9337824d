// The reduction family: sum, mean, max, min, norm, argmax (one reduction
// rule), softmax and log_softmax, layer_norm and rms_norm.
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "../cpu/reduction_kernels.h"
#include "../cuda/pointwise_reduction.h"
#include "dtensor/core/cuda.h"
#include "dtensor/core/error.h"
#include "families.h"

namespace dtensor {
namespace {

constexpr int kCpu = static_cast<int>(Device::CPU);
constexpr int kCuda = static_cast<int>(Device::CUDA);

// Each kernel below serves both devices, picking the implementation by
// where its first input lives; it is registered for CUDA only in a CUDA
// build (elsewhere dispatch reports that there is no cuda kernel).
void set_kernels(OpDef& def, Kernel kernel) {
  if (cuda::built()) def.kernels[kCuda] = kernel;
  def.kernels[kCpu] = std::move(kernel);
}

bool on_cuda(const KernelArgs& a) { return a.inputs[0].device() == Device::CUDA; }

// expand_to_mesh offers layouts of default shard nesting only. When input 0
// comes with another nesting and each of its placements has an option in
// `per_dim`, this candidate keeps it as it is (no move) and carries the
// nesting to the output's shards. Inputs after the first take the option's.
std::vector<Strategy> with_current_nesting(std::span<const DimStrategy> per_dim, const StrategyQuery& q) {
  std::vector<Strategy> out;
  const Layout& current = q.layouts[0];
  if (current.default_order() || current.mesh_ndim() != static_cast<int>(q.mesh_shape.size())) {
    out = expand_to_mesh(per_dim, q);
    return out;
  }
  const std::size_t nin = q.inputs.size();
  std::vector<std::vector<Placement>> ins(nin);
  std::vector<Placement> outp;
  bool found_all = true;
  for (int m = 0; m < current.mesh_ndim() && found_all; ++m) {
    auto it = std::find_if(per_dim.begin(), per_dim.end(), [&](const DimStrategy& o) { return o.inputs[0] == current[m]; });
    if (it == per_dim.end()) {
      found_all = false;
      break;
    }
    for (std::size_t i = 0; i < nin; ++i) ins[i].push_back(it->inputs[i]);
    outp.push_back(it->output);
  }
  if (found_all) {
    try {
      // Output dim d' is sharded by the mesh dims that shard its input dim,
      // in the same order.
      std::vector<std::pair<std::int64_t, std::vector<int>>> order;
      for (int m = 0; m < current.mesh_ndim(); ++m) {
        if (!is_shard(outp[m]) || current.level(m) != 0) continue;
        const std::vector<int> mesh_dims = current.split_order(std::get<Shard>(current[m]).dim);
        order.emplace_back(std::get<Shard>(outp[m]).dim, mesh_dims);
      }
      Strategy cand;
      cand.inputs.push_back(validate_layout(current, q.mesh_shape, q.inputs[0].shape));
      for (std::size_t i = 1; i < nin; ++i)
        cand.inputs.push_back(validate_layout(Layout(ins[i]), q.mesh_shape, q.inputs[i].shape));
      cand.output = validate_layout(Layout(outp, order), q.mesh_shape, q.output.shape);
      out.push_back(std::move(cand));
    } catch (const LayoutError&) {
    }
  }
  for (auto& c : expand_to_mesh(per_dim, q)) out.push_back(std::move(c));
  return out;
}

// How one reduction op shards: what a sharded reduced dim becomes (nothing:
// the dim must be unsharded) and which Partial inputs pass through.
struct ReductionRule {
  std::string name;
  std::optional<ReduceOp> sharded_reduced;  // S(reduced dim) -> P(op)
  std::optional<ReduceOp> partial_through;  // P(op) -> P(op)
  bool integer_ok = true;
  bool single_dim = false;  // argmax: at most one dim, empty = flattened
  bool nonempty = false;    // max/min/argmax of an empty extent is an error
};

// Reduced-dim flags of a call, from attrs.dims (empty: all dims). Throws
// ShapeError naming the op for a dim out of range or given twice.
std::vector<bool> reduced_flags(const ReductionRule& rule, const Shape& shape, const OpAttrs& attrs) {
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
    if (!flags[d]) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

void check_dtype(std::string_view op, DType dtype, bool integer_ok) {
  if (is_floating(dtype) || (integer_ok && dtype == DType::Int64)) return;
  throw DTypeError(fmt::format("[{}] got a {} input; expected {}", op, dtype,
                               integer_ok ? "f32, f64, bf16, f16 or i64" : "f32, f64, bf16 or f16"));
}

TensorMeta reduction_meta(const ReductionRule& rule, std::span<const TensorMeta> in, const OpAttrs& attrs) {
  check_dtype(rule.name, in[0].dtype, rule.integer_ok);
  const auto flags = reduced_flags(rule, in[0].shape, attrs);
  if (rule.nonempty)
    for (std::size_t d = 0; d < flags.size(); ++d)
      if ((flags[d] || (rule.single_dim && attrs.dims.empty())) && in[0].shape[d] == 0)
        throw ShapeError(fmt::format("[{}] reduces over dim {} of size 0 (shape {}): it has no identity", rule.name, d,
                                     fmt::join(in[0].shape, "x")));
  TensorMeta out{reduced_shape(in[0].shape, flags, attrs.flag), in[0].dtype};
  if (rule.single_dim) {
    out.dtype = DType::Int64;
    if (attrs.dims.empty() && !attrs.flag) out.shape = {};
  }
  return out;
}

// The reduction rule, per mesh dim: R -> R; S(d) of a kept dim -> S(d's index
// in the output); S(d) of a reduced dim -> P(op) where the op allows it;
// P(op) -> P(op) for the ops it commutes with.
std::vector<Strategy> reduction_strategy(const ReductionRule& rule, const StrategyQuery& q) {
  const Shape& shape = q.inputs[0].shape;
  const auto flags = reduced_flags(rule, shape, q.attrs);
  std::vector<DimStrategy> per_dim{{{Replicate{}}, Replicate{}}};
  std::int64_t out_dim = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const auto dim = static_cast<std::int64_t>(d);
    if (!flags[d]) {
      per_dim.push_back({{Shard{dim}}, Shard{out_dim++}});
    } else {
      if (rule.sharded_reduced) per_dim.push_back({{Shard{dim}}, Partial{*rule.sharded_reduced}});
      if (q.attrs.flag) ++out_dim;
    }
  }
  if (rule.partial_through) per_dim.push_back({{Partial{*rule.partial_through}}, Partial{*rule.partial_through}});
  return with_current_nesting(per_dim, q);
}

void add_reduction(OpRegistry& registry, ReductionRule rule, std::string doc, Kernel kernel) {
  OpDef def;
  def.name = rule.name;
  def.num_inputs = 1;
  def.doc = std::move(doc);
  def.meta = [rule](std::span<const TensorMeta> in, const OpAttrs& a) { return reduction_meta(rule, in, a); };
  def.strategy = [rule](const StrategyQuery& q) { return reduction_strategy(rule, q); };
  set_kernels(def, std::move(kernel));
  registry.add(std::move(def));
}

// Flags of the reduced dims as the kernel needs them (a plain array).
std::vector<char> kernel_flags(const KernelArgs& a) {
  const auto nd = a.inputs[0].dim();
  std::vector<char> flags(static_cast<std::size_t>(nd), a.attrs.dims.empty());
  for (auto d : a.attrs.dims)
    if (nd > 0) flags[static_cast<std::size_t>(d < 0 ? d + nd : d)] = true;
  return flags;
}

Kernel reduce_kernel(cpu::ReduceKind kind, bool mean) {
  return [kind, mean](const KernelArgs& a) {
    const auto f = kernel_flags(a);
    const std::unique_ptr<bool[]> flags(new bool[f.size() + 1]);
    std::copy(f.begin(), f.end(), flags.get());
    const std::span<const bool> reduced(flags.get(), f.size());
    // The GLOBAL count of the reduced elements: right for uneven and empty
    // shards, whose partial sums add up to the total (PyTorch #162692).
    std::int64_t count = 1;
    for (std::size_t d = 0; d < f.size(); ++d)
      if (f[d]) count *= a.global[0].shape[d];
    // On CUDA the mean's scaling is fused into the reduction, before the
    // store: a bf16/f16 sum stored first and scaled after would round twice.
    if (on_cuda(a))
      return cuda_kernels::reduce_dims(a.inputs[0], reduced, a.output_box.size, kind, a.attrs.scalar,
                                       mean ? count : -1);
    Tensor out = cpu::reduce_dims(a.inputs[0], reduced, a.output_box.size, kind, a.attrs.scalar);
    if (mean) {
      visit_dtype(out.dtype(), [&](auto zero) {
        using T = decltype(zero);
        T* o = out.data_as<T>();
        const T scale = T(1) / static_cast<T>(count);
        for (std::int64_t i = 0; i < out.numel(); ++i) o[i] = count ? o[i] * scale : o[i] / T(0);
      });
    }
    return out;
  };
}

// ---- softmax, log_softmax --------------------------------------------------

std::int64_t softmax_dim(std::string_view op, const Shape& shape, const OpAttrs& attrs) {
  const auto nd = static_cast<std::int64_t>(shape.size());
  if (attrs.dims.size() != 1)
    throw ValueError(fmt::format("[{}] takes exactly one dim in attrs.dims, got ({})", op, fmt::join(attrs.dims, ", ")));
  const std::int64_t d = attrs.dims[0] < 0 ? attrs.dims[0] + nd : attrs.dims[0];
  if (d < 0 || d >= nd)
    throw ShapeError(fmt::format("[{}] dim {} out of range for a tensor of {} dims", op, attrs.dims[0], nd));
  return d;
}

void add_softmax(OpRegistry& registry, std::string name, bool log) {
  OpDef def;
  def.name = name;
  def.num_inputs = 1;
  def.doc = log ? "log(softmax(x)) along attrs.dims[0]" : "exp(x) / sum(exp(x)) along attrs.dims[0]";
  def.meta = [name](std::span<const TensorMeta> in, const OpAttrs& a) {
    check_dtype(name, in[0].dtype, false);
    softmax_dim(name, in[0].shape, a);
    return in[0];
  };
  // The softmax dim must be unsharded; other dims keep their shards; not
  // linear, so no Partial input.
  def.strategy = [name](const StrategyQuery& q) {
    const std::int64_t sd = softmax_dim(name, q.inputs[0].shape, q.attrs);
    std::vector<DimStrategy> per_dim{{{Replicate{}}, Replicate{}}};
    for (std::int64_t d = 0; d < static_cast<std::int64_t>(q.inputs[0].shape.size()); ++d)
      if (d != sd) per_dim.push_back({{Shard{d}}, Shard{d}});
    return with_current_nesting(per_dim, q);
  };
  set_kernels(def, [name, log](const KernelArgs& a) {
    const int dim = static_cast<int>(softmax_dim(name, a.inputs[0].shape(), a.attrs));
    return on_cuda(a) ? cuda_kernels::softmax(a.inputs[0], dim, log) : cpu::softmax(a.inputs[0], dim, log);
  });
  registry.add(std::move(def));
}

// ---- layer_norm, rms_norm ---------------------------------------------------
// attrs.ints = {normalized_ndim, has_weight, has_bias}; the inputs are x
// then the weight and the bias that are present; eps in attrs.scalar.

struct NormArgs {
  int normalized_ndim = 0;
  bool weight = false, bias = false;
};

NormArgs norm_args(std::string_view op, std::span<const TensorMeta> in, const OpAttrs& attrs, bool rms) {
  if (attrs.ints.empty() || attrs.ints.size() > 3)
    throw ValueError(fmt::format("[{}] attrs.ints must be {{normalized_ndim, has_weight, has_bias}}, got ({})", op,
                                 fmt::join(attrs.ints, ", ")));
  NormArgs n;
  n.normalized_ndim = static_cast<int>(attrs.ints[0]);
  n.weight = attrs.ints.size() > 1 && attrs.ints[1] != 0;
  n.bias = attrs.ints.size() > 2 && attrs.ints[2] != 0;
  if (rms && n.bias) throw ValueError(fmt::format("[{}] takes no bias", op));
  const int nd = static_cast<int>(in[0].shape.size());
  if (n.normalized_ndim < 1 || n.normalized_ndim > nd)
    throw ShapeError(fmt::format("[{}] normalized_ndim {} for a tensor of {} dims; expected 1..{}", op,
                                 n.normalized_ndim, nd, nd));
  const std::size_t expected = 1 + n.weight + n.bias;
  if (in.size() != expected)
    throw ValueError(fmt::format("[{}] got {} tensor inputs; attrs.ints ({}) ask for {}", op, in.size(),
                                 fmt::join(attrs.ints, ", "), expected));
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
  return n;
}

void add_normalization(OpRegistry& registry, std::string name, bool rms) {
  OpDef def;
  def.name = name;
  def.num_inputs = -1;
  def.doc = rms ? "x / sqrt(mean(x^2) + eps) [* weight] over the trailing attrs.ints[0] dims"
                : "(x - mean) / sqrt(var + eps) [* weight + bias] over the trailing attrs.ints[0] dims";
  def.meta = [name, rms](std::span<const TensorMeta> in, const OpAttrs& a) {
    if (in.empty()) throw ValueError(fmt::format("[{}] needs an input tensor", name));
    check_dtype(name, in[0].dtype, false);
    norm_args(name, in, a, rms);
    return in[0];
  };
  // Normalized dims unsharded, leading dims keep their shards, weight and
  // bias replicated; not linear, so no Partial input.
  def.strategy = [name, rms](const StrategyQuery& q) {
    const NormArgs n = norm_args(name, q.inputs, q.attrs, rms);
    const std::size_t nin = q.inputs.size();
    auto with_params = [&](Placement x) {
      std::vector<Placement> ins(nin, Replicate{});
      ins[0] = x;
      return ins;
    };
    std::vector<DimStrategy> per_dim{{with_params(Replicate{}), Replicate{}}};
    const auto lead = static_cast<std::int64_t>(q.inputs[0].shape.size()) - n.normalized_ndim;
    for (std::int64_t d = 0; d < lead; ++d) per_dim.push_back({with_params(Shard{d}), Shard{d}});
    return with_current_nesting(per_dim, q);
  };
  set_kernels(def, [name, rms](const KernelArgs& a) {
    const NormArgs n = norm_args(name, a.global, a.attrs, rms);
    Tensor weight = n.weight ? a.inputs[1] : Tensor();
    Tensor bias = n.bias ? a.inputs[n.weight ? 2 : 1] : Tensor();
    return on_cuda(a) ? cuda_kernels::normalize(a.inputs[0], n.normalized_ndim, weight, bias, a.attrs.scalar, rms)
                      : cpu::normalize(a.inputs[0], n.normalized_ndim, weight, bias, a.attrs.scalar, rms);
  });
  registry.add(std::move(def));
}

}  // namespace

void register_reduction_ops(OpRegistry& registry) {
  using K = cpu::ReduceKind;
  add_reduction(registry, {"sum", ReduceOp::Sum, ReduceOp::Sum, true, false, false},
                "sum over attrs.dims (empty: all), attrs.flag = keepdim", reduce_kernel(K::Sum, false));
  add_reduction(registry, {"mean", ReduceOp::Sum, ReduceOp::Sum, false, false, false},
                "mean over attrs.dims (empty: all), attrs.flag = keepdim; a sharded reduced dim gives P(sum) "
                "of local sums over the global count",
                reduce_kernel(K::Sum, true));
  add_reduction(registry, {"max", ReduceOp::Max, ReduceOp::Max, true, false, true},
                "max over attrs.dims (empty: all), attrs.flag = keepdim", reduce_kernel(K::Max, false));
  add_reduction(registry, {"min", ReduceOp::Min, ReduceOp::Min, true, false, true},
                "min over attrs.dims (empty: all), attrs.flag = keepdim", reduce_kernel(K::Min, false));
  // A p-norm of a sharded dim is not a Partial of norms: the reduced dims
  // must be unsharded (propagation gathers them).
  add_reduction(registry, {"norm", std::nullopt, std::nullopt, false, false, false},
                "p-norm (p = attrs.scalar) over attrs.dims (empty: all); reduced dims are gathered",
                reduce_kernel(K::Norm, false));
  add_reduction(registry, {"argmax", std::nullopt, std::nullopt, true, true, true},
                "index (i64) of the first max along attrs.dims[0] (empty: flattened), attrs.flag = keepdim",
                [](const KernelArgs& a) {
                  const auto nd = a.inputs[0].dim();
                  int dim = -1;
                  if (!a.attrs.dims.empty() && nd > 0)
                    dim = static_cast<int>(a.attrs.dims[0] < 0 ? a.attrs.dims[0] + nd : a.attrs.dims[0]);
                  return on_cuda(a) ? cuda_kernels::argmax(a.inputs[0], dim, a.output_box.size)
                                    : cpu::argmax(a.inputs[0], dim, a.output_box.size);
                });
  add_softmax(registry, "softmax", false);
  add_softmax(registry, "log_softmax", true);
  add_normalization(registry, "layer_norm", false);
  add_normalization(registry, "rms_norm", true);
}

}  // namespace dtensor
