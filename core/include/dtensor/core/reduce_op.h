#pragma once
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

namespace dtensor {

/// How the values of a Partial placement combine, and what a reducing
/// collective computes.
enum class ReduceOp : std::uint8_t { Sum, Avg, Max, Min };

/// "sum", "avg", "max", "min".
std::string_view reduce_op_name(ReduceOp op);
/// Inverse of reduce_op_name (also accepts "mean"); ParseError otherwise.
ReduceOp parse_reduce_op(std::string_view text);

}  // namespace dtensor

template <>
struct fmt::formatter<dtensor::ReduceOp> : fmt::formatter<std::string_view> {
  auto format(dtensor::ReduceOp op, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(dtensor::reduce_op_name(op), ctx);
  }
};
