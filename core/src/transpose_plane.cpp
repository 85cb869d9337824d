// transpose_plane (transpose_plane.h) at the CPU's widest SIMD: Highway
// compiles this file once per target (foreach_target.h re-includes it) and
// HWY_DYNAMIC_DISPATCH picks the widest the CPU supports on first use. The
// shuffles are GCC generic vectors of that target's width (see
// transpose_plane-inl.h); Highway gives the dispatch and the non-temporal
// stores (Stream). On an AVX-512 Xeon, 4096x1024 transposes against the
// 16-byte blocks with plain stores, in one run: each alone was worth little
// (streaming 16-byte blocks 0.9-1.0x, 64-byte blocks with plain stores
// 0.7-1.3x), both together 1.5-2x for f32 and 2-4x for bf16.
// The Highway targets compiled are set once, in libdtensor/meson.build.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "transpose_plane.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "transpose_plane.h"

HWY_BEFORE_NAMESPACE();
namespace dtensor::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// A tile row (kTileBytes, a multiple of every target's vector) written with
// non-temporal stores where asked and the destination is aligned for them.
struct RowStore {
  bool stream;
  void operator()(const void* from, void* to, std::int64_t bytes) const {
    const hn::ScalableTag<std::uint8_t> du;
    const auto n = static_cast<std::int64_t>(hn::Lanes(du));
    if (!stream || reinterpret_cast<std::uintptr_t>(to) % static_cast<std::uintptr_t>(n) != 0) {
      std::memcpy(to, from, static_cast<std::size_t>(bytes));
      return;
    }
    const auto* f = static_cast<const std::uint8_t*>(from);
    auto* t = static_cast<std::uint8_t*>(to);
    for (std::int64_t i = 0; i < bytes; i += n) hn::Stream(hn::LoadU(du, f + i), du, t + i);
  }
};

#include "transpose_plane-inl.h"

// Generic vectors wider than 64 bytes buy nothing here (and targets report
// at least 16).
constexpr int kVectorBytes = std::clamp(HWY_MAX_BYTES, 16, 64);

void TransposePlane(const std::byte* s, std::int64_t sb, std::byte* d, std::int64_t da, std::int64_t na,
                    std::int64_t nb, std::size_t itemsize, bool stream) {
  transpose_plane_bytes<kVectorBytes>(s, sb, d, da, na, nb, itemsize, RowStore{stream});
  if (stream) hwy::FlushStream();
}

}  // namespace dtensor::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dtensor::cpu {

HWY_EXPORT(TransposePlane);

void transpose_plane(const std::byte* s, std::int64_t sb, std::byte* d, std::int64_t da, std::int64_t na,
                     std::int64_t nb, std::size_t itemsize, bool stream) {
  HWY_DYNAMIC_DISPATCH(TransposePlane)(s, sb, d, da, na, nb, itemsize, stream);
}

}  // namespace dtensor::cpu
#endif  // HWY_ONCE
