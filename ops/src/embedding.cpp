// The embedding family: embedding (a row lookup in a table) and pick (one
// entry per row, the target logit of cross entropy). Both take an index
// tensor; a shard of the table (or of the class dim) looks up only the
// indices that fall in its rows and writes zeros elsewhere, so the output is
// Partial(sum) without any communication (PyTorch's MaskPartial).
#include <algorithm>
#include <cstring>

#include "../cuda/gemm_shape_embedding.h"
#include "dtensor/core/cuda.h"
#include "dtensor/core/error.h"
#include "families.h"

namespace dtensor {
namespace {

constexpr int kCpu = static_cast<int>(Device::CPU);
constexpr int kCuda = static_cast<int>(Device::CUDA);

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
std::vector<Strategy> embedding_strategy(const StrategyQuery& q) {
  const auto nd = static_cast<std::int64_t>(q.inputs[0].shape.size());
  std::vector<DimStrategy> per_dim{{{Replicate{}, Replicate{}}, Replicate{}}};
  for (std::int64_t k = 0; k < nd; ++k) per_dim.push_back({{Shard{k}, Replicate{}}, Shard{k}});
  per_dim.push_back({{Replicate{}, Shard{0}}, Partial{ReduceOp::Sum}});
  per_dim.push_back({{Replicate{}, Shard{1}}, Shard{nd}});
  if (is_floating(q.inputs[1].dtype)) per_dim.push_back({{Replicate{}, Partial{ReduceOp::Sum}}, Partial{ReduceOp::Sum}});
  return expand_to_mesh(per_dim, q);
}

Tensor embedding_kernel(const KernelArgs& a) {
  const Tensor& idx = a.inputs[0];
  const Tensor& table = a.inputs[1];
  const std::int64_t vocab = a.global[1].shape[0];
  const std::int64_t row0 = a.boxes[1].offset[0];
  const std::int64_t rows = table.shape()[0];
  const std::int64_t cols = table.shape()[1];
  Shape out_shape = idx.shape();
  out_shape.push_back(cols);
  if (cuda_kernels::on_cuda("embedding", a.inputs)) {
    Tensor out = Tensor::empty(out_shape, table.dtype(), Device::CUDA);
    cuda_kernels::embedding(idx.data_as<std::int64_t>(), idx.numel(), table.data(), row0, rows, cols, vocab,
                            itemsize(table.dtype()), out.data());
    return out;
  }
  Tensor out = Tensor::zeros(out_shape, table.dtype());
  const std::int64_t* ip = idx.data_as<std::int64_t>();
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * itemsize(table.dtype());
  for (std::int64_t n = 0; n < idx.numel(); ++n) {
    const std::int64_t i = ip[n];
    if (i < 0 || i >= vocab)
      throw ValueError(fmt::format("[embedding] index {} out of range for a table of {} rows; expected 0 <= index < {}",
                                   i, vocab, vocab));
    if (i < row0 || i >= row0 + rows) continue;  // another rank's row: zeros (Partial sum)
    std::memcpy(out.bytes() + static_cast<std::size_t>(n) * row_bytes,
                table.bytes() + static_cast<std::size_t>(i - row0) * row_bytes, row_bytes);
  }
  return out;
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
std::vector<Strategy> pick_strategy(const StrategyQuery& q) {
  std::vector<DimStrategy> per_dim{
      {{Replicate{}, Replicate{}}, Replicate{}},
      {{Shard{1}, Replicate{}}, Partial{ReduceOp::Sum}},
      {{Shard{0}, Shard{0}}, Shard{0}},
  };
  if (is_floating(q.inputs[0].dtype)) per_dim.push_back({{Partial{ReduceOp::Sum}, Replicate{}}, Partial{ReduceOp::Sum}});
  return expand_to_mesh(per_dim, q);
}

Tensor pick_kernel(const KernelArgs& a) {
  const Tensor& logits = a.inputs[0];
  const Tensor& targets = a.inputs[1];
  const std::int64_t classes = a.global[0].shape[1];
  const std::int64_t col0 = a.boxes[0].offset[1];
  const std::int64_t n = logits.shape()[0];
  const std::int64_t cols = logits.shape()[1];
  if (cuda_kernels::on_cuda("pick", a.inputs)) {
    Tensor out = Tensor::empty({n}, logits.dtype(), Device::CUDA);
    cuda_kernels::pick(logits.data(), targets.data_as<std::int64_t>(), n, cols, col0, classes,
                       itemsize(logits.dtype()), out.data());
    return out;
  }
  Tensor out = Tensor::zeros({n}, logits.dtype());
  const std::int64_t* tp = targets.data_as<std::int64_t>();
  visit_dtype(logits.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* x = logits.data_as<T>();
    T* y = out.data_as<T>();
    for (std::int64_t r = 0; r < n; ++r) {
      const std::int64_t t = tp[r];
      if (t < 0 || t >= classes)
        throw ValueError(fmt::format("[pick] target {} out of range for {} classes; expected 0 <= target < {}", t,
                                     classes, classes));
      if (t >= col0 && t < col0 + cols) y[r] = x[r * cols + (t - col0)];
    }
  });
  return out;
}

}  // namespace

void register_embedding_ops(OpRegistry& registry) {
  OpDef emb;
  emb.name = "embedding";
  emb.num_inputs = 2;
  emb.doc = "table[indices]: rows of a [V, D] table looked up by i64 indices, output [..., D]";
  emb.meta = embedding_meta;
  emb.strategy = embedding_strategy;
  emb.kernels[kCpu] = embedding_kernel;
  if (cuda::built()) emb.kernels[kCuda] = embedding_kernel;
  registry.add(std::move(emb));

  OpDef pick;
  pick.name = "pick";
  pick.num_inputs = 2;
  pick.doc = "logits[n, targets[n]]: one entry per row of [N, C] logits by i64 targets [N]";
  pick.meta = pick_meta;
  pick.strategy = pick_strategy;
  pick.kernels[kCpu] = pick_kernel;
  if (cuda::built()) pick.kernels[kCuda] = pick_kernel;
  registry.add(std::move(pick));
}

}  // namespace dtensor
