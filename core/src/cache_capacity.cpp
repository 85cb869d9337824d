#include "dtensor/core/detail/cache_capacity.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "dtensor/core/error.h"

namespace dtensor {
namespace {

std::string range_text() { return fmt::format("a whole number of entries from 1 to {}", kMaxCacheEntries); }

}  // namespace

std::size_t CacheCapacity::get() const {
  std::size_t v = value_.load(std::memory_order_relaxed);
  if (v != 0) return v;
  v = default_;
  if (const char* text = std::getenv(env_); text && *text) {
    errno = 0;
    char* end = nullptr;
    const unsigned long long parsed = std::strtoull(text, &end, 10);
    if (errno != 0 || *end != '\0' || text[0] == '-' || parsed < 1 || parsed > kMaxCacheEntries)
      throw ValueError(fmt::format("[{}] {}='{}' is not {}", what_, env_, text, range_text()));
    v = static_cast<std::size_t>(parsed);
  }
  std::size_t expected = 0;
  // A concurrent set() wins over the variable.
  if (!value_.compare_exchange_strong(expected, v, std::memory_order_relaxed)) return expected;
  return v;
}

void CacheCapacity::set(std::size_t entries) {
  if (entries < 1 || entries > kMaxCacheEntries)
    throw ValueError(fmt::format("[{}] capacity {} is not {}", what_, entries, range_text()));
  value_.store(entries, std::memory_order_relaxed);
}

}  // namespace dtensor
