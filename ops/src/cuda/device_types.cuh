#pragma once
// Internal to the .cu files of the einsum, shape and embedding families: the
// device type of each dtype, the type it is computed in, and dispatch on a
// dtype or on an element size.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include <fmt/format.h>

#include "dtensor/core/dtype.h"
#include "dtensor/core/error.h"

namespace dtensor::cuda_kernels::device {

/// How a kernel computes with T: bf16 and f16 in f32, rounded to nearest
/// even once on the way out (as the CPU's upcasting path does); the others
/// in themselves.
template <class T>
struct Compute {
  using type = T;
  __device__ static type load(T x) { return x; }
  __device__ static T store(type v) { return v; }
};
template <>
struct Compute<__nv_bfloat16> {
  using type = float;
  __device__ static float load(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Compute<__half> {
  using type = float;
  __device__ static float load(__half x) { return __half2float(x); }
  __device__ static __half store(float v) { return __float2half_rn(v); }
};

/// Calls fn(static_cast<T*>(nullptr)) with T the device type of `dtype`.
template <class Fn>
void visit(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float32: fn(static_cast<float*>(nullptr)); return;
    case DType::Float64: fn(static_cast<double*>(nullptr)); return;
    case DType::Int64: fn(static_cast<long long*>(nullptr)); return;
    case DType::BFloat16: fn(static_cast<__nv_bfloat16*>(nullptr)); return;
    case DType::Float16: fn(static_cast<__half*>(nullptr)); return;
  }
  throw DTypeError(fmt::format("[cuda] unknown dtype {}", static_cast<int>(dtype)));
}

/// Calls fn(static_cast<U*>(nullptr)) with U an unsigned integer of
/// `itemsize` bytes: kernels that only move elements.
template <class Fn>
void visit_bits(std::size_t itemsize, Fn&& fn) {
  switch (itemsize) {
    case 1: fn(static_cast<std::uint8_t*>(nullptr)); return;
    case 2: fn(static_cast<std::uint16_t*>(nullptr)); return;
    case 4: fn(static_cast<std::uint32_t*>(nullptr)); return;
    case 8: fn(static_cast<unsigned long long*>(nullptr)); return;
    default: break;
  }
  throw Error(fmt::format("[cuda] internal: no element type of {} bytes", itemsize));
}

}  // namespace dtensor::cuda_kernels::device
