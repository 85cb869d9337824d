// The embedding family: embedding (a row lookup in a table) and pick (one
// entry per row, the target logit of cross entropy). Both take an index
// tensor; a shard of the table (or of the class dim) looks up only the
// indices that fall in its rows and writes zeros elsewhere, so the output is
// Partial(sum) without any communication (PyTorch's MaskPartial).
#include "device_kernels.h"
#include "dtensor/core/error.h"
#include "families.h"

namespace dtensor {
namespace {

void check_index_dtype(std::string_view op, std::string_view what, DType dtype) {
  if (dtype != DType::Int64) throw DTypeError(fmt::format("[{}] {} are {}; expected i64", op, what, dtype));
}

// ---- embedding(indices [...], table [V, D]) -> [..., D] --------------------

TensorMeta embedding_meta(std::span<const TensorMeta> in, const OpAttrs&) {
  check_index_dtype("embedding", "indices", in[0].dtype);
  if (in[1].shape.size() != 2)
    throw ShapeError(fmt::format("[embedding] table of shape {} ({} dims); expected 2 dims [rows, dim]",
                                 fmt::join(in[1].shape, "x"), in[1].shape.size()));
  Shape out = in[0].shape;
  out.push_back(in[1].shape[1]);
  return {out, in[1].dtype};
}

// Per mesh dim: table R -> the output follows the indices' shards; table
// S(0) with indices R -> P(sum) (masked lookup); table S(1) with indices R
// -> S(last); table P(sum) with indices R -> P(sum) (linear in the table).
std::vector<DimStrategy> embedding_strategy(const StrategyQuery& q) {
  const auto nd = static_cast<std::int64_t>(q.inputs[0].shape.size());
  std::vector<DimStrategy> per_dim{{{Replicate{}, Replicate{}}, Replicate{}}};
  for (std::int64_t k = 0; k < nd; ++k) per_dim.push_back({{Shard{k}, Replicate{}}, Shard{k}});
  per_dim.push_back({{Replicate{}, Shard{0}}, Partial{ReduceOp::Sum}});
  per_dim.push_back({{Replicate{}, Shard{1}}, Shard{nd}});
  if (is_floating(q.inputs[1].dtype))
    per_dim.push_back({{Replicate{}, Partial{ReduceOp::Sum}}, Partial{ReduceOp::Sum}});
  return per_dim;
}

Kernel embedding_kernel(const device::Kernels& k) {
  return [&k](const KernelArgs& a) {
    return k.embedding(a.inputs[0], a.inputs[1], a.boxes[1].offset[0], a.global[1].shape[0]);
  };
}

// ---- pick(logits [N, C], targets [N]) -> [N] --------------------------------

TensorMeta pick_meta(std::span<const TensorMeta> in, const OpAttrs&) {
  check_index_dtype("pick", "targets", in[1].dtype);
  if (in[0].shape.size() != 2)
    throw ShapeError(fmt::format("[pick] logits of shape {} ({} dims); expected 2 dims [N, C]",
                                 fmt::join(in[0].shape, "x"), in[0].shape.size()));
  if (in[1].shape.size() != 1 || in[1].shape[0] != in[0].shape[0])
    throw ShapeError(fmt::format("[pick] targets of shape {}; expected [{}] to match logits {}",
                                 fmt::join(in[1].shape, "x"), in[0].shape[0], fmt::join(in[0].shape, "x")));
  return {{in[0].shape[0]}, in[0].dtype};
}

// Per mesh dim: R,R -> R; logits S(1) (class dim), targets R -> P(sum)
// (masked pick); S(0),S(0) -> S(0); logits P(sum), targets R -> P(sum).
std::vector<DimStrategy> pick_strategy(const StrategyQuery& q) {
  std::vector<DimStrategy> per_dim{
      {{Replicate{}, Replicate{}}, Replicate{}},
      {{Shard{1}, Replicate{}}, Partial{ReduceOp::Sum}},
      {{Shard{0}, Shard{0}}, Shard{0}},
  };
  if (is_floating(q.inputs[0].dtype))
    per_dim.push_back({{Partial{ReduceOp::Sum}, Replicate{}}, Partial{ReduceOp::Sum}});
  return per_dim;
}

Kernel pick_kernel(const device::Kernels& k) {
  return [&k](const KernelArgs& a) {
    return k.pick(a.inputs[0], a.inputs[1], a.boxes[0].offset[1], a.global[0].shape[1]);
  };
}

}  // namespace

void register_embedding_ops(OpRegistry& registry) {
  OpDef emb = dim_strategy_op("embedding", 2,
                              "table[indices]: rows of a [V, D] table looked up by i64 indices, output [..., D]",
                              embedding_meta, embedding_strategy);
  device::bind_kernels(emb, embedding_kernel);
  registry.add(std::move(emb));

  OpDef pick =
      dim_strategy_op("pick", 2, "logits[n, targets[n]]: one entry per row of [N, C] logits by i64 targets [N]",
                      pick_meta, pick_strategy);
  device::bind_kernels(pick, pick_kernel);
  registry.add(std::move(pick));
}

}  // namespace dtensor
