#pragma once
// Internal: the entry bound of a per-thread cache, one value for the whole
// process. It starts from an environment variable when set (else a built-in
// default) and can be changed at run time; each thread's cache reads it when
// it inserts, so a hit never looks at it.
#include <atomic>
#include <cstddef>

namespace dtensor {

/// The largest bound any cache accepts.
inline constexpr std::size_t kMaxCacheEntries = std::size_t{1} << 20;

class CacheCapacity {
 public:
  /// `env`: the variable that overrides `default_entries`; `what`: the cache
  /// as error messages name it. Reads the variable on the first get().
  CacheCapacity(const char* env, std::size_t default_entries, const char* what)
      : env_(env), what_(what), default_(default_entries) {}

  /// The bound; ValueError naming the variable if it is set to anything but
  /// a whole number in [1, kMaxCacheEntries].
  std::size_t get() const;
  /// ValueError naming `entries` outside [1, kMaxCacheEntries].
  void set(std::size_t entries);

 private:
  const char* env_;
  const char* what_;
  std::size_t default_;
  mutable std::atomic<std::size_t> value_{0};  // 0: not read yet
};

}  // namespace dtensor
