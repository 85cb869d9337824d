#pragma once
// The element rules of every reduction that combines two values: the local
// reduction kernels (ops/cpu, ops/cuda), the collectives of every backend
// (threads, MPI's user-defined operations, the NCCL fix-up) and the
// elementwise reduce_into the communicators share. One definition, so that a
// sharded max gives what the plain tensor's max gives, NaN included.
//
// max/min propagate NaN, as PyTorch's do: std::max and MPI_MAX, and NCCL's
// fmaxf, drop it (which of two values survives then depends on the order
// the ranks combine in).
#include <cstdint>
#include <type_traits>

#include "dtensor/core/half.h"  // DTENSOR_HOST_DEVICE
#include "dtensor/core/reduce_op.h"

namespace dtensor::combine {

/// The larger of a and b; NaN if either is NaN (b's when both are).
template <class T>
DTENSOR_HOST_DEVICE inline T max_nan(T a, T b) {
  return (b > a || b != b) ? b : a;
}
/// The smaller of a and b; NaN if either is NaN (b's when both are).
template <class T>
DTENSOR_HOST_DEVICE inline T min_nan(T a, T b) {
  return (b < a || b != b) ? b : a;
}

/// op(a, b) for a collective's op: Avg combines as Sum (the division comes
/// once, after every rank is in).
template <class T>
DTENSOR_HOST_DEVICE inline T apply(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::Max: return max_nan(a, b);
    case ReduceOp::Min: return min_nan(a, b);
    case ReduceOp::Sum:
    case ReduceOp::Avg: break;
  }
  return a + b;
}

// Integer Avg, exactly: sum / n rounded toward zero, as the integer division
// of the true sum, which may not fit in 64 bits although the average does
// (2^62 on 4 ranks). Each rank contributes the pair (x / n, x % n); the sums
// of the pairs fit (|sum of x / n| <= max |x|, |sum of x % n| < n^2), and
// the average is rebuilt from them without a wider type.

/// The pair a rank contributes for x on an n-rank average.
DTENSOR_HOST_DEVICE inline void average_split(std::int64_t x, std::int64_t n, std::int64_t* pair) {
  pair[0] = x / n;
  pair[1] = x % n;
}
/// trunc((n * pair[0] + pair[1]) / n) from the summed pair.
DTENSOR_HOST_DEVICE inline std::int64_t average_finish(const std::int64_t* pair, std::int64_t n) {
  // sum = n * t + b with |b| < n, so sum / n lies strictly between t - 1
  // and t + 1, and t itself fits (the average does); trunc moves t one
  // toward zero where b points the other way.
  const std::int64_t t = pair[0] + pair[1] / n;
  const std::int64_t b = pair[1] % n;
  return t - (t > 0 && b < 0) + (t < 0 && b > 0);
}

// Order keys, for a backend whose max/min drop NaN (NCCL's fmaxf): a
// signed integer per value that orders as max_nan / min_nan do (NaN above
// every number for max, below for min), so that the backend's integer max
// or min of the keys, turned back, is max_nan's value. +0 orders above -0.
// Bits is std::uint32_t (float) or std::uint64_t (double); the key is the
// signed integer of the same width.

template <class Bits>
DTENSOR_HOST_DEVICE inline auto order_key(Bits bits, ReduceOp op) {
  using Key = std::make_signed_t<Bits>;
  constexpr Bits kMagnitude = ~Bits(0) >> 1;  // every bit but the sign
  constexpr Bits kInfinity = sizeof(Bits) == 4 ? Bits(0x7f800000u) : Bits(0x7ff0000000000000ull);
  if ((bits & kMagnitude) > kInfinity)  // NaN
    return op == ReduceOp::Min ? Key(~kMagnitude) : Key(kMagnitude);
  const Key s = static_cast<Key>(bits);
  return s >= 0 ? s : Key(s ^ Key(kMagnitude));  // negatives: larger magnitude, smaller key
}
/// The bits of the value whose key is `key`; the NaN keys give the quiet NaN.
template <class Key>
DTENSOR_HOST_DEVICE inline auto from_order_key(Key key) {
  using Bits = std::make_unsigned_t<Key>;
  constexpr Bits kMagnitude = ~Bits(0) >> 1;
  constexpr Bits kQuietNaN = sizeof(Bits) == 4 ? Bits(0x7fc00000u) : Bits(0x7ff8000000000000ull);
  if (key == Key(kMagnitude) || key == Key(~kMagnitude)) return kQuietNaN;
  return key >= 0 ? static_cast<Bits>(key) : static_cast<Bits>(key ^ Key(kMagnitude));
}

}  // namespace dtensor::combine
