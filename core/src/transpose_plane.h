#pragma once
// Internal: the tiled transpose behind copy_strided (strided_copy.cpp), the
// one part of that copy worth vectorising. With Google Highway it is
// compiled once per SIMD target and the widest one the CPU has is chosen at
// run time (transpose_plane.cpp); without it, at 16-byte vectors
// (transpose_plane_fallback.cpp).
#include <cstddef>
#include <cstdint>

namespace dtensor::cpu {

/// d[i * da + j] = s[j * sb + i] for i < na, j < nb, in elements of
/// `itemsize` bytes (1, 2, 4 or 8): the plane of a copy whose source is
/// contiguous along i and whose destination is contiguous along j.
/// `stream` writes the destination with non-temporal stores where the
/// build has them: for an output larger than the caches, which would
/// otherwise be read in before being overwritten.
/// @pre d and s do not overlap; sb >= na and da >= nb are not required.
void transpose_plane(const std::byte* s, std::int64_t sb, std::byte* d, std::int64_t da, std::int64_t na,
                     std::int64_t nb, std::size_t itemsize, bool stream);

}  // namespace dtensor::cpu
