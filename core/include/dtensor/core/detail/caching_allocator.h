#pragma once
// A caching allocator over any source of raw blocks (cudaMalloc on the GPU,
// a counting malloc in the tests). Sizes round up to 512 bytes below 1 MiB
// and to 2 MiB above, so that a freed block serves later requests of about
// the same size. A free block is kept in the pool of its stream and handed
// out again only on that stream: work queued on a stream runs in order, so a
// block freed there is safe to reuse there at once, while another stream
// could still be reading it. A request takes the smallest cached block that
// fits and is at most twice its size (so a small tensor never pins a huge
// block); otherwise it asks the source, and if the source fails it returns
// the pool's free blocks and asks once more. Thread-safe.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace dtensor {

class CachingAllocator {
 public:
  /// `alloc` returns nullptr when it cannot serve a size; `release` frees
  /// what alloc returned.
  using AllocFn = std::function<void*(std::size_t bytes)>;
  using ReleaseFn = std::function<void(void* ptr)>;

  struct Stats {
    std::uint64_t source_allocations = 0;  // calls to alloc that succeeded
    std::uint64_t cache_hits = 0;
    std::uint64_t bytes_in_use = 0;
    std::uint64_t bytes_cached = 0;
  };

  CachingAllocator(AllocFn alloc, ReleaseFn release);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// A block of at least `bytes` for `stream` (any opaque key); nullptr only
  /// when the source fails even after the pool was emptied.
  void* allocate(std::size_t bytes, const void* stream);
  /// Gives a block from allocate() back to its stream's pool.
  void free(void* ptr);
  /// Releases every cached free block to the source.
  void empty_cache();
  Stats stats() const;

  /// The size a request is rounded to.
  static std::size_t round_size(std::size_t bytes);

 private:
  struct Block {
    std::size_t size;
    const void* stream;
  };
  void release_cached_locked();

  AllocFn alloc_;
  ReleaseFn release_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> in_use_;
  // Free blocks by (stream, size).
  std::multimap<std::pair<const void*, std::size_t>, void*> free_;
  Stats stats_;
};

}  // namespace dtensor
