#pragma once
// The counters every bounded per-thread cache reports (the plan cache,
// redistribute/planner.h; the propagation cache, ops/dispatch.h).
#include <cstddef>
#include <cstdint>

namespace dtensor {

/// One thread's cache: what it answered, what it dropped and what it holds.
struct CacheStats {
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t evictions = 0;  // entries dropped to stay within capacity
  std::size_t entries = 0;
  std::size_t capacity = 0;
  std::size_t bytes = 0;  // approximate: the entries' own size and the heap they hold
};

}  // namespace dtensor
