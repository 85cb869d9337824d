// The backward family, part two: the derivative ops that route a gradient
// by index or by reduction: embedding_backward (an index-add into the
// table), cross_entropy_backward (softmax minus one-hot, vocab-parallel),
// max_backward / min_backward (to the element the forward picked) and
// sum_to_shape (a broadcast gradient summed back to its input's shape).
#include <memory>

#include "backward_families.h"
#include "backward_kernels.h"
#include "device_kernels.h"
#include "dtensor/core/error.h"
#include "families.h"

namespace dtensor {
namespace {

using backward::check_floating;
using backward::check_like;
using backward::partial_gradient;

void check_i64(std::string_view op, std::string_view what, DType dtype) {
  if (dtype != DType::Int64) throw DTypeError(fmt::format("[{}] {} are {}; expected i64", op, what, dtype));
}

// ---- embedding_backward(indices [...], grad [..., D], table [V, D]) -> [V, D]
// The table is there for its shape and its layout (its values are not
// read): the gradient comes out in the table's own layout where that is free.

TensorMeta embedding_backward_meta(std::span<const TensorMeta> in, const OpAttrs&) {
  constexpr std::string_view op = "embedding_backward";
  check_i64(op, "indices", in[0].dtype);
  check_floating(op, "grad", in[1].dtype);
  const Shape& table = in[2].shape;
  if (table.size() != 2)
    throw ShapeError(fmt::format("[{}] table of shape {} ({} dims); expected 2 dims [rows, dim]", op,
                                 fmt::join(table, "x"), table.size()));
  if (in[2].dtype != in[1].dtype)
    throw DTypeError(fmt::format("[{}] table is {}; expected grad's dtype {}", op, in[2].dtype, in[1].dtype));
  Shape want = in[0].shape;
  want.push_back(table[1]);
  if (in[1].shape != want)
    throw ShapeError(fmt::format("[{}] grad of shape {}; expected {} (the indices' shape, then the table's dim {})", op,
                                 fmt::join(in[1].shape, "x"), fmt::join(want, "x"), table[1]));
  return in[2];
}

// Per mesh dim: all R -> R; table S(0) -> S(0) (each rank adds only the
// lookups of its own rows, as the forward masks them); table S(1) with grad
// S(last) -> S(1); indices and grad sharded on one index dim -> P(sum) (each
// rank adds its own lookups); grad P(sum) -> P(sum).
std::vector<DimStrategy> embedding_backward_strategy(const StrategyQuery& q) {
  const auto nd = static_cast<std::int64_t>(q.inputs[0].shape.size());
  const Placement r = Replicate{};
  std::vector<DimStrategy> per_dim{{{r, r, r}, r}, {{r, r, Shard{0}}, Shard{0}}, {{r, Shard{nd}, Shard{1}}, Shard{1}}};
  for (std::int64_t k = 0; k < nd; ++k) per_dim.push_back({{Shard{k}, Shard{k}, r}, Partial{ReduceOp::Sum}});
  per_dim.push_back(partial_gradient(3, 1));
  return per_dim;
}

// ---- cross_entropy_backward(z [N, C], targets [N], lse [N], grad [N]) -----

TensorMeta cross_entropy_backward_meta(std::span<const TensorMeta> in, const OpAttrs&) {
  constexpr std::string_view op = "cross_entropy_backward";
  check_floating(op, "logits", in[0].dtype);
  if (in[0].shape.size() != 2)
    throw ShapeError(fmt::format("[{}] logits of shape {} ({} dims); expected 2 dims [N, C]", op,
                                 fmt::join(in[0].shape, "x"), in[0].shape.size()));
  check_i64(op, "targets", in[1].dtype);
  const TensorMeta row{{in[0].shape[0]}, in[0].dtype};
  if (in[1].shape != row.shape)
    throw ShapeError(fmt::format("[{}] targets of shape {}; expected [{}] to match logits {}", op,
                                 fmt::join(in[1].shape, "x"), in[0].shape[0], fmt::join(in[0].shape, "x")));
  check_like(op, "lse", in[2], "a row of the logits", row);
  check_like(op, "grad", in[3], "a row of the logits", row);
  return in[0];
}

// Per mesh dim: all R; rows sharded together -> S(0); the class dim sharded
// with the rest replicated -> S(1) (each shard needs only its own logits and
// the row's lse: the logits are never gathered); grad P(sum) -> P(sum).
std::vector<DimStrategy> cross_entropy_backward_strategy(const StrategyQuery&) {
  const Placement r = Replicate{};
  return {{{r, r, r, r}, r},
          {{Shard{0}, Shard{0}, Shard{0}, Shard{0}}, Shard{0}},
          {{Shard{1}, r, r, r}, Shard{1}},
          partial_gradient(4, 3)};
}

// ---- max_backward, min_backward(x, grad) with the forward's ReduceAttrs -----

// The reduced dims as flags, from attrs the forward's meta has checked.
std::vector<bool> reduced_dims(const Shape& shape, const ReduceAttrs& attrs) {
  const auto nd = static_cast<std::int64_t>(shape.size());
  std::vector<bool> flags(shape.size(), attrs.dims.empty());
  for (auto d : attrs.dims)
    if (nd > 0) flags[static_cast<std::size_t>(d < 0 ? d + nd : d)] = true;
  return flags;
}

void add_extremum_backward(OpRegistry& registry, std::string name, std::string forward, bool max) {
  OpDef def;
  def.name = name;
  def.num_inputs = 2;
  def.doc =
      fmt::format("{}(x, grad): grad at the first {} of each reduced group of x (ReduceAttrs as {}'s), zeros elsewhere",
                  name, max ? "maximum" : "minimum", forward);
  def.meta = [name, forward](std::span<const TensorMeta> in, const OpAttrs& a) {
    check_floating(name, "x", in[0].dtype);
    // The forward's own meta checks the dims and gives grad's shape.
    const TensorMeta out = OpRegistry::global().get(forward).meta(in.subspan(0, 1), a);
    check_like(name, "grad", in[1], fmt::format("{}'s output", forward), out);
    return in[0];
  };
  // Which element is first is only known where the reduced dims are whole:
  // they are unsharded; the kept dims shard x and grad together.
  def.dim_strategy = [name](const StrategyQuery& q) {
    const auto& attrs = q.attrs.get<ReduceAttrs>(name);
    const auto flags = reduced_dims(q.inputs[0].shape, attrs);
    std::vector<DimStrategy> per_dim{{{Replicate{}, Replicate{}}, Replicate{}}};
    std::int64_t out_dim = 0;
    for (std::size_t d = 0; d < flags.size(); ++d) {
      const auto dim = static_cast<std::int64_t>(d);
      if (!flags[d])
        per_dim.push_back({{Shard{dim}, Shard{out_dim++}}, Shard{dim}});
      else if (attrs.keepdim)
        ++out_dim;
    }
    per_dim.push_back(partial_gradient(2, 1));
    return per_dim;
  };
  device::bind_kernels<device::BackwardKernels>(def, [name, max](const device::BackwardKernels& k) {
    return [&k, name, max](const KernelArgs& a) {
      const auto flags = reduced_dims(a.inputs[0].shape(), a.attrs.get<ReduceAttrs>(name));
      const std::unique_ptr<bool[]> f(new bool[flags.size() + 1]);
      std::copy(flags.begin(), flags.end(), f.get());
      return k.extremum_backward(a.inputs[0], std::span<const bool>(f.get(), flags.size()), a.inputs[1], max);
    };
  });
  registry.add(std::move(def));
}

// ---- sum_to_shape(x) -> ShapeAttrs::shape -----------------------------------
// The inverse of broadcasting: sums over x's leading dims and over the dims
// where the target is 1 and x is not.

// Per dim of x: whether it is summed; ShapeError unless the target
// broadcasts to x.
std::vector<bool> summed_dims(const Shape& x, const Shape& target) {
  const std::size_t lead = x.size() >= target.size() ? x.size() - target.size() : 0;
  bool ok = target.size() <= x.size();
  std::vector<bool> flags(x.size(), false);
  for (std::size_t d = 0; ok && d < x.size(); ++d) {
    if (d < lead) {
      flags[d] = true;
      continue;
    }
    const std::int64_t t = target[d - lead];
    if (t == x[d]) continue;
    if (t != 1) ok = false;
    flags[d] = true;
  }
  if (!ok)
    throw ShapeError(fmt::format("[sum_to_shape] target shape ({}) does not broadcast to the input's shape ({})",
                                 fmt::join(target, ","), fmt::join(x, ",")));
  return flags;
}

void add_sum_to_shape(OpRegistry& registry) {
  OpDef def;
  def.name = "sum_to_shape";
  def.num_inputs = 1;
  def.doc =
      "sum_to_shape(x): x summed back to ShapeAttrs::shape, a shape that broadcasts to x's (leading dims and "
      "size-1 dims summed)";
  def.meta = [](std::span<const TensorMeta> in, const OpAttrs& a) {
    const Shape& target = a.get<ShapeAttrs>("sum_to_shape").shape;
    summed_dims(in[0].shape, target);
    return TensorMeta{target, in[0].dtype};
  };
  // As sum's rule: a kept dim keeps its shard (at its index in the target),
  // a summed one gives P(sum), P(sum) passes through.
  def.dim_strategy = [](const StrategyQuery& q) {
    const Shape& x = q.inputs[0].shape;
    const auto flags = summed_dims(x, q.output.shape);
    const auto lead = static_cast<std::int64_t>(x.size() - q.output.shape.size());
    std::vector<DimStrategy> per_dim{{{Replicate{}}, Replicate{}}};
    for (std::size_t d = 0; d < x.size(); ++d) {
      const auto dim = static_cast<std::int64_t>(d);
      per_dim.push_back({{Shard{dim}}, flags[d] ? Placement{Partial{ReduceOp::Sum}} : Placement{Shard{dim - lead}}});
    }
    per_dim.push_back({{Partial{ReduceOp::Sum}}, Partial{ReduceOp::Sum}});
    return per_dim;
  };
  device::bind_kernels(def, [](const device::Kernels& k) {
    return [&k](const KernelArgs& a) {
      const Shape& x = a.inputs[0].shape();
      const auto flags = summed_dims(x, a.output_box.size);
      const std::unique_ptr<bool[]> f(new bool[flags.size() + 1]);
      std::copy(flags.begin(), flags.end(), f.get());
      Shape kept = x;
      for (std::size_t d = 0; d < x.size(); ++d)
        if (flags[d]) kept[d] = 1;
      return k.reduce_dims(a.inputs[0], std::span<const bool>(f.get(), flags.size()), kept, cpu::ReduceKind::Sum, 2, -1)
          .view(a.output_box.size);
    };
  });
  registry.add(std::move(def));
}

}  // namespace

void register_backward_index_ops(OpRegistry& registry) {
  OpDef emb = dim_strategy_op("embedding_backward", 3,
                              "embedding_backward(indices, grad, table): the table's gradient, grad's rows added at "
                              "their indices (the table gives the shape and layout; its values are not read)",
                              embedding_backward_meta, embedding_backward_strategy);
  device::bind_kernels<device::BackwardKernels>(emb, [](const device::BackwardKernels& k) {
    return [&k](const KernelArgs& a) {
      return k.embedding_backward(a.inputs[0], a.inputs[1], a.output_box.offset[0], a.output_box.size[0],
                                  a.output.shape[0]);
    };
  });
  registry.add(std::move(emb));

  OpDef ce = dim_strategy_op("cross_entropy_backward", 4,
                             "cross_entropy_backward(z, targets, lse, grad): grad[n] * (softmax(z)[n, c] - (c == "
                             "targets[n])) with lse[n] = log(sum(exp(z[n, :]))), the logits' gradient of the "
                             "per-row loss",
                             cross_entropy_backward_meta, cross_entropy_backward_strategy);
  device::bind_kernels<device::BackwardKernels>(ce, [](const device::BackwardKernels& k) {
    return [&k](const KernelArgs& a) {
      return k.cross_entropy_backward(a.inputs[0], a.inputs[1], a.inputs[2], a.inputs[3], a.boxes[0].offset[1],
                                      a.global[0].shape[1]);
    };
  });
  registry.add(std::move(ce));

  add_extremum_backward(registry, "max_backward", "max", true);
  add_extremum_backward(registry, "min_backward", "min", false);
  add_sum_to_shape(registry);
}

}  // namespace dtensor
