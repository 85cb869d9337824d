// Planner costs: a plan-cache hit against a miss (the full Dijkstra search)
// for a few typical requests, in the same run. Run: build/bench/plan_cache
#include <dtensor/dtensor.h>

#include <benchmark/benchmark.h>

using namespace dtensor;

namespace {

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
  };
}

void BM_PlanCacheHit(benchmark::State& state) {
  auto all = requests();
  const PlanRequest& r = all[state.range(0)].request;
  cached_plan(r);  // warm
  for (auto _ : state) benchmark::DoNotOptimize(&cached_plan(r));
  state.SetLabel(all[state.range(0)].name);
}

void BM_PlanCacheMiss(benchmark::State& state) {
  auto all = requests();
  const PlanRequest& r = all[state.range(0)].request;
  for (auto _ : state) benchmark::DoNotOptimize(plan_redistribute(r));
  state.SetLabel(all[state.range(0)].name);
}

}  // namespace

BENCHMARK(BM_PlanCacheHit)->DenseRange(0, 3);
BENCHMARK(BM_PlanCacheMiss)->DenseRange(0, 3);
BENCHMARK_MAIN();
