#pragma once
// Front-end functions of the shape ops (ops/src/shape_ops.cpp) and the
// factories. Each shape function works on a Tensor or a DTensor alike (thin
// templates over call_op); on a DTensor a shard follows its dim where the
// data allow it, and the input is redistributed first where they do not.
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <vector>

#include "dtensor/api/functional.h"
#include "dtensor/core/error.h"
#include "dtensor/core/shape.h"

namespace dtensor {

namespace detail {
template <TensorOrDTensor T>
T shape_op(Op op, const T& x, const OpAttrs& attrs) {
  return call_op(op, std::span<const T>(&x, 1), attrs);
}
/// split's pieces (narrow calls), recorded as one node whose backward is one
/// cat of the pieces' gradients (shape_ops.cpp).
std::vector<Tensor> split_pieces(const Tensor& x, int dim, const std::vector<std::int64_t>& sizes);
std::vector<DTensor> split_pieces(const DTensor& x, int dim, const std::vector<std::int64_t>& sizes);
}  // namespace detail

/// Swaps dims d0 and d1.
template <TensorOrDTensor T>
T transpose(const T& x, std::int64_t d0, std::int64_t d1) {
  return detail::shape_op(registered_op<"transpose">(), x, TransposeAttrs{.dim0 = d0, .dim1 = d1});
}
/// Output dim i is input dim perm[i].
template <TensorOrDTensor T>
T permute(const T& x, std::vector<std::int64_t> perm) {
  return detail::shape_op(registered_op<"permute">(), x, DimsAttrs{.dims = std::move(perm)});
}
/// Same elements in row-major order, as `shape` (one -1 is inferred).
template <TensorOrDTensor T>
T reshape(const T& x, Shape shape) {
  return detail::shape_op(registered_op<"reshape">(), x, ShapeAttrs{.shape = std::move(shape)});
}
/// Same as reshape (the result never shares storage with the input).
template <TensorOrDTensor T>
T view(const T& x, Shape shape) {
  return detail::shape_op(registered_op<"view">(), x, ShapeAttrs{.shape = std::move(shape)});
}
/// Merges dims start..end (inclusive) into one.
template <TensorOrDTensor T>
T flatten(const T& x, std::int64_t start = 0, std::int64_t end = -1) {
  return detail::shape_op(registered_op<"flatten">(), x, FlattenAttrs{.start_dim = start, .end_dim = end});
}
/// Splits dim `dim` into `sizes` (one -1 is inferred).
template <TensorOrDTensor T>
T unflatten(const T& x, std::int64_t dim, std::vector<std::int64_t> sizes) {
  return detail::shape_op(registered_op<"unflatten">(), x, UnflattenAttrs{.dim = dim, .sizes = std::move(sizes)});
}
/// Drops dim `dim` if its size is 1 (PyTorch keeps other dims as they are).
template <TensorOrDTensor T>
T squeeze(const T& x, std::int64_t dim) {
  return detail::shape_op(registered_op<"squeeze">(), x, DimsAttrs{.dims = {dim}});
}
/// Drops every size-1 dim.
template <TensorOrDTensor T>
T squeeze(const T& x) {
  return detail::shape_op(registered_op<"squeeze">(), x, DimsAttrs{});
}
/// Inserts a size-1 dim at `dim` (-1: at the end).
template <TensorOrDTensor T>
T unsqueeze(const T& x, std::int64_t dim) {
  return detail::shape_op(registered_op<"unsqueeze">(), x, DimAttrs{.dim = dim});
}
/// Broadcasts size-1 dims (and new leading dims) to `shape`; -1 keeps a size.
template <TensorOrDTensor T>
T expand(const T& x, Shape shape) {
  return detail::shape_op(registered_op<"expand">(), x, ShapeAttrs{.shape = std::move(shape)});
}
/// Elements start .. start+length of dim `dim`.
template <TensorOrDTensor T>
T narrow(const T& x, std::int64_t dim, std::int64_t start, std::int64_t length) {
  return detail::shape_op(registered_op<"narrow">(), x, NarrowAttrs{.dim = dim, .start = start, .length = length});
}
/// Python's x[..., start:end, ...] on dim `dim` (step 1; negative ends count
/// from the end; clamped like Python).
template <TensorOrDTensor T>
T slice(const T& x, std::int64_t dim, std::int64_t start, std::int64_t end) {
  const std::int64_t n = x.shape()[wrap_dim("slice", dim, x.dim())];
  auto clamp = [n](std::int64_t v) { return v < 0 ? std::max<std::int64_t>(0, v + n) : std::min(v, n); };
  const std::int64_t s = clamp(start), e = clamp(end);
  return narrow(x, dim, s, std::max<std::int64_t>(0, e - s));
}
/// Concatenates along `dim`; the inputs agree on every other dim.
template <TensorOrDTensor T>
T cat(std::span<const T> xs, std::int64_t dim) {
  return call_op(registered_op<"cat">(), xs, DimAttrs{.dim = dim});
}
template <TensorOrDTensor T>
T cat(std::initializer_list<T> xs, std::int64_t dim) {
  return cat(std::span<const T>(xs.begin(), xs.size()), dim);
}
/// Stacks same-shaped inputs along a new dim `dim`.
template <TensorOrDTensor T>
T stack(std::span<const T> xs, std::int64_t dim) {
  return call_op(registered_op<"stack">(), xs, DimAttrs{.dim = dim});
}
template <TensorOrDTensor T>
T stack(std::initializer_list<T> xs, std::int64_t dim) {
  return stack(std::span<const T>(xs.begin(), xs.size()), dim);
}
/// Splits dim `dim` into pieces of the given sizes (which add up to its
/// size), as narrow calls: on a DTensor a piece keeps the shards of the other
/// dims. Autograd: one node for all pieces, whose backward is one cat of
/// their gradients (zeros for a piece that got none), not a zero-padded
/// copy of the whole per piece. ShapeError if the sizes do not add up.
template <TensorOrDTensor T>
std::vector<T> split(const T& x, std::int64_t dim, const std::vector<std::int64_t>& sizes) {
  const int d = wrap_dim("split", dim, x.dim());
  std::int64_t total = 0;
  for (auto s : sizes) total += s;
  if (total != x.shape()[d])
    throw ShapeError(fmt::format("[split] sizes [{}] add up to {}, dim {} has size {}", fmt::join(sizes, ", "), total,
                                 dim, x.shape()[d]));
  return detail::split_pieces(x, d, sizes);
}
/// torch.split with a chunk size: pieces of `size` along `dim`, the last
/// one shorter.
template <TensorOrDTensor T>
std::vector<T> split(const T& x, std::int64_t dim, std::int64_t size) {
  const int d = wrap_dim("split", dim, x.dim());
  if (size <= 0) throw ValueError(fmt::format("[split] chunk size {} must be positive", size));
  std::vector<std::int64_t> sizes;
  for (std::int64_t left = x.shape()[d]; left > 0; left -= size) sizes.push_back(std::min(left, size));
  return split(x, dim, sizes);
}
/// Converts to `dtype` (any layout; a Partial input of an integer dtype, or
/// to one, is reduced first).
template <TensorOrDTensor T>
T to(const T& x, DType dtype) {
  return detail::shape_op(registered_op<"to">(), x, ToAttrs{.dtype = dtype});
}

// ---- Factories: each rank fills only its own box --------------------------
// A Partial(sum) layout holds the value on mesh coordinate 0 (along each
// Partial mesh dim) and zeros elsewhere; Partial(max|min|avg) copies it.

DTensor zeros(const Shape& shape, const DeviceMesh& mesh, const Layout& layout, DType dtype = DType::Float32);
DTensor ones(const Shape& shape, const DeviceMesh& mesh, const Layout& layout, DType dtype = DType::Float32);
DTensor full(const Shape& shape, double value, const DeviceMesh& mesh, const Layout& layout,
             DType dtype = DType::Float32);
/// 0, 1, ..., n-1 in row-major order, as Tensor::arange(shape).
DTensor arange(const Shape& shape, const DeviceMesh& mesh, const Layout& layout, DType dtype = DType::Float32);
/// The values of Tensor::rand(shape, dtype, seed) on any layout.
DTensor rand(const Shape& shape, std::uint64_t seed, const DeviceMesh& mesh, const Layout& layout,
             DType dtype = DType::Float32);
/// The values of Tensor::randn(shape, dtype, seed) on any layout.
DTensor randn(const Shape& shape, std::uint64_t seed, const DeviceMesh& mesh, const Layout& layout,
              DType dtype = DType::Float32);
/// `full`, which every rank holds whole and alike, laid out as `layout`:
/// each rank keeps its own box, with no communication (distribute_tensor
/// sends rank 0's copy instead, for callers where only one rank has it).
DTensor from_full(const Tensor& full, const DeviceMesh& mesh, const Layout& layout);

}  // namespace dtensor
