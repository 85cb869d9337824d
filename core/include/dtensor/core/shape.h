#pragma once
// Shapes, row-major indexing and boxes (the regions that shards occupy).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/core/inline_vector.h"

namespace dtensor {

/// Sizes, strides, offsets and coordinates: up to 6 held inline (no heap
/// allocation to make or copy one), more on the heap.
using Shape = InlineVector<std::int64_t, 6>;

// Checked size arithmetic: every product or sum of sizes (element counts,
// byte sizes, strides, box volumes, mesh rank counts, the planner's byte
// counts) goes through these, so that a size beyond int64 is an error
// naming it rather than a wrapped number.

namespace detail {
[[noreturn]] void throw_size_overflow(std::int64_t a, char op, std::int64_t b, std::string_view what);
}  // namespace detail

/// a * b, or ShapeError naming `what` and both values where it does not fit
/// in int64. Inline: the planner's inner loops call it.
inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) [[unlikely]]
    detail::throw_size_overflow(a, '*', b, what);
  return r;
}
/// a + b, or ShapeError naming `what` and both values where it does not fit in int64.
inline std::int64_t checked_add(std::int64_t a, std::int64_t b, std::string_view what) {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) [[unlikely]]
    detail::throw_size_overflow(a, '+', b, what);
  return r;
}
/// The product of non-negative sizes (1 for none), or nullopt where the
/// product of the non-zero ones does not fit in int64 (then some stride or
/// sub-box volume would not either, even when a 0 makes the count 0).
std::optional<std::int64_t> checked_product(std::span<const std::int64_t> sizes);

/// Product of the sizes (1 for a 0-d shape); ShapeError naming the shape
/// where checked_product fails.
std::int64_t numel(std::span<const std::int64_t> shape);
/// numel(shape) * itemsize; ShapeError naming the shape and the element
/// size where the bytes do not fit in int64.
std::int64_t byte_size(std::span<const std::int64_t> shape, std::size_t itemsize);
/// Row-major strides in elements; ShapeError where they do not fit (as numel).
Shape row_major_strides(std::span<const std::int64_t> shape);
/// Parses "64,128" or "64x128" (also "[64, 128]"); ShapeError/ParseError on bad text.
Shape parse_shape(std::string_view text);
/// Throws ShapeError if a size is negative or the sizes do not multiply out
/// within int64 (checked_product); `what` names the caller.
void check_shape(std::span<const std::int64_t> shape, std::string_view what);
/// `dim` of an `ndim`-d tensor counted from 0 (negative dims count from the
/// end, as in PyTorch); ShapeError naming `where`, the dim and the range
/// [-ndim, ndim-1] otherwise.
int wrap_dim(std::string_view where, std::int64_t dim, std::int64_t ndim);

/// A shape as outer x n x inner around `dim` (the product of the dims before
/// it, its size, the product of those after it), as a row-major kernel walks
/// one dim: element (o, k, i) lies at (o * n + k) * inner + i. Plain
/// products: the shape is a tensor's, whose numel fits.
struct Around {
  std::int64_t outer = 1, n = 1, inner = 1;
};
Around around(std::span<const std::int64_t> shape, int dim);

/// Linear rank <-> mesh coordinate, row-major (the last mesh dim varies fastest).
Shape unravel_index(std::int64_t index, std::span<const std::int64_t> shape);
std::int64_t ravel_index(std::span<const std::int64_t> coord, std::span<const std::int64_t> shape);

/// A box: offset and size per dimension. Shards of every layout are boxes.
struct Box {
  Shape offset;
  Shape size;

  std::int64_t numel() const;
  bool empty() const;
  int ndim() const { return static_cast<int>(size.size()); }
  bool operator==(const Box&) const = default;
};

/// The box covering a whole tensor of this shape.
Box full_box(std::span<const std::int64_t> shape);
/// Intersection; an empty box (some size 0) when they do not meet.
Box intersect(const Box& a, const Box& b);
/// a \ b as disjoint boxes (at most 2 per dimension), none empty.
std::vector<Box> subtract(const Box& a, const Box& b);
/// True if `inner` lies inside `outer` (an empty inner always does).
bool contains(const Box& outer, const Box& inner);

/// torch.chunk split of a dimension of `size` over `parts`: the (size, offset)
/// of piece `index`. chunk = ceil(size/parts); trailing pieces may be short or
/// empty; an empty piece reports offset `size`, as PyTorch does.
struct Chunk {
  std::int64_t size;
  std::int64_t offset;
};
Chunk chunk(std::int64_t size, std::int64_t parts, std::int64_t index);

/// Near-even split of `count` items over `parts`: the first count % parts
/// pieces get one more. Used where a collective divides work (all_reduce
/// segments), so that planner and communicators agree on the byte counts.
Chunk even_split(std::int64_t count, std::int64_t parts, std::int64_t index);

/// Elements rank `index` of a group of `n` receives from the others in a
/// bandwidth-optimal all_reduce of `count` elements (reduce-scatter, then
/// all-gather): (n-1)*seg + (count-seg), seg = even_split(count, n, index).size.
/// The one count behind every communicator's byte accounting, the planner's
/// search and the closed-form prices. Post: 0 when n == 1; at most
/// 2*(n-1)*ceil(count/n), the data twice over less this rank's share.
std::int64_t all_reduce_recv_count(std::int64_t count, std::int64_t n, std::int64_t index);
/// Elements each rank receives in a reduce_scatter that leaves it `mine` of
/// the result: (n-1)*mine, one addend from every other rank.
inline std::int64_t reduce_scatter_recv_count(std::int64_t mine, std::int64_t n) {
  return checked_mul(n - 1, mine, "reduce_scatter elements received");
}

}  // namespace dtensor

template <>
struct fmt::formatter<dtensor::Box> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  auto format(const dtensor::Box& b, fmt::format_context& ctx) const {
    auto out = fmt::format_to(ctx.out(), "[");
    for (int d = 0; d < b.ndim(); ++d)
      out = fmt::format_to(out, "{}{}:{}", d ? ", " : "", b.offset[d], b.offset[d] + b.size[d]);
    return fmt::format_to(out, "]");
  }
};
