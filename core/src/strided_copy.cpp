#include "dtensor/core/detail/strided_copy.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "dtensor/core/error.h"
#include "dtensor/core/inline_vector.h"
#include "transpose_plane.h"

namespace dtensor::cpu {
namespace {

// One dim of the copy: its size and its stride on each side, in elements.
struct Dim {
  std::int64_t size, src, dst;
};

// Most copies have a handful of dims; they live on the stack so that a small
// copy (a redistribution's pack of a few rows) pays no allocation.
constexpr std::size_t kInlineDims = 12;

// Runs shorter than this many bytes are copied by a typed loop: a call to
// memcpy costs more than moving them.
constexpr std::size_t kMemcpyMinBytes = 128;

// The edge of a square tile, in elements, and the strips that tiles go in,
// for the rare transposes that transpose_plane does not take (a stride
// other than 1 on a fast side): plain loops, so only the cache blocking.
template <class T>
constexpr std::int64_t kTileEdge = 128 / static_cast<std::int64_t>(sizeof(T));
constexpr std::int64_t kStrip = 256;

// Calls fn(src_offset, dst_offset) for every index of `dims` (outermost first).
template <class Fn>
void walk(const Dim* dims, std::size_t n, std::int64_t s, std::int64_t d, Fn& fn) {
  if (n == 0) {
    fn(s, d);
    return;
  }
  const Dim& dim = dims[0];
  for (std::int64_t i = 0; i < dim.size; ++i) walk(dims + 1, n - 1, s + i * dim.src, d + i * dim.dst, fn);
}

template <class T>
void copy_row(const T* s, std::int64_t ss, T* d, std::int64_t ds, std::int64_t n) {
  if (ss == 1 && ds == 1) {
    if (static_cast<std::size_t>(n) * sizeof(T) >= kMemcpyMinBytes)
      std::memcpy(d, s, static_cast<std::size_t>(n) * sizeof(T));
    else
      for (std::int64_t j = 0; j < n; ++j) d[j] = s[j];
  } else if (ds == 1) {
    for (std::int64_t j = 0; j < n; ++j) d[j] = s[j * ss];
  } else {
    for (std::int64_t j = 0; j < n; ++j) d[j * ds] = s[j * ss];
  }
}

// The plane of dims a (the fastest on the source) and b (the fastest on the
// destination), tile by tile, in strips of kStrip along b. With unit strides
// on the fast sides (nearly every transpose and permute) transpose_plane
// does it with vectors.
template <class T>
void copy_plane(const T* s, T* d, const Dim& a, const Dim& b, bool stream) {
  if (a.src == 1 && b.dst == 1) {
    transpose_plane(reinterpret_cast<const std::byte*>(s), b.src, reinterpret_cast<std::byte*>(d), a.dst, a.size,
                    b.size, sizeof(T), stream);
    return;
  }
  constexpr std::int64_t kEdge = kTileEdge<T>;
  for (std::int64_t b00 = 0; b00 < b.size; b00 += kStrip) {
    const std::int64_t b_end = std::min(b.size, b00 + kStrip);
    for (std::int64_t a0 = 0; a0 < a.size; a0 += kEdge) {
      const std::int64_t na = std::min(kEdge, a.size - a0);
      for (std::int64_t b0 = b00; b0 < b_end; b0 += kEdge) {
        const std::int64_t nb = std::min(kEdge, b_end - b0);
        const T* st = s + a0 * a.src + b0 * b.src;
        T* dt = d + a0 * a.dst + b0 * b.dst;
        for (std::int64_t i = 0; i < na; ++i) copy_row(st + i * a.src, b.src, dt + i * a.dst, b.dst, nb);
      }
    }
  }
}

template <class T>
void copy_typed(const T* src, T* dst, std::span<Dim> dims) {
  const std::size_t n = dims.size();
  if (n == 0) {
    *dst = *src;
    return;
  }
  const Dim inner = dims[n - 1];
  // The outer dim the source moves fastest along, if it is faster than the
  // innermost one: then the copy swaps the two and is tiled over them.
  std::size_t fast = n;
  if (inner.src != 1 || inner.dst != 1) {
    std::int64_t best = std::abs(inner.src);
    for (std::size_t i = 0; i + 1 < n; ++i)
      if (dims[i].src != 0 && std::abs(dims[i].src) < best) {
        best = std::abs(dims[i].src);
        fast = i;
      }
  }
  if (fast == n) {
    auto row = [&](std::int64_t s, std::int64_t d) { copy_row(src + s, inner.src, dst + d, inner.dst, inner.size); };
    walk(dims.data(), n - 1, 0, 0, row);
    return;
  }
  const Dim a = dims[fast];
  // The other dims, in their order, walked around the tiled plane.
  InlineVector<Dim, kInlineDims> rest(n - 2);
  std::size_t r = 0;
  for (std::size_t i = 0; i + 1 < n; ++i)
    if (i != fast) rest[r++] = dims[i];
  std::int64_t bytes = static_cast<std::int64_t>(sizeof(T));
  for (const Dim& dim : dims) bytes *= dim.size;
  const bool stream = bytes >= kStreamStoreBytes;
  auto plane = [&](std::int64_t s, std::int64_t d) { copy_plane(src + s, dst + d, a, inner, stream); };
  walk(rest.data(), r, 0, 0, plane);
}

// The dims of the copy without those of size 1, ordered by destination
// stride (largest first), adjacent dims that stay contiguous on both sides
// merged. Returns false if the copy is empty.
bool canonical_dims(std::span<const std::int64_t> src_strides, std::span<const std::int64_t> dst_strides,
                    std::span<const std::int64_t> shape, Dim* out, std::size_t& n) {
  n = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return false;
    if (shape[i] != 1) out[n++] = Dim{shape[i], src_strides[i], dst_strides[i]};
  }
  // Destinations are nearly always row-major already; insertion sort keeps
  // that cheap and keeps the order of equal strides.
  for (std::size_t i = 1; i < n; ++i)
    for (std::size_t j = i; j > 0 && std::abs(out[j - 1].dst) < std::abs(out[j].dst); --j)
      std::swap(out[j - 1], out[j]);
  std::size_t m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (m > 0 && out[m - 1].src == out[i].src * out[i].size && out[m - 1].dst == out[i].dst * out[i].size)
      out[m - 1] = Dim{out[m - 1].size * out[i].size, out[i].src, out[i].dst};
    else
      out[m++] = out[i];
  }
  n = m;
  return true;
}

template <class Run>
void by_itemsize(std::size_t itemsize, Run&& run) {
  switch (itemsize) {
    case 1: return run(std::uint8_t{});
    case 2: return run(std::uint16_t{});
    case 4: return run(std::uint32_t{});
    case 8: return run(std::uint64_t{});
    default:
      throw Error(fmt::format("[cpu] internal: strided copy of {}-byte elements (expected 1, 2, 4 or 8)", itemsize));
  }
}

void check_ranks(std::span<const std::int64_t> src_strides, std::span<const std::int64_t> dst_strides,
                 std::span<const std::int64_t> shape) {
  if (src_strides.size() != shape.size() || dst_strides.size() != shape.size())
    throw Error(fmt::format("[cpu] internal: strided copy of {} dims with {} source and {} destination strides",
                            shape.size(), src_strides.size(), dst_strides.size()));
}

}  // namespace

void copy_strided(const std::byte* src, std::span<const std::int64_t> src_strides, std::byte* dst,
                  std::span<const std::int64_t> dst_strides, std::span<const std::int64_t> shape,
                  std::size_t itemsize) {
  check_ranks(src_strides, dst_strides, shape);
  InlineVector<Dim, kInlineDims> dims(shape.size());
  std::size_t n = 0;
  if (!canonical_dims(src_strides, dst_strides, shape, dims.data(), n)) return;
  by_itemsize(itemsize, [&](auto zero) {
    using T = decltype(zero);
    copy_typed(reinterpret_cast<const T*>(src), reinterpret_cast<T*>(dst), std::span<Dim>(dims.data(), n));
  });
}

void copy_strided_reference(const std::byte* src, std::span<const std::int64_t> src_strides, std::byte* dst,
                            std::span<const std::int64_t> dst_strides, std::span<const std::int64_t> shape,
                            std::size_t itemsize) {
  check_ranks(src_strides, dst_strides, shape);
  for (std::int64_t size : shape)
    if (size == 0) return;
  std::vector<std::int64_t> idx(shape.size(), 0);
  while (true) {
    std::int64_t s = 0, d = 0;
    for (std::size_t i = 0; i < shape.size(); ++i) {
      s += idx[i] * src_strides[i];
      d += idx[i] * dst_strides[i];
    }
    std::memcpy(dst + d * static_cast<std::int64_t>(itemsize), src + s * static_cast<std::int64_t>(itemsize), itemsize);
    std::size_t i = shape.size();
    while (i > 0 && ++idx[i - 1] == shape[i - 1]) idx[--i] = 0;
    if (i == 0) return;
  }
}

}  // namespace dtensor::cpu
