#pragma once
// Internal: the one CPU kernel that copies a strided N-d region. copy_box,
// slice_box, pack_box and unpack_box (tensor.cpp) and the CPU table's
// gather_strided (permute, transpose, expand, einsum's operand permutes) all
// call it, so a faster copy is faster everywhere at once.
#include <cstddef>
#include <cstdint>
#include <span>

namespace dtensor::cpu {

/// From this many bytes of output on, CPU kernels (these copies and the
/// pointwise loops of ops/src/cpu/vector_math.cpp) write with non-temporal
/// stores: the output would not stay in L2 anyway, and a plain store first
/// reads each line in (a third of the traffic of y = a + b). Below it the
/// output stays in cache for whatever reads it next.
inline constexpr std::int64_t kStreamStoreBytes = std::int64_t{4} << 20;

/// For every index i of `shape`:
///   dst[sum_d i[d] * dst_strides[d]] = src[sum_d i[d] * src_strides[d]]
/// with strides in elements of `itemsize` bytes (1, 2, 4 or 8; the value is
/// only moved). A source stride may be 0 (broadcast); the destination
/// positions must be distinct and must not overlap the source.
/// @post the result equals the element-by-element loop above, in any order.
///
/// Dims of size 1 are dropped and dims that stay contiguous on both sides
/// are merged; then a unit-stride innermost dim is copied by memcpy, a swap
/// of the fastest source dim and the fastest destination dim (a transpose
/// or permute) goes tile by tile so that both sides stay in cache (with unit
/// strides there, transpose_plane.h: SIMD blocks, and non-temporal stores for
/// outputs of 4 MiB and more), and the rest is a plain strided loop.
void copy_strided(const std::byte* src, std::span<const std::int64_t> src_strides, std::byte* dst,
                  std::span<const std::int64_t> dst_strides, std::span<const std::int64_t> shape, std::size_t itemsize);

/// The same copy, one element at a time in index order: the reference the
/// tests hold copy_strided to.
void copy_strided_reference(const std::byte* src, std::span<const std::int64_t> src_strides, std::byte* dst,
                            std::span<const std::int64_t> dst_strides, std::span<const std::int64_t> shape,
                            std::size_t itemsize);

}  // namespace dtensor::cpu
