#pragma once
// The bytes a reducing collective (all_reduce, reduce_scatter) of a dtype
// and reduce op moves: the one rule behind every backend's byte counters
// (mesh/communicator.h) and the planner's prices, so that a plan's bytes,
// the counters and the wire agree.
//
// Every reduction carries its elements as they are, except an int64 Avg over
// two or more ranks: summing the values first would overflow where the
// average still fits, so every backend runs it as one Sum of 2 * count
// int64, the pairs (x / n, x % n) (mesh/src/exact_average.h), which moves twice
// the bytes of the same call in int64 Sum or f64. Over one rank nothing moves
// and no pairs are formed.
#include <cstdint>

#include "dtensor/core/dtype.h"
#include "dtensor/core/reduce_op.h"

namespace dtensor {

/// Whether a reduction of (dtype, op) over n ranks runs as the Sum of the
/// exact-average pairs: int64 Avg with n >= 2.
inline bool reduces_as_average_pairs(DType dtype, ReduceOp op, std::int64_t n) {
  return dtype == DType::Int64 && op == ReduceOp::Avg && n > 1;
}

/// Elements of `dtype` on the wire per element reduced: 2 for the pairs, else 1.
inline std::int64_t reduction_wire_factor(DType dtype, ReduceOp op, std::int64_t n) {
  return reduces_as_average_pairs(dtype, op, n) ? 2 : 1;
}

/// Bytes rank `index` of an n-rank group receives in an all_reduce of `count`
/// elements of (dtype, op): all_reduce_recv_count (core/shape.h) of the
/// elements on the wire, times the itemsize. ShapeError where it overflows.
std::int64_t all_reduce_recv_bytes(std::int64_t count, std::int64_t n, std::int64_t index, DType dtype, ReduceOp op);

/// Bytes each rank receives in a reduce_scatter of (dtype, op) that leaves it
/// `mine` elements: reduce_scatter_recv_count of the elements on the wire,
/// times the itemsize.
std::int64_t reduce_scatter_recv_bytes(std::int64_t mine, std::int64_t n, DType dtype, ReduceOp op);

}  // namespace dtensor
