// Planner costs: a plan-cache hit against a miss (the full search, guided by
// its lower bound) for a few typical requests, and the miss of the plain
// search (the bound off) next to it, in the same run: 3-D and 4-D meshes
// with several Partial mesh dims are where the bound matters. Run:
// build/bench/plan_cache (--benchmark_enable_random_interleaving=true
// alternates the variants)
#include <dtensor/dtensor.h>

#include <benchmark/benchmark.h>

using namespace dtensor;

namespace {

// The calling thread's plan cache, as counters next to the timings.
void report_cache(benchmark::State& state) {
  const CacheStats s = plan_cache_stats();
  state.counters["entries"] = static_cast<double>(s.entries);
  state.counters["capacity"] = static_cast<double>(s.capacity);
  state.counters["cache_KiB"] = static_cast<double>(s.bytes) / 1024;
  state.counters["evictions"] = static_cast<double>(s.evictions);
  state.counters["hits"] = static_cast<double>(s.hits);
  state.counters["misses"] = static_cast<double>(s.misses);
}

struct Named {
  const char* name;
  PlanRequest request;
};

std::vector<Named> requests() {
  auto req = [](Shape mesh, Shape shape, const char* from, const char* to) {
    return PlanRequest{mesh, shape, DType::Float32, Layout::parse(from), Layout::parse(to), CostModel{}};
  };
  return {
      {"1d_S0_to_R", req({8}, {1024, 1024}, "S(0)", "R")},
      {"2x4_S0S1_to_RR", req({2, 4}, {64, 128}, "S(0),S(1)", "R,R")},
      {"2x4_PS1_to_S1S0", req({2, 4}, {64, 128}, "P(sum),S(1)", "S(1),S(0)")},
      {"2x2x2_S0S0S0_to_S1S1S1", req({2, 2, 2}, {8, 8, 8}, "S(0),S(0),S(0)", "S(1),S(1),S(1)")},
      {"2x2x2_PPS0_to_S1RS2", req({2, 2, 2}, {64, 64, 64}, "P(sum),P(sum),S(0)", "S(1),R,S(2)")},
      {"2x2x2x2_PPPR_to_S0RS1R", req({2, 2, 2, 2}, {64, 64}, "P(sum),P(sum),P(sum),R", "S(0),R,S(1),R")},
      {"4x4x4x4_PPS0R_to_RS1RS0", req({4, 4, 4, 4}, {16, 16}, "P(sum),P(sum),S(0),R", "R,S(1),R,S(0)")},
      {"4x4x4x4_PPRR_to_S0S1RR", req({4, 4, 4, 4}, {1000, 1001}, "P(sum),P(sum),R,R", "S(0),S(1),R,R")},
  };
}

void BM_PlanCacheHit(benchmark::State& state) {
  auto all = requests();
  const PlanRequest& r = all[state.range(0)].request;
  cached_plan(r);  // warm
  for (auto _ : state) benchmark::DoNotOptimize(&cached_plan(r));
  state.SetLabel(all[state.range(0)].name);
  report_cache(state);
}

// A new request every iteration, round-robin over more shapes than the cache
// holds: each is a miss that evicts the least recently used plan (the 1-D
// S(0) -> R search is the cheapest, so this is mostly the cache's own cost).
void BM_PlanCacheMissEvicting(benchmark::State& state) {
  const std::size_t capacity = plan_cache_stats().capacity;
  std::int64_t n = 0;
  for (auto _ : state) {
    n = n % static_cast<std::int64_t>(capacity + 64) + 1;
    benchmark::DoNotOptimize(&cached_plan(
        PlanRequest{{8}, {8 * n}, DType::Float32, Layout::parse("S(0)"), Layout::parse("R"), CostModel{}}));
  }
  report_cache(state);
}

void BM_PlanCacheMiss(benchmark::State& state) {
  auto all = requests();
  const PlanRequest& r = all[state.range(0)].request;
  for (auto _ : state) benchmark::DoNotOptimize(plan_redistribute(r));
  state.SetLabel(all[state.range(0)].name);
}

// The same miss without the search's lower bound: what it saves.
void BM_PlanCacheMissPlain(benchmark::State& state) {
  auto all = requests();
  const PlanRequest& r = all[state.range(0)].request;
  PlanSearchStats bounded, plain;
  plan_redistribute(r, true, &bounded);
  for (auto _ : state) benchmark::DoNotOptimize(plan_redistribute(r, false, &plain));
  state.SetLabel(
      fmt::format("{} (expanded {} plain, {} bounded)", all[state.range(0)].name, plain.expanded, bounded.expanded));
}

constexpr int kLast = 7;

}  // namespace

BENCHMARK(BM_PlanCacheHit)->DenseRange(0, kLast);
BENCHMARK(BM_PlanCacheMiss)->DenseRange(0, kLast);
BENCHMARK(BM_PlanCacheMissPlain)->DenseRange(0, kLast);
BENCHMARK(BM_PlanCacheMissEvicting);
BENCHMARK_MAIN();
