#pragma once
// Host-side storage types for the 16-bit floating dtypes. They hold the bit
// pattern the GPU uses (bfloat16: the top half of an IEEE binary32;
// float16: IEEE binary16) and convert to and from float with
// round-to-nearest-even, as CUDA's __float2bfloat16 and __float2half do.
// The CPU computes with them in float: a kernel that takes bf16 or f16
// upcasts its inputs, computes in f32 and rounds its output once (see
// ops/src/dispatch.cpp), which is how PyTorch's CPU kernels treat them too.
#include <cstdint>
#include <cstring>

// The same conversions compile for the device in .cu files, so that the CPU
// and the GPU round identically.
#if defined(__CUDACC__)
#define DTENSOR_HOST_DEVICE __host__ __device__
#else
#define DTENSOR_HOST_DEVICE
#endif

namespace dtensor {

namespace half_detail {
DTENSOR_HOST_DEVICE inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
DTENSOR_HOST_DEVICE inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace half_detail

struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  DTENSOR_HOST_DEVICE explicit bfloat16(float f) {
    const std::uint32_t u = half_detail::float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet and a NaN
      bits = static_cast<std::uint16_t>((u >> 16) | 0x40u);
      return;
    }
    const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    bits = static_cast<std::uint16_t>((u + rounding) >> 16);
  }
  DTENSOR_HOST_DEVICE explicit bfloat16(double d) : bfloat16(static_cast<float>(d)) {}
  DTENSOR_HOST_DEVICE explicit bfloat16(std::int64_t i) : bfloat16(static_cast<float>(i)) {}
  DTENSOR_HOST_DEVICE explicit operator float() const {
    return half_detail::bits_float(static_cast<std::uint32_t>(bits) << 16);
  }
  DTENSOR_HOST_DEVICE explicit operator double() const { return static_cast<float>(*this); }
  DTENSOR_HOST_DEVICE static bfloat16 from_bits(std::uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
};

struct float16 {
  std::uint16_t bits = 0;

  float16() = default;
  DTENSOR_HOST_DEVICE explicit float16(float f) : bits(from_float(f)) {}
  DTENSOR_HOST_DEVICE explicit float16(double d) : float16(static_cast<float>(d)) {}
  DTENSOR_HOST_DEVICE explicit float16(std::int64_t i) : float16(static_cast<float>(i)) {}
  DTENSOR_HOST_DEVICE explicit operator float() const { return to_float(bits); }
  DTENSOR_HOST_DEVICE explicit operator double() const { return static_cast<float>(*this); }
  DTENSOR_HOST_DEVICE static float16 from_bits(std::uint16_t b) {
    float16 h;
    h.bits = b;
    return h;
  }

 private:
  DTENSOR_HOST_DEVICE static std::uint16_t from_float(float f) {
    const std::uint32_t u = half_detail::float_bits(f);
    const std::uint32_t sign = (u >> 16) & 0x8000u;
    const std::uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
    if (abs < 0x38800000u) {
      // Subnormal or zero in half: scale by 2^24 and round to an integer
      // count of the smallest subnormal (2^-24), ties to even.
      if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half the smallest: +-0
      const std::uint32_t exp = abs >> 23;
      const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
      const int shift = 126 - static_cast<int>(exp);  // 14..24 for these exponents
      std::uint32_t q = mant >> shift;
      const std::uint32_t rem = mant & ((1u << shift) - 1u);
      const std::uint32_t half = 1u << (shift - 1);
      if (rem > half || (rem == half && (q & 1u))) ++q;
      return static_cast<std::uint16_t>(sign | q);
    }
    // Normal: rebias the exponent (127 -> 15) and round the mantissa from 23
    // to 10 bits, ties to even; a carry may round up into the exponent.
    std::uint32_t v = abs - 0x38000000u;  // exponent - 112
    const std::uint32_t rounding = 0xfffu + ((v >> 13) & 1u);
    v = (v + rounding) >> 13;
    return static_cast<std::uint16_t>(sign | v);
  }
  DTENSOR_HOST_DEVICE static float to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu) return half_detail::bits_float(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
      if (mant == 0) return half_detail::bits_float(sign);
      // Subnormal: mant * 2^-24.
      const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
      return sign ? -v : v;
    }
    return half_detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
};

}  // namespace dtensor
