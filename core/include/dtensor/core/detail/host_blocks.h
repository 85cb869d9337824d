#pragma once
// Internal: the allocator behind Tensor storage on the CPU (its policy is in
// dtensor/core/host_memory.h). Why map big blocks directly: glibc serves a
// freed big block's size from its arenas afterwards (its mmap threshold
// rises to the largest size freed, up to 32 MiB), and an arena returns
// memory only from its top, so 8 rank threads allocating shards of changing
// sizes held 30-60x their live bytes. Why cache them: a fresh mapping
// page-faults on every 4 KiB (16 MiB: 4096 faults, about as long as the
// kernel that fills it). Thread-safe: a block may be freed on any thread.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "dtensor/core/host_memory.h"

namespace dtensor::host_blocks {

inline constexpr std::size_t kMinCachedBytes = std::size_t{128} << 10;
inline constexpr std::size_t kHostCacheBytes = std::size_t{1} << 30;  // the default limit
inline constexpr std::size_t kCacheFloorBytes = std::size_t{64} << 20;
inline constexpr std::size_t kMaxLimitBytes = std::size_t{1} << 40;
inline constexpr std::size_t kAlignment = 64;

/// At least `bytes` (a valid unique pointer for 0), 64-byte aligned, freed
/// (or cached) when the last owner lets go; std::bad_alloc when the system
/// has no memory even after the cache was emptied.
std::shared_ptr<std::byte[]> allocate(std::size_t bytes);

/// The size class of a big request (>= kMinCachedBytes): at most 1/8 more.
std::size_t class_size(std::size_t bytes);

using Stats = HostMemoryStats;
Stats stats();

}  // namespace dtensor::host_blocks
