#include "dtensor/core/detail/caching_allocator.h"

#include "dtensor/core/error.h"

namespace dtensor {
namespace {
constexpr std::size_t kSmallQuantum = 512;
constexpr std::size_t kLargeQuantum = 2u << 20;
constexpr std::size_t kSmallLimit = 1u << 20;
}  // namespace

CachingAllocator::CachingAllocator(AllocFn alloc, ReleaseFn release)
    : alloc_(std::move(alloc)), release_(std::move(release)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
  // Blocks still in use belong to tensors that outlive the allocator (static
  // destruction order); their deleters find it gone and must not run, so
  // they are left to the driver, which frees them at process exit.
}

std::size_t CachingAllocator::round_size(std::size_t bytes) {
  if (bytes == 0) return kSmallQuantum;
  const std::size_t q = bytes < kSmallLimit ? kSmallQuantum : kLargeQuantum;
  return (bytes + q - 1) / q * q;
}

void* CachingAllocator::allocate(std::size_t bytes, const void* stream) {
  const std::size_t size = round_size(bytes);
  std::lock_guard lock(mutex_);
  auto it = free_.lower_bound({stream, size});
  if (it != free_.end() && it->first.first == stream && it->first.second <= 2 * size) {
    void* ptr = it->second;
    const std::size_t got = it->first.second;
    free_.erase(it);
    in_use_.emplace(ptr, Block{got, stream});
    stats_.cache_hits += 1;
    stats_.bytes_cached -= got;
    stats_.bytes_in_use += got;
    return ptr;
  }
  void* ptr = alloc_(size);
  if (ptr == nullptr && !free_.empty()) {
    release_cached_locked();
    ptr = alloc_(size);
  }
  if (ptr == nullptr) return nullptr;
  in_use_.emplace(ptr, Block{size, stream});
  stats_.source_allocations += 1;
  stats_.bytes_in_use += size;
  return ptr;
}

void CachingAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = in_use_.find(ptr);
  if (it == in_use_.end())
    throw ValueError("[allocator] free of a pointer this allocator did not hand out (or freed twice)");
  const Block b = it->second;
  in_use_.erase(it);
  free_.emplace(std::make_pair(b.stream, b.size), ptr);
  stats_.bytes_in_use -= b.size;
  stats_.bytes_cached += b.size;
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  for (auto& [key, ptr] : free_) release_(ptr);
  free_.clear();
  stats_.bytes_cached = 0;
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace dtensor
