#pragma once
// The collectives bench/collectives times, their names and nccl-tests'
// bus-bandwidth factors, shared by its threads mode (collectives.cpp) and
// its MPI mode (collectives_mpi.cpp) so that both tables read alike.
#include <string_view>

namespace dtensor::bench {

enum class Coll { AllGather, AllReduce, ReduceScatter, AllToAll };
inline constexpr Coll kColls[] = {Coll::AllGather, Coll::AllReduce, Coll::ReduceScatter, Coll::AllToAll};

inline std::string_view name(Coll c) {
  switch (c) {
    case Coll::AllGather: return "all_gather";
    case Coll::AllReduce: return "all_reduce";
    case Coll::ReduceScatter: return "reduce_scatter";
    case Coll::AllToAll: return "all_to_all";
  }
  return "?";
}

/// busbw = algbw * factor: (n-1)/n, and 2(n-1)/n for all_reduce.
inline double bus_factor(Coll c, int n) {
  const double f = static_cast<double>(n - 1) / n;
  return c == Coll::AllReduce ? 2 * f : f;
}

}  // namespace dtensor::bench
