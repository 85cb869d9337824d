#pragma once
// Internal to the backends: int64 Avg computed exactly. Summing the values
// first overflows where the average still fits (2^62 on 4 ranks gave 0), so
// each backend runs an int64 Avg over two or more ranks
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

#include "dtensor/core/reduction_bytes.h"
#include "dtensor/mesh/communicator.h"

namespace dtensor::backend_detail {

/// The int64 Avg call whose pairs this thread is reducing now (null: none).
/// A backend describes the inner Sum, for its mismatch check, as this call
/// (op Avg, the caller's count or counts): otherwise a peer's real Sum of
/// the doubled count would pass for the same call.
struct CarriedAverage {
  std::size_t count = 0;                // all_reduce: the caller's count
  std::span<const std::size_t> counts;  // reduce_scatter: the caller's counts
};
const CarriedAverage* carried_average();

/// comm.all_reduce(send, recv, count, Int64, Avg), exactly.
void all_reduce_integer_average(Communicator& comm, const void* send, void* recv, std::size_t count);
/// comm.reduce_scatter(send, recv, counts, Int64, Avg), exactly.
void reduce_scatter_integer_average(Communicator& comm, const void* send, void* recv,
                                    std::span<const std::size_t> counts);

}  // namespace dtensor::backend_detail
