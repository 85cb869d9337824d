#pragma once
// Shapes, row-major indexing and boxes (the regions that shards occupy).
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dtensor {

using Shape = std::vector<std::int64_t>;

/// Product of the sizes (1 for a 0-d shape).
std::int64_t numel(std::span<const std::int64_t> shape);
/// Row-major strides in elements.
Shape row_major_strides(std::span<const std::int64_t> shape);
/// Parses "64,128" or "64x128" (also "[64, 128]"); ShapeError/ParseError on bad text.
Shape parse_shape(std::string_view text);
/// Throws ShapeError if a size is negative; `what` names the caller.
void check_shape(std::span<const std::int64_t> shape, std::string_view what);
/// `dim` of an `ndim`-d tensor counted from 0 (negative dims count from the
/// end, as in PyTorch); ShapeError naming `where`, the dim and the range
/// [-ndim, ndim-1] otherwise.
int wrap_dim(std::string_view where, std::int64_t dim, std::int64_t ndim);

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
constexpr std::int64_t reduce_scatter_recv_count(std::int64_t mine, std::int64_t n) { return (n - 1) * mine; }

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
