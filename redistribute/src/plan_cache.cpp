#include <unordered_map>

#include "dtensor/redistribute/planner.h"

namespace dtensor {
namespace {

struct RequestHash {
  std::size_t operator()(const PlanRequest& r) const noexcept { return r.hash(); }
};

// Per thread, so that a hit takes no lock. Plans are small values; the cache
// is not bounded (a program sees few distinct redistributions) and references
// stay valid until clear_plan_cache() on the same thread.
struct Cache {
  std::unordered_map<PlanRequest, Plan, RequestHash> plans;
  PlanCacheStats stats;
};

Cache& cache() {
  thread_local Cache c;
  return c;
}

}  // namespace

const Plan& cached_plan(const PlanRequest& request) {
  Cache& c = cache();
  if (auto it = c.plans.find(request); it != c.plans.end()) {
    ++c.stats.hits;
    return it->second;
  }
  ++c.stats.misses;
  Plan plan = plan_redistribute(request);
  return c.plans.emplace(request, std::move(plan)).first->second;
}

PlanCacheStats plan_cache_stats() { return cache().stats; }

void clear_plan_cache() {
  Cache& c = cache();
  c.plans.clear();
  c.stats = PlanCacheStats{};
}

}  // namespace dtensor
