#pragma once
// Element types and devices. The CPU kernels compute with f32, f64 and i64
// (visit_dtype); bf16 and f16 are stored, converted and moved everywhere
// (visit_any_dtype) and computed on the CPU by upcasting to f32, on CUDA
// natively.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "dtensor/core/half.h"

#include <fmt/format.h>

namespace dtensor {

enum class DType : std::uint8_t { Float32, Float64, Int64, BFloat16, Float16 };

/// Bytes per element.
std::size_t itemsize(DType dtype);
/// Short name: "f32", "f64", "i64", "bf16", "f16".
std::string_view dtype_name(DType dtype);
/// Accepts the short names and "float32", "float64", "int64", "bfloat16",
/// "float16". Throws ParseError naming the text otherwise.
DType parse_dtype(std::string_view text);
bool is_floating(DType dtype);

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::Float32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::Float64;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::Int64;
}
template <>
constexpr DType dtype_of<bfloat16>() {
  return DType::BFloat16;
}
template <>
constexpr DType dtype_of<float16>() {
  return DType::Float16;
}

/// Calls fn(T{}) with T the C++ type of a CPU dtype; DTypeError otherwise.
template <class Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn);
/// Calls fn(T{}) for any dtype, bfloat16 and float16 included (storage,
/// conversion and comparison code).
template <class Fn>
decltype(auto) visit_any_dtype(DType dtype, Fn&& fn);
/// The dtype a CPU kernel computes a dtype in: f32 for bf16 and f16, else
/// the dtype itself.
DType cpu_compute_dtype(DType dtype);

enum class Device : std::uint8_t { CPU, CUDA };
std::string_view device_name(Device device);

}  // namespace dtensor

#include "dtensor/core/error.h"

namespace dtensor {
template <class Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::Float32: return fn(float{});
    case DType::Float64: return fn(double{});
    case DType::Int64: return fn(std::int64_t{});
    default:
      throw DTypeError(
          fmt::format("[dtype] {} has no CPU kernels in this build; expected f32, f64 or i64", dtype_name(dtype)));
  }
}
template <class Fn>
decltype(auto) visit_any_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::BFloat16: return fn(bfloat16{});
    case DType::Float16: return fn(float16{});
    default: return visit_dtype(dtype, std::forward<Fn>(fn));
  }
}
}  // namespace dtensor

template <>
struct fmt::formatter<dtensor::DType> : fmt::formatter<std::string_view> {
  auto format(dtensor::DType d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(dtensor::dtype_name(d), ctx);
  }
};
template <>
struct fmt::formatter<dtensor::Device> : fmt::formatter<std::string_view> {
  auto format(dtensor::Device d, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(dtensor::device_name(d), ctx);
  }
};
