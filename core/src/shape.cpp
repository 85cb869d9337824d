#include "dtensor/core/shape.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>

#include "dtensor/core/error.h"

namespace dtensor {

namespace {

[[noreturn]] void throw_too_large(std::span<const std::int64_t> shape) {
  throw ShapeError(fmt::format("[shape] shape {} has more than {} elements (int64): its size does not fit",
                               fmt::join(shape, "x"), std::numeric_limits<std::int64_t>::max()));
}

}  // namespace

namespace detail {
void throw_size_overflow(std::int64_t a, char op, std::int64_t b, std::string_view what) {
  throw ShapeError(fmt::format("[shape] {}: {} {} {} does not fit in int64 (at most {})", what, a, op, b,
                               std::numeric_limits<std::int64_t>::max()));
}
}  // namespace detail

std::optional<std::int64_t> checked_product(std::span<const std::int64_t> sizes) {
  std::int64_t n = 1;
  bool zero = false;
  for (auto s : sizes) {
    if (s == 0) {
      zero = true;
      continue;
    }
    if (__builtin_mul_overflow(n, s, &n)) return std::nullopt;
  }
  return zero ? 0 : n;
}

std::int64_t numel(std::span<const std::int64_t> shape) {
  const std::optional<std::int64_t> n = checked_product(shape);
  if (!n) throw_too_large(shape);
  return *n;
}

std::int64_t byte_size(std::span<const std::int64_t> shape, std::size_t itemsize) {
  const std::int64_t n = numel(shape);
  std::int64_t bytes;
  if (__builtin_mul_overflow(n, static_cast<std::int64_t>(itemsize), &bytes))
    throw ShapeError(
        fmt::format("[shape] shape {} of {}-byte elements: its {} elements take more than {} bytes "
                    "(int64): its size does not fit",
                    fmt::join(shape, "x"), itemsize, n, std::numeric_limits<std::int64_t>::max()));
  return bytes;
}

Shape row_major_strides(std::span<const std::int64_t> shape) {
  // Every stride is a product of some of the non-zero sizes: checked_product
  // bounds them all.
  if (!checked_product(shape)) throw_too_large(shape);
  Shape strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

Shape parse_shape(std::string_view text) {
  Shape shape;
  std::string_view rest = text;
  auto trim = [](std::string_view s) {
    while (!s.empty() && (std::isspace(static_cast<unsigned char>(s.front())) || s.front() == '[' || s.front() == '('))
      s.remove_prefix(1);
    while (!s.empty() && (std::isspace(static_cast<unsigned char>(s.back())) || s.back() == ']' || s.back() == ')'))
      s.remove_suffix(1);
    return s;
  };
  rest = trim(rest);
  if (rest.empty()) return shape;  // a 0-d shape
  while (true) {
    auto pos = rest.find_first_of(",x");
    std::string_view item = trim(rest.substr(0, pos));
    std::int64_t value = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size())
      throw ParseError(fmt::format("[shape] '{}' in '{}' is not a size: expected sizes like 64,128", item, text));
    if (value < 0) throw ShapeError(fmt::format("[shape] size {} in '{}' is negative", value, text));
    shape.push_back(value);
    if (pos == std::string_view::npos) break;
    rest = rest.substr(pos + 1);
  }
  return shape;
}

void check_shape(std::span<const std::int64_t> shape, std::string_view what) {
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (shape[d] < 0)
      throw ShapeError(
          fmt::format("[{}] size {} of dim {} in shape {} is negative", what, shape[d], d, fmt::join(shape, "x")));
  if (!checked_product(shape))
    throw ShapeError(fmt::format("[{}] shape {} has more than {} elements (int64): its size does not fit", what,
                                 fmt::join(shape, "x"), std::numeric_limits<std::int64_t>::max()));
}

int wrap_dim(std::string_view where, std::int64_t dim, std::int64_t ndim) {
  if (dim < -ndim || dim >= ndim)
    throw ShapeError(
        fmt::format("[{}] dim {} out of range for a {}-d tensor (expected {}..{})", where, dim, ndim, -ndim, ndim - 1));
  return static_cast<int>(dim < 0 ? dim + ndim : dim);
}

Around around(std::span<const std::int64_t> shape, int dim) {
  Around a;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    if (d < dim)
      a.outer *= shape[d];
    else if (d == dim)
      a.n = shape[d];
    else
      a.inner *= shape[d];
  }
  return a;
}

Shape unravel_index(std::int64_t index, std::span<const std::int64_t> shape) {
  Shape coord(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    coord[d] = index % shape[d];
    index /= shape[d];
  }
  return coord;
}

std::int64_t ravel_index(std::span<const std::int64_t> coord, std::span<const std::int64_t> shape) {
  std::int64_t index = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) index = index * shape[d] + coord[d];
  return index;
}

std::int64_t Box::numel() const { return dtensor::numel(size); }
bool Box::empty() const { return numel() == 0; }

Box full_box(std::span<const std::int64_t> shape) {
  return Box{Shape(shape.size(), 0), Shape(shape.begin(), shape.end())};
}

Box intersect(const Box& a, const Box& b) {
  Box r{Shape(a.ndim()), Shape(a.ndim())};
  for (int d = 0; d < a.ndim(); ++d) {
    std::int64_t lo = std::max(a.offset[d], b.offset[d]);
    std::int64_t hi = std::min(a.offset[d] + a.size[d], b.offset[d] + b.size[d]);
    r.offset[d] = lo;
    r.size[d] = std::max<std::int64_t>(0, hi - lo);
  }
  return r;
}

bool contains(const Box& outer, const Box& inner) {
  if (inner.empty()) return true;
  for (int d = 0; d < outer.ndim(); ++d)
    if (inner.offset[d] < outer.offset[d] || inner.offset[d] + inner.size[d] > outer.offset[d] + outer.size[d])
      return false;
  return true;
}

std::vector<Box> subtract(const Box& a, const Box& b) {
  std::vector<Box> out;
  if (a.empty()) return out;
  Box inter = intersect(a, b);
  if (inter.empty()) {
    out.push_back(a);
    return out;
  }
  // Peel slabs off `rest` one dim at a time: below and above the intersection.
  Box rest = a;
  for (int d = 0; d < a.ndim(); ++d) {
    std::int64_t lo = inter.offset[d], hi = inter.offset[d] + inter.size[d];
    std::int64_t rlo = rest.offset[d], rhi = rest.offset[d] + rest.size[d];
    if (lo > rlo) {
      Box piece = rest;
      piece.size[d] = lo - rlo;
      if (!piece.empty()) out.push_back(piece);
    }
    if (hi < rhi) {
      Box piece = rest;
      piece.offset[d] = hi;
      piece.size[d] = rhi - hi;
      if (!piece.empty()) out.push_back(piece);
    }
    rest.offset[d] = lo;
    rest.size[d] = hi - lo;
  }
  return out;
}

Chunk chunk(std::int64_t size, std::int64_t parts, std::int64_t index) {
  if (parts <= 0) throw ValueError(fmt::format("[shape] chunk into {} parts: expected at least 1", parts));
  if (size % parts == 0) return {size / parts, index * (size / parts)};
  std::int64_t c = (size + parts - 1) / parts;
  std::int64_t start = index * c;
  if (start >= size) return {0, size};
  return {std::min(size, start + c) - start, start};
}

Chunk even_split(std::int64_t count, std::int64_t parts, std::int64_t index) {
  std::int64_t base = count / parts, extra = count % parts;
  std::int64_t size = base + (index < extra ? 1 : 0);
  std::int64_t offset = index * base + std::min(index, extra);
  return {size, offset};
}

std::int64_t all_reduce_recv_count(std::int64_t count, std::int64_t n, std::int64_t index) {
  const std::int64_t seg = even_split(count, n, index).size;
  return checked_add(checked_mul(n - 1, seg, "all_reduce elements received"), count - seg,
                     "all_reduce elements received");
}

}  // namespace dtensor
