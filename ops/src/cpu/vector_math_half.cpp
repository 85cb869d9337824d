// The CPU's vectorised elementwise math (vector_math.h) for bf16 and f16:
// the conversions to and from f32, and the unary functions on bf16 arrays,
// computed in f32 registers by the kernels of vector_math-inl.h (gelu of big
// arrays by table). Compiled once per SIMD target and dispatched at run time
// as vector_math.cpp is.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/vector_math_half.cpp"
#include "dtensor/core/detail/strided_copy.h"

#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/cache_control.h>
#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "dtensor/core/half.h"
#include "dtensor/ops/detail/vector_math.h"

HWY_BEFORE_NAMESPACE();
namespace dtensor::cpu::vmath::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#include "vector_math-inl.h"

// bf16 <-> f32 for the kernels that compute bf16 in f32 blocks. Widening is
// exact (the bf16 bits are the top half of the f32's); narrowing rounds to
// nearest even and keeps NaN a quiet NaN, as bfloat16(float) in half.h.
HWY_NOINLINE void Bf16ToF32(const std::uint16_t* x, float* y, std::int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<std::uint16_t, decltype(df)> d16;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  std::int64_t i = 0;
  for (; i + N <= n; i += N)
    hn::StoreU(hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, x + i)))), df, y + i);
  for (; i < n; ++i) {
    const std::uint32_t u = static_cast<std::uint32_t>(x[i]) << 16;
    std::memcpy(y + i, &u, sizeof u);
  }
}

HWY_NOINLINE void F32ToBf16(const float* x, std::uint16_t* y, std::int64_t n) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<std::uint16_t, decltype(df)> d16;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  const auto one = hn::Set(di, 1), half = hn::Set(di, 0x7fff), quiet = hn::Set(di, 0x40);
  const auto abs_mask = hn::Set(di, 0x7fffffff), inf = hn::Set(di, 0x7f800000);
  std::int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto u = hn::BitCast(di, hn::LoadU(df, x + i));
    // Logical shifts of the bits as unsigned: the sign bit must not spread.
    const auto hi = hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(hn::RebindToUnsigned<decltype(df)>(), u)));
    const auto sum = hn::Add(u, hn::Add(half, hn::And(hi, one)));
    const auto rounded = hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(hn::RebindToUnsigned<decltype(df)>(), sum)));
    const auto nan = hn::Gt(hn::And(u, abs_mask), inf);
    hn::StoreU(hn::DemoteTo(d16, hn::IfThenElse(nan, hn::Or(hi, quiet), rounded)), d16, y + i);
  }
  for (; i < n; ++i) {
    std::uint32_t u;
    std::memcpy(&u, x + i, sizeof u);
    const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    y[i] = static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : rounded);
  }
}

// bf16 in and out through the f32 body, converted in registers rather than
// through a buffer: a vector of 2N bf16 is two f32 vectors, its even
// elements (each bf16's bits are the top half of its f32: shifted up) and
// its odd ones (already in the top halves: masked), and the two results go
// back to the same lanes, rounded as bfloat16(float) rounds (F32ToBf16):
// to nearest even, which on the two results' halves regrouped as 16-bit
// lanes (tops in place, bottoms beside them) is top + 1 where bottom + the
// top's lowest bit > 0x8000; a NaN keeps its top half with the quiet bit
// set. Which NaN an op returns when both operands are NaN depends on the
// operand order the compiler chose in that copy of the body, so a pair with
// a NaN result is computed again by the f32 kernel itself (ApplyT): bit for
// bit what Bf16ToF32, apply and F32ToBf16 give.
template <class DH, class VF>
HWY_INLINE hn::Vec<DH> RoundPairToBf16(DH dh, VF ye, VF yo) {
  const hn::RebindToUnsigned<hn::DFromV<VF>> du;
  const auto round = [&](VF v) {
    const auto bits = hn::BitCast(du, v);
    return hn::Add(bits, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u))));
  };
  return hn::OddEven(hn::BitCast(dh, round(yo)), hn::BitCast(dh, hn::ShiftRight<16>(round(ye))));
}

template <class DH, class VF>
HWY_NOINLINE hn::Vec<DH> RoundPairToBf16WithNaN(DH dh, Fn fn, VF xe, VF xo) {
  const hn::DFromV<VF> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const std::size_t N = hn::Lanes(df);
  HWY_ALIGN float buf[2 * hn::MaxLanes(df)];
  hn::Store(xe, df, buf);
  hn::Store(xo, df, buf + N);
  ApplyT(fn, buf, buf, static_cast<std::int64_t>(2 * N));
  const VF ye = hn::Load(df, buf), yo = hn::Load(df, buf + N);
  const auto quiet_top = [&](VF v) { return hn::Or(hn::BitCast(du, v), hn::Set(du, 0x00400000u)); };
  const auto te = hn::BitCast(dh, hn::ShiftRight<16>(quiet_top(ye)));
  const auto nan = hn::OddEven(hn::BitCast(dh, quiet_top(yo)), te);
  const auto nan_mask = hn::OddEven(hn::BitCast(dh, hn::VecFromMask(du, hn::RebindMask(du, hn::IsNaN(yo)))),
                                    hn::BitCast(dh, hn::VecFromMask(du, hn::RebindMask(du, hn::IsNaN(ye)))));
  return hn::IfThenElse(hn::MaskFromVec(nan_mask), nan, RoundPairToBf16(dh, ye, yo));
}

template <class DH, class VH, class Body>
HWY_INLINE VH Bf16Pair(DH dh, VH w, Fn fn, Body body) {
  const hn::Repartition<float, DH> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const auto wu = hn::BitCast(du, w);
  const auto xe = hn::BitCast(df, hn::ShiftLeft<16>(wu));
  const auto xo = hn::BitCast(df, hn::And(wu, hn::Set(du, 0xffff0000u)));
  const auto ye = body(df, xe), yo = body(df, xo);
  if (HWY_UNLIKELY(!hn::AllFalse(df, hn::Or(hn::IsNaN(ye), hn::IsNaN(yo)))))
    return RoundPairToBf16WithNaN(dh, fn, xe, xo);
  return RoundPairToBf16(dh, ye, yo);
}

#if HWY_NATIVE_FMA
// gelu's pairs whose lanes are all central (nearly all) skip the NaN test:
// GeluCentral's results are finite. The others take the general pair, which
// gives the central lanes the same values (Gelu selects per lane).
template <class DH, class VH>
HWY_INLINE VH GeluBf16Pair(DH dh, VH w) {
  const hn::Repartition<float, DH> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const auto wu = hn::BitCast(du, w);
  const auto xe = hn::BitCast(df, hn::ShiftLeft<16>(wu));
  const auto xo = hn::BitCast(df, hn::And(wu, hn::Set(du, 0xffff0000u)));
  const auto ue = hn::Abs(xe), uo = hn::Abs(xo);
  if (HWY_LIKELY(hn::AllTrue(df, hn::Lt(hn::Max(ue, uo), hn::Set(df, kGeluCentralEnd)))))
    return RoundPairToBf16(dh, GeluCentral(df, xe, ue), GeluCentral(df, xo, uo));
  return Bf16Pair(
      dh, w, Fn::Gelu, [](auto d, auto v) __attribute__((always_inline)) { return Gelu(d, v); });
}
#endif

#if HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR
// bf16 gelu of big arrays by table: a bf16 input has 65536 values, so the
// results of all of them (computed once per SIMD target by the pair path
// above, which the tests hold bit for bit to widening, the f32 kernel and
// rounding) are gathered instead of computed, the same bits at a fraction
// of the cost (activations take few distinct values, so the gathers mostly
// hit L1). 256 KiB per target, built on first use; arrays below
// kGeluTableMin elements, which would not pay for building it, compute.
constexpr std::int64_t kGeluTableMin = 16384;

HWY_INLINE void GeluBf16Direct(const std::uint16_t* x, std::uint16_t* y, std::int64_t n) {
  ForEachVector(
      x, y, n, [](auto dh, auto w) __attribute__((always_inline)) { return GeluBf16Pair(dh, w); });
}

HWY_NOINLINE const std::int32_t* GeluBf16Table() {
  static const std::vector<std::int32_t> table = [] {
    std::vector<std::uint16_t> bits(65536);
    for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<std::uint16_t>(i);
    GeluBf16Direct(bits.data(), bits.data(), 65536);
    return std::vector<std::int32_t>(bits.begin(), bits.end());
  }();
  return table.data();
}

HWY_NOINLINE void GeluBf16ByTable(const std::uint16_t* x, std::uint16_t* y, std::int64_t n) {
  const std::int32_t* table = GeluBf16Table();
  const hn::ScalableTag<std::uint16_t> dh;
  const hn::Repartition<std::int32_t, decltype(dh)> di;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(dh));
  std::int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto w = hn::BitCast(di, hn::LoadU(dh, x + i));
    const auto even = hn::GatherIndex(di, table, hn::And(w, hn::Set(di, 0xffff)));
    const auto odd =
        hn::GatherIndex(di, table,
                        hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(hn::RebindToUnsigned<decltype(di)>(), w))));
    hn::StoreU(hn::OddEven(hn::BitCast(dh, hn::ShiftLeft<16>(odd)), hn::BitCast(dh, even)), dh, y + i);
  }
  for (; i < n; ++i) y[i] = static_cast<std::uint16_t>(table[x[i]]);
}
#endif

HWY_NOINLINE void ApplyBf16(Fn fn, const std::uint16_t* x, std::uint16_t* y, std::int64_t n) {
#if HWY_TARGET == HWY_SCALAR
  // One lane: no pair of f32 vectors in a bf16 one. Blocks through a buffer.
  constexpr std::int64_t kBlock = 256;
  float buf[kBlock];
  for (std::int64_t i = 0; i < n; i += kBlock) {
    const std::int64_t m = std::min(kBlock, n - i);
    Bf16ToF32(x + i, buf, m);
    ApplyT(fn, buf, buf, m);
    F32ToBf16(buf, y + i, m);
  }
#else
#if HWY_NATIVE_FMA && HWY_TARGET != HWY_SCALAR
  if (fn == Fn::Gelu) return n >= kGeluTableMin ? GeluBf16ByTable(x, y, n) : GeluBf16Direct(x, y, n);
#endif
  WithBody(fn, [&](auto body) {
    ForEachVector(
        x, y, n, [ fn, body ](auto dh, auto w) __attribute__((always_inline)) { return Bf16Pair(dh, w, fn, body); });
  });
#endif
}

// f16 <-> f32 likewise, with the hardware's conversions where Highway has
// them (F16C, on its AVX2 and AVX-512 targets; the others convert one value
// at a time, as float16 does). The hardware rounds to nearest even as
// float16(float) does; only NaN differs (it keeps the payload), so NaN
// lanes are first made the quiet NaN that converts to float16's +-0x7e00.
HWY_NOINLINE void F16ToF32(const std::uint16_t* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  for (; i + N <= n; i += N)
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(x + i))), df, y + i);
#endif
  for (; i < n; ++i) y[i] = static_cast<float>(float16::from_bits(x[i]));
}

HWY_NOINLINE void F32ToF16(const float* x, std::uint16_t* y, std::int64_t n) {
  std::int64_t i = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(df));
  const auto sign = hn::Set(du, 0x80000000u), quiet = hn::Set(du, 0x7fc00000u);
  for (; i + N <= n; i += N) {
    const auto v = hn::LoadU(df, x + i);
    const auto canonical = hn::BitCast(df, hn::Or(hn::And(hn::BitCast(du, v), sign), quiet));
    hn::StoreU(hn::DemoteTo(dh, hn::IfThenElse(hn::IsNaN(v), canonical, v)), dh,
               reinterpret_cast<hwy::float16_t*>(y + i));
  }
#endif
  for (; i < n; ++i) y[i] = float16(x[i]).bits;
}

}  // namespace dtensor::cpu::vmath::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace dtensor::cpu::vmath {

HWY_EXPORT(Bf16ToF32);
HWY_EXPORT(F32ToBf16);
HWY_EXPORT(ApplyBf16);
HWY_EXPORT(F16ToF32);
HWY_EXPORT(F32ToF16);

void bf16_to_f32(const std::uint16_t* x, float* y, std::int64_t n) { HWY_DYNAMIC_DISPATCH(Bf16ToF32)(x, y, n); }
void f32_to_bf16(const float* x, std::uint16_t* y, std::int64_t n) { HWY_DYNAMIC_DISPATCH(F32ToBf16)(x, y, n); }
void apply_bf16(Fn fn, const std::uint16_t* x, std::uint16_t* y, std::int64_t n) {
  HWY_DYNAMIC_DISPATCH(ApplyBf16)(fn, x, y, n);
}

void f16_to_f32(const std::uint16_t* x, float* y, std::int64_t n) { HWY_DYNAMIC_DISPATCH(F16ToF32)(x, y, n); }
void f32_to_f16(const float* x, std::uint16_t* y, std::int64_t n) { HWY_DYNAMIC_DISPATCH(F32ToF16)(x, y, n); }

}  // namespace dtensor::cpu::vmath
#endif  // HWY_ONCE
