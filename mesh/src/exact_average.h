#pragma once
// Internal to the backends: int64 Avg computed exactly. Summing the values
// first overflows where the average still fits (2^62 on 4 ranks gave 0), so
// every backend (backend_communicator.cpp) runs an int64 Avg over two or more ranks
// (reduces_as_average_pairs, core/reduction_bytes.h) as one Sum collective,
// over the same ranks, of the pairs (x / n, x % n) that
// core/include/dtensor/core/detail/combine.h defines, and rebuilds sum / n (rounded toward
// zero) from the summed pairs. The pairs take twice the bytes of the plain
// collective, and the stats say so: the inner Sum call counts itself, once,
// as the kind that was asked for, receiving exactly all_reduce_recv_bytes /
// reduce_scatter_recv_bytes of the Avg call, which is what the planner
// prices a P(avg) reduction of int64 at.
#include <cstddef>
#include <span>

#include "dtensor/core/reduce_op.h"
#include "dtensor/core/reduction_bytes.h"
#include "dtensor/mesh/communicator.h"

namespace dtensor::backend_detail {

/// How a reduction describes itself to its peers' agreement check: as its
/// caller made it, or, while it is the inner Sum of an int64 Avg's pairs, as
/// that Avg call (op Avg, the caller's count or counts): otherwise a peer's
/// real Sum of the doubled count would pass for the same call.
struct CallAsMade {
  ReduceOp op;
  std::size_t count;                    // all_reduce: the elements; reduce_scatter: their total
  std::span<const std::size_t> counts;  // reduce_scatter: the per-rank counts
};
CallAsMade all_reduce_as_made(ReduceOp op, std::size_t count);
CallAsMade reduce_scatter_as_made(ReduceOp op, std::span<const std::size_t> counts);

/// comm.all_reduce(send, recv, count, Int64, Avg), exactly.
void all_reduce_integer_average(Communicator& comm, const void* send, void* recv, std::size_t count);
/// comm.reduce_scatter(send, recv, counts, Int64, Avg), exactly.
void reduce_scatter_integer_average(Communicator& comm, const void* send, void* recv,
                                    std::span<const std::size_t> counts);

}  // namespace dtensor::backend_detail
