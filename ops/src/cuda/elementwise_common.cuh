#pragma once
// Internal, CUDA sources only (pointwise_kernels.cu, reduction_kernels.cu):
// the storage type of each dtype on the device, the type it computes in
// (f32 for bf16 and f16, as the CPU upcasts them), loads and rounded
// stores, and the host-side visitor that picks the storage type. Include it
// first: fmt 9 turns constexpr off under nvcc but keeps its consteval
// format checks, which then fail in C++20; with constexpr on both compile
// (the build passes the same define to every CUDA source).
#ifndef FMT_USE_CONSTEXPR
#define FMT_USE_CONSTEXPR 1
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include <fmt/format.h>

#include "dtensor/core/detail/cuda_check.h"
#include "dtensor/core/dtype.h"
#include "dtensor/core/error.h"
#include "dtensor/core/tensor.h"

namespace dtensor::cuda_kernels::detail {

template <class T>
struct Tag {
  using type = T;
};

/// Calls fn(Tag<T>{}) with T the device storage type of `dtype`.
template <class Fn>
decltype(auto) visit_device_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float32: return fn(Tag<float>{});
    case DType::Float64: return fn(Tag<double>{});
    case DType::Int64: return fn(Tag<std::int64_t>{});
    case DType::BFloat16: return fn(Tag<__nv_bfloat16>{});
    case DType::Float16: return fn(Tag<__half>{});
  }
  throw Error(fmt::format("[cuda] internal: unknown dtype {}", static_cast<int>(dtype)));
}

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

/// The type a kernel computes T in.
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

template <class T>
__device__ __forceinline__ compute_t<T> load(const T* p, std::int64_t i) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(p[i]);
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(p[i]);
  else
    return p[i];
}

/// Rounds a compute value to the storage type (nearest even for bf16/f16).
template <class T>
__device__ __forceinline__ T store_as(compute_t<T> v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(v);
  else
    return v;
}

/// Throws ValueError unless every tensor given is defined and on CUDA.
inline void require_cuda(const char* op, std::initializer_list<const Tensor*> tensors) {
  int i = 0;
  for (const Tensor* t : tensors) {
    if (t->defined() && t->device() != Device::CUDA)
      throw ValueError(fmt::format("[{}] input {} is on {}; expected every input on cuda", op, i, t->device()));
    ++i;
  }
}

inline void check_launch() { DTENSOR_CUDA_CHECK(cudaGetLastError()); }

}  // namespace dtensor::cuda_kernels::detail
