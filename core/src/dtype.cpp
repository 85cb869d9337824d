#include "dtensor/core/dtype.h"

#include <array>
#include <string>

#include "dtensor/core/error.h"
#include "dtensor/core/reduce_op.h"

namespace dtensor {

std::size_t itemsize(DType dtype) {
  switch (dtype) {
    case DType::Float32: return 4;
    case DType::Float64: return 8;
    case DType::Int64: return 8;
    case DType::BFloat16: return 2;
    case DType::Float16: return 2;
  }
  throw ValueError(fmt::format("[dtype] unknown dtype code {}", static_cast<int>(dtype)));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "f32";
    case DType::Float64: return "f64";
    case DType::Int64: return "i64";
    case DType::BFloat16: return "bf16";
    case DType::Float16: return "f16";
  }
  return "?";
}

DType parse_dtype(std::string_view text) {
  struct Name {
    std::string_view a, b;
    DType dtype;
  };
  static constexpr std::array<Name, 5> kNames{{{"f32", "float32", DType::Float32},
                                               {"f64", "float64", DType::Float64},
                                               {"i64", "int64", DType::Int64},
                                               {"bf16", "bfloat16", DType::BFloat16},
                                               {"f16", "float16", DType::Float16}}};
  for (const auto& n : kNames)
    if (text == n.a || text == n.b) return n.dtype;
  throw ParseError(fmt::format("[dtype] unknown dtype '{}': expected f32, f64, i64, bf16 or f16", text));
}

bool is_floating(DType dtype) { return dtype != DType::Int64; }
DType cpu_compute_dtype(DType dtype) {
  return dtype == DType::BFloat16 || dtype == DType::Float16 ? DType::Float32 : dtype;
}

std::string_view device_name(Device device) { return device == Device::CPU ? "cpu" : "cuda"; }

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view text) {
  if (text == "sum") return ReduceOp::Sum;
  if (text == "avg" || text == "mean") return ReduceOp::Avg;
  if (text == "max") return ReduceOp::Max;
  if (text == "min") return ReduceOp::Min;
  throw ParseError(fmt::format("[placement] unknown reduce op '{}': expected sum, avg, max or min", text));
}

}  // namespace dtensor
