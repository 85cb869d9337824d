#pragma once
// Internal: the CPU memory behind Tensor storage. Blocks of 256 KiB or more
// are kept when freed and handed out again for a request of the same
// rounded size, so that a loop creating same-shaped big tensors (every op's
// fresh output) reuses memory whose pages are already mapped: glibc serves
// such sizes with mmap, and a fresh mapping page-faults on every 4 KiB
// (16 MiB: 4096 faults, about as long as the kernel that fills it). Freed
// blocks are cached up to kHostCacheBytes in all; beyond that they go back
// to the system. Thread-safe; smaller blocks go straight to the heap.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace dtensor::host_blocks {

inline constexpr std::size_t kMinCachedBytes = std::size_t{256} << 10;
inline constexpr std::size_t kHostCacheBytes = std::size_t{256} << 20;
inline constexpr std::size_t kAlignment = 64;

/// At least `bytes` (a valid unique pointer for 0), 64-byte aligned, freed
/// (or cached) when the last owner lets go.
std::shared_ptr<std::byte[]> allocate(std::size_t bytes);

struct Stats {
  std::uint64_t hits = 0;    // large requests served from the cache
  std::uint64_t misses = 0;  // large requests that went to the system
  std::size_t bytes_cached = 0;
};
Stats stats();

}  // namespace dtensor::host_blocks
