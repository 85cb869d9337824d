#include <unordered_map>

#include "dtensor/redistribute/planner.h"
#include "dtensor/core/detail/cache_capacity.h"
#include "dtensor/core/detail/lru_list.h"

namespace dtensor {
namespace {

struct RequestHash {
  std::size_t operator()(const PlanRequest& r) const noexcept { return r.hash(); }
};

CacheCapacity& capacity() {
  static CacheCapacity c("DTENSOR_PLAN_CACHE_ENTRIES", kDefaultPlanCacheEntries, "plan cache");
  return c;
}

std::size_t request_bytes(const PlanRequest& r) {
  return sizeof(PlanRequest) + (r.mesh_shape.capacity() + r.global_shape.capacity()) * sizeof(std::int64_t) +
         approx_bytes(r.from) + approx_bytes(r.to) - 2 * sizeof(Layout);
}

struct Node {
  Plan plan;
  const PlanRequest* key = nullptr;  // the map's own copy
  std::size_t bytes = 0;
  Node* lru_prev = nullptr;
  Node* lru_next = nullptr;
};

// Per thread, so that a hit takes no lock: a lookup and a relink. Bounded
// by capacity() entries, the least recently used going first; a full cache
// reuses the evicted entry's map node for the new plan.
struct Cache {
  std::unordered_map<PlanRequest, Node, RequestHash> plans;
  LruList<Node> lru;
  CacheStats stats;
  std::size_t bytes = 0;
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
    c.lru.touch(&it->second);
    return it->second.plan;
  }
  ++c.stats.misses;
  Plan plan = plan_redistribute(request);  // may throw: nothing changed yet
  const std::size_t limit = capacity().get();
  const std::size_t bytes = request_bytes(request) + approx_bytes(plan) + sizeof(Node) - sizeof(Plan);
  decltype(c.plans)::node_type reused;
  while (c.lru.size() >= limit || (c.lru.size() > 0 && c.bytes + bytes > kPlanCacheBytes)) {
    Node* old = c.lru.back();
    c.lru.unlink(old);
    c.bytes -= old->bytes;
    ++c.stats.evictions;
    auto handle = c.plans.extract(*old->key);
    if (reused.empty()) reused = std::move(handle);
  }
  auto it = c.plans.end();
  if (!reused.empty()) {
    reused.key() = request;
    reused.mapped().plan = std::move(plan);
    it = c.plans.insert(std::move(reused)).position;
  } else {
    it = c.plans.emplace(request, Node{std::move(plan)}).first;
  }
  Node& n = it->second;
  n.key = &it->first;
  n.bytes = bytes;
  c.bytes += n.bytes;
  c.lru.push_front(&n);
  return n.plan;
}

CacheStats plan_cache_stats() {
  const Cache& c = cache();
  CacheStats s = c.stats;
  s.entries = c.lru.size();
  s.capacity = capacity().get();
  s.bytes = c.bytes;
  return s;
}

void clear_plan_cache() {
  Cache& c = cache();
  c.plans.clear();
  c.lru = LruList<Node>{};
  c.bytes = 0;
  c.stats = CacheStats{};
}

void set_plan_cache_capacity(std::size_t entries) { capacity().set(entries); }

}  // namespace dtensor
