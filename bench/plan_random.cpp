// Planner misses over seeded random requests, the search's lower bound on
// and off in the same run: the mean and the slowest miss per group of
// meshes. The groups are the property suites' meshes (1-D to 3-D, up to 8
// ranks) and 4-D meshes of 16 to 24 ranks. Layouts mix Shard, Replicate and
// Partial (most sources, some targets); tensors are 1-D to 3-D with sizes
// from 0 to 1000 per dim. Each request is planned three times with the bound
// and the fastest counts, so that one preempted run does not make the max;
// the plain search runs once (on 4-D meshes it can take seconds).
// Run: build/bench/plan_random [--requests=N] [--seed=S]
#include <dtensor/dtensor.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

using namespace dtensor;

namespace {

struct Group {
  const char* name;
  std::vector<Shape> meshes;
};

Layout random_layout(std::mt19937_64& rng, int mesh_nd, int nd, ReduceOp op, int partial_odds) {
  std::vector<Placement> ps;
  for (int m = 0; m < mesh_nd; ++m) {
    const int pick = static_cast<int>(rng() % 8);
    if (pick < partial_odds)
      ps.push_back(Partial{op});
    else if (pick < partial_odds + 4)
      ps.push_back(Shard{static_cast<std::int64_t>(rng() % nd)});
    else
      ps.push_back(Replicate{});
  }
  return Layout(ps);
}

PlanRequest random_request(std::mt19937_64& rng, const std::vector<Shape>& meshes) {
  static const std::int64_t sizes[] = {0, 1, 3, 5, 8, 13, 16, 64, 100, 1000};
  const Shape mesh = meshes[rng() % meshes.size()];
  const int nd = 1 + static_cast<int>(rng() % 3);
  Shape shape;
  for (int d = 0; d < nd; ++d) shape.push_back(sizes[rng() % std::size(sizes)]);
  const DType dtype = std::array{DType::Float32, DType::Float64}[rng() % 2];
  const ReduceOp op = std::array{ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}[rng() % 3];
  const int M = static_cast<int>(mesh.size());
  const Layout from = random_layout(rng, M, nd, op, rng() % 4 == 0 ? 0 : 4);
  const Layout to = random_layout(rng, M, nd, op, rng() % 3 == 0 ? 2 : 0);
  return PlanRequest{mesh, shape, dtype, from, to, CostModel{}};
}

double fastest_miss_us(const PlanRequest& r, bool lower_bound, int runs) {
  double best = 1e300;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto plan = plan_redistribute(r, lower_bound, nullptr);
    const auto t1 = std::chrono::steady_clock::now();
    if (plan.steps.size() > 1'000'000) std::abort();  // keeps the plan alive
    best = std::min(best, std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return best;
}

// --requests=N and --seed=S, each in range; anything else is a usage error.
bool parse_args(int argc, char** argv, long long& requests, unsigned long long& seed) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    char* end = nullptr;
    if (a.starts_with("--requests=")) {
      requests = std::strtoll(argv[i] + 11, &end, 10);
      if (*end != '\0' || requests < 1 || requests > 1'000'000) return false;
    } else if (a.starts_with("--seed=")) {
      seed = std::strtoull(argv[i] + 7, &end, 10);
      if (*end != '\0' || argv[i][7] == '-' || argv[i][7] == '\0') return false;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  long long requests = 200;
  unsigned long long seed = 1;
  if (!parse_args(argc, argv, requests, seed)) {
    std::fprintf(stderr, "usage: plan_random [--requests=N (1 to 1000000)] [--seed=S (unsigned)]\n");
    return 2;
  }
  const std::vector<Group> groups = {
      {"suites (1-D to 3-D, <= 8 ranks)", {{2}, {4}, {8}, {2, 2}, {2, 3}, {4, 2}, {2, 4}, {2, 2, 2}, {2, 1, 3}}},
      {"4-D, 16 to 24 ranks", {{2, 2, 2, 2}, {2, 3, 2, 2}, {3, 2, 2, 2}, {2, 2, 3, 2}}},
  };
  std::printf("planner misses over %lld random requests per group (seed %llu), microseconds (A*: fastest of 3)\n",
              requests, seed);
  std::printf("%-34s %10s %10s %10s %10s %8s\n", "group", "A* mean", "A* max", "plain mean", "plain max", "skipped");
  for (const Group& g : groups) {
    std::mt19937_64 rng(seed);
    double sum_bound = 0, max_bound = 0, sum_plain = 0, max_plain = 0;
    long long planned = 0, skipped = 0;
    for (long long i = 0; i < requests; ++i) {
      const PlanRequest r = random_request(rng, g.meshes);
      try {
        const double b = fastest_miss_us(r, true, 3), p = fastest_miss_us(r, false, 1);
        sum_bound += b, sum_plain += p;
        max_bound = std::max(max_bound, b), max_plain = std::max(max_plain, p);
        ++planned;
      } catch (const Error&) {
        ++skipped;  // a layout the request's shape cannot take (e.g. a shard of a dim the tensor lacks)
      }
    }
    const double n = static_cast<double>(std::max(planned, 1LL));
    std::printf("%-34s %10.1f %10.1f %10.1f %10.1f %8lld\n", g.name, sum_bound / n, max_bound, sum_plain / n, max_plain,
                skipped);
  }
  return 0;
}
