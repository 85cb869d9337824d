#pragma once
// The CPU memory behind tensors. Blocks of 128 KiB or more are mapped from
// the system directly (not from malloc's arenas, which keep what every rank
// thread ever freed) and rounded to size classes an eighth of a power of two
// apart; a freed block is kept for the next request of its class, on any
// thread, so that steady loops reuse memory whose pages are already mapped.
// The free blocks kept never exceed the larger of the bytes in use (or 64
// MiB when less is in use) and what each size class needs to reach its own
// peak again, the latter up to twice the program's peak in use; nor the
// limit (1 GiB unless DTENSOR_HOST_CACHE_MB or set_host_cache_limit says
// otherwise): resident memory stays within about twice the live tensor
// bytes or twice the program's own peak. The per-class room keeps a
// training step's blocks for the next step, which maps no new page.
// Smaller blocks come from the heap.
#include <cstddef>
#include <cstdint>

namespace dtensor {

struct HostMemoryStats {
  std::uint64_t hits = 0;        // big requests served from the cache
  std::uint64_t misses = 0;      // big requests mapped afresh
  std::uint64_t releases = 0;    // cached blocks given back to the system
  std::size_t bytes_in_use = 0;  // big blocks held by tensors (class sizes)
  std::size_t peak_bytes_in_use = 0;
  std::size_t bytes_cached = 0;  // big blocks kept free
  std::size_t limit = 0;         // the bound on bytes_cached
};
HostMemoryStats host_memory_stats();

/// Gives every cached free block back to the system, and asks the heap to
/// return the free memory of its arenas.
void release_host_memory();

/// The most free bytes the cache keeps, from 0 (cache nothing) to 1 TiB;
/// ValueError naming the value otherwise. Cached blocks beyond it are
/// released at once.
void set_host_cache_limit(std::size_t bytes);

/// This process's resident memory now, in bytes (Linux: /proc/self/statm;
/// 0 where it cannot be read), for benchmarks and tests that bound it.
std::size_t resident_bytes();

}  // namespace dtensor
