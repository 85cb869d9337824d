#include "dtensor/core/detail/host_blocks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <fmt/format.h>

#include "dtensor/core/error.h"

namespace dtensor::host_blocks {
namespace {

std::byte* heap_allocate(std::size_t bytes) {
  return static_cast<std::byte*>(::operator new[](bytes, std::align_val_t(kAlignment)));
}
void heap_free(std::byte* p) { ::operator delete[](p, std::align_val_t(kAlignment)); }

std::byte* map_block(std::size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}
void unmap_block(std::byte* p, std::size_t size) { ::munmap(p, size); }

std::string limit_range() { return fmt::format("a size from 0 to {} MiB", kMaxLimitBytes >> 20); }

std::size_t limit_from_env() {
  const char* text = std::getenv("DTENSOR_HOST_CACHE_MB");
  if (!text || !*text) return kHostCacheBytes;
  errno = 0;
  char* end = nullptr;
  const unsigned long long mib = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || text[0] == '-' || mib > (kMaxLimitBytes >> 20))
    throw ValueError(fmt::format("[host memory] DTENSOR_HOST_CACHE_MB='{}' is not {}", text, limit_range()));
  return static_cast<std::size_t>(mib) << 20;
}

// Free blocks by size class.
class Cache {
 public:
  Cache() : limit_(limit_from_env()) {}

  std::byte* take(std::size_t size) {
    {
      std::lock_guard lock(mutex_);
      SizeClass& c = classes_[size];
      add_in_use_locked(c, size);
      if (!c.free.empty()) {
        std::byte* p = c.free.back();
        c.free.pop_back();
        cached_ -= size;
        ++stats_.hits;
        return p;
      }
      ++stats_.misses;
    }
    std::byte* p = map_block(size);
    if (!p) {
      release_all();
      p = map_block(size);
    }
    if (!p) {
      std::lock_guard lock(mutex_);
      remove_in_use_locked(classes_[size], size);
      throw std::bad_alloc();
    }
    return p;
  }

  // Runs in a deleter: never throws (a block it cannot file is unmapped).
  void give(std::byte* p, std::size_t size) noexcept {
    std::vector<Freed> out;
    bool kept = false;
    {
      std::lock_guard lock(mutex_);
      SizeClass& c = classes_[size];
      remove_in_use_locked(c, size);
      try {
        out.reserve(4);
        c.free.push_back(p);
        kept = true;
        cached_ += size;
        trim_locked(out);
      } catch (const std::bad_alloc&) {
      }
    }
    if (!kept) unmap_block(p, size);
    for (auto [q, n] : out) unmap_block(q, n);
  }

  void release_all() { set_limit(limit(), /*keep=*/false); }

  void set_limit(std::size_t limit, bool keep = true) {
    std::vector<Freed> out;
    {
      std::lock_guard lock(mutex_);
      limit_ = limit;
      trim_locked(out, keep ? bound_locked() : 0);
    }
    for (auto [q, n] : out) unmap_block(q, n);
  }

  std::size_t limit() const {
    std::lock_guard lock(mutex_);
    return limit_;
  }

  Stats stats() const {
    std::lock_guard lock(mutex_);
    Stats s = stats_;
    s.bytes_in_use = in_use_;
    s.peak_bytes_in_use = peak_in_use_;
    s.bytes_cached = cached_;
    s.limit = limit_;
    return s;
  }

 private:
  struct Freed {
    std::byte* p;
    std::size_t size;
  };

  // One size class: its free blocks (a stack: the most recently freed,
  // whose pages are likeliest resident and in cache, goes out first), and
  // how many of its blocks are in use now and were at most.
  struct SizeClass {
    std::vector<std::byte*> free;
    std::size_t in_use = 0, peak = 0;
  };

  void add_in_use_locked(SizeClass& c, std::size_t size) {
    in_use_ += size;
    peak_in_use_ = std::max(peak_in_use_, in_use_);
    if (++c.in_use > c.peak)
      c.peak = c.in_use;
    else
      class_room_ -= size;
  }
  void remove_in_use_locked(SizeClass& c, std::size_t size) {
    in_use_ -= size;
    --c.in_use;
    class_room_ += size;
  }

  // Free bytes may match what is in use (or the floor), or what every class
  // needs to reach its own peak again (class_room_: a repeated training
  // step's blocks, all of which its next step asks for again), up to twice
  // the program's peak in use; never the limit. So resident = in use +
  // cached stays within twice the live bytes or twice the program's peak.
  // Why per class: a step's demand per class peaks at different times
  // (activations in the forward, gradients in the backward, one rank
  // thread's buckets while another computes), so the blocks it maps add up
  // to more than its peak in use: the room below the peak alone unmapped 16
  // blocks (48 MiB) that every step of a 10.9M-parameter GPT mapped again,
  // and under ZeRO-1 on 2 thread ranks even 1.5x the peak left 28,000 page
  // faults a step (2x: 270, and the step 415 -> 298 ms).
  std::size_t bound_locked() const {
    const std::size_t peak_room = 2 * peak_in_use_ - in_use_;
    return std::min(limit_, std::max({kCacheFloorBytes, in_use_, std::min(class_room_, peak_room)}));
  }

  void trim_locked(std::vector<Freed>& out) { trim_locked(out, bound_locked()); }
  // The biggest classes go first: the fewest blocks to map again.
  void trim_locked(std::vector<Freed>& out, std::size_t bound) {
    for (auto it = classes_.rbegin(); cached_ > bound && it != classes_.rend(); ++it) {
      auto& stack = it->second.free;
      while (cached_ > bound && !stack.empty()) {
        out.push_back({stack.front(), it->first});
        stack.erase(stack.begin());  // the least recently freed of its class
        cached_ -= it->first;
        ++stats_.releases;
      }
    }
  }

  mutable std::mutex mutex_;
  std::map<std::size_t, SizeClass> classes_;
  std::size_t limit_;
  std::size_t in_use_ = 0;
  std::size_t peak_in_use_ = 0;
  std::size_t class_room_ = 0;  // sum over classes of (peak - in_use) blocks, in bytes
  std::size_t cached_ = 0;
  Stats stats_;
};

// Never destroyed: tensors in static storage may be freed after main.
Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}

}  // namespace

std::size_t class_size(std::size_t bytes) {
  // Eight classes per power of two: a block is at most 1/8 bigger than asked.
  const std::size_t step = std::bit_floor(bytes) / 8;
  return (bytes + step - 1) / step * step;
}

std::shared_ptr<std::byte[]> allocate(std::size_t bytes) {
  if (bytes < kMinCachedBytes) {
    const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    return std::shared_ptr<std::byte[]>(heap_allocate(rounded), heap_free);
  }
  const std::size_t size = class_size(bytes);
  return std::shared_ptr<std::byte[]>(cache().take(size), [size](std::byte* p) { cache().give(p, size); });
}

Stats stats() { return cache().stats(); }

}  // namespace dtensor::host_blocks

namespace dtensor {

HostMemoryStats host_memory_stats() { return host_blocks::stats(); }

std::size_t resident_bytes() {
  long pages = 0, resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  const long page = sysconf(_SC_PAGESIZE);
  return resident > 0 && page > 0 ? static_cast<std::size_t>(resident) * static_cast<std::size_t>(page) : 0;
}

void release_host_memory() {
  host_blocks::cache().release_all();
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

void set_host_cache_limit(std::size_t bytes) {
  if (bytes > host_blocks::kMaxLimitBytes)
    throw ValueError(fmt::format("[host memory] cache limit {} bytes is not {}", bytes, host_blocks::limit_range()));
  host_blocks::cache().set_limit(bytes);
}

}  // namespace dtensor
