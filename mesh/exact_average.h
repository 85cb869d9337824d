#pragma once
// Internal to the backends: int64 Avg computed exactly. Summing the values
// first overflows where the average still fits (2^62 on 4 ranks gave 0), so
// each backend runs an int64 Avg as one Sum collective, over the same ranks,
// of the pairs (x / n, x % n) that libdtensor/core/combine.h defines, and
// rebuilds sum / n (rounded toward zero) from the summed pairs. The pairs
// take twice the bytes of the plain collective; the stats still count the
// call that was asked for, as every backend does (communicator.h), so that
// the planner's byte counts stay exact: on MPI and NCCL the wire carries
// twice what they say for an int64 Avg.
#include <cstddef>
#include <span>

#include "dtensor/core/dtype.h"
#include "dtensor/core/reduce_op.h"
#include "dtensor/mesh/communicator.h"

namespace dtensor::backend_detail {

/// Whether (dtype, op) takes the exact path below.
inline bool integer_average(DType dtype, ReduceOp op) { return dtype == DType::Int64 && op == ReduceOp::Avg; }

/// comm.all_reduce(send, recv, count, Int64, Avg), exactly.
void all_reduce_integer_average(Communicator& comm, const void* send, void* recv, std::size_t count);
/// comm.reduce_scatter(send, recv, counts, Int64, Avg), exactly.
void reduce_scatter_integer_average(Communicator& comm, const void* send, void* recv,
                                    std::span<const std::size_t> counts);

}  // namespace dtensor::backend_detail
