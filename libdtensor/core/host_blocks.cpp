#include "host_blocks.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <new>

namespace dtensor::host_blocks {
namespace {

// Large blocks round up to 64 KiB, so that tensors of nearly the same size
// share a class without wasting more than that.
constexpr std::size_t kLargeGranule = std::size_t{64} << 10;

std::size_t round_size(std::size_t bytes) {
  const std::size_t g = bytes >= kMinCachedBytes ? kLargeGranule : kAlignment;
  return (std::max<std::size_t>(bytes, 1) + g - 1) / g * g;
}

std::byte* system_allocate(std::size_t rounded) {
  return static_cast<std::byte*>(::operator new[](rounded, std::align_val_t(kAlignment)));
}
void system_free(std::byte* p) { ::operator delete[](p, std::align_val_t(kAlignment)); }

class Cache {
 public:
  std::byte* take(std::size_t rounded) {
    {
      std::lock_guard lock(mutex_);
      auto it = free_.find(rounded);
      if (it != free_.end()) {
        std::byte* p = it->second;
        free_.erase(it);
        cached_ -= rounded;
        ++stats_.hits;
        return p;
      }
      ++stats_.misses;
    }
    return system_allocate(rounded);
  }
  void give(std::byte* p, std::size_t rounded) {
    {
      std::lock_guard lock(mutex_);
      if (cached_ + rounded <= kHostCacheBytes) {
        free_.emplace(rounded, p);
        cached_ += rounded;
        return;
      }
    }
    system_free(p);
  }
  Stats stats() const {
    std::lock_guard lock(mutex_);
    Stats s = stats_;
    s.bytes_cached = cached_;
    return s;
  }

 private:
  mutable std::mutex mutex_;
  std::multimap<std::size_t, std::byte*> free_;
  std::size_t cached_ = 0;
  Stats stats_;
};

// Never destroyed: tensors in static storage may be freed after main.
Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}

}  // namespace

std::shared_ptr<std::byte[]> allocate(std::size_t bytes) {
  const std::size_t rounded = round_size(bytes);
  if (rounded < kMinCachedBytes) return std::shared_ptr<std::byte[]>(system_allocate(rounded), system_free);
  return std::shared_ptr<std::byte[]>(cache().take(rounded), [rounded](std::byte* p) { cache().give(p, rounded); });
}

Stats stats() { return cache().stats(); }

}  // namespace dtensor::host_blocks
