#include "dtensor/core/reduction_bytes.h"

#include "dtensor/core/shape.h"

namespace dtensor {

std::int64_t all_reduce_recv_bytes(std::int64_t count, std::int64_t n, std::int64_t index, DType dtype, ReduceOp op) {
  const std::int64_t wire = checked_mul(count, reduction_wire_factor(dtype, op, n), "all_reduce elements on the wire");
  return checked_mul(all_reduce_recv_count(wire, n, index), static_cast<std::int64_t>(itemsize(dtype)),
                     "all_reduce bytes received");
}

std::int64_t reduce_scatter_recv_bytes(std::int64_t mine, std::int64_t n, DType dtype, ReduceOp op) {
  const std::int64_t wire =
      checked_mul(mine, reduction_wire_factor(dtype, op, n), "reduce_scatter elements on the wire");
  return checked_mul(reduce_scatter_recv_count(wire, n), static_cast<std::int64_t>(itemsize(dtype)),
                     "reduce_scatter bytes received");
}

}  // namespace dtensor
