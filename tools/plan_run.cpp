#include "plan_run.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dtensor/core/tensor.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/threads.h"
#include "dtensor/redistribute/executor.h"

namespace dtensor::cli {
namespace {

constexpr std::size_t kMaxProblems = 5;

std::vector<int> partial_dims(const Layout& layout) {
  std::vector<int> dims;
  for (int m = 0; m < layout.mesh_ndim(); ++m)
    if (is_partial(layout[m])) dims.push_back(m);
  return dims;
}

std::int64_t group_size(const Shape& mesh_shape, const std::vector<int>& dims) {
  std::int64_t k = 1;
  for (int m : dims) k *= mesh_shape[m];
  return k;
}

// Position of `coord` among the ranks that differ from it only along `dims`.
std::int64_t index_along(const Shape& mesh_shape, const Shape& coord, const std::vector<int>& dims) {
  std::int64_t k = 0;
  for (int m : dims) k = k * mesh_shape[m] + coord[m];
  return k;
}

// An independent random stream per (seed, stream): splitmix64.
std::uint64_t stream_seed(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (stream + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

bool sums_values(const Layout& layout) {
  for (const Placement& p : layout.placements())
    if (auto* q = std::get_if<Partial>(&p); q && (q->op == ReduceOp::Sum || q->op == ReduceOp::Avg)) return true;
  return false;
}

// This rank's shard under plan.from of Tensor::rand(shape, dtype, seed). With
// K partial ranks, rank k of them holds part k of each value: for a sum,
// floats take a random fraction below 1/(2K) of the value on k > 0 (rank 0
// the rest, so no part cancels the others) and int64 random integers; for a
// mean, K times those parts (int64: rank 0 holds K times the value less the
// others' parts, whose truncated mean is the value only if the planner
// divides once, never one mesh dim at a time); for max/min one random rank
// holds the value and the others smaller/larger ones.
template <class T>
Tensor make_source(const Plan& plan, std::uint64_t seed, const Shape& coord) {
  constexpr bool fp = std::is_floating_point_v<T>;
  const Box box = local_box(plan.mesh_shape, plan.global_shape, plan.from, coord);
  auto stream = [&](std::uint64_t s) {
    Tensor t = Tensor::empty(box.size, plan.dtype);
    fill_random(t, s, plan.global_shape, box.offset);
    return t;
  };
  Tensor local = stream(seed);
  const std::vector<int> parts = partial_dims(plan.from);
  const std::int64_t K = group_size(plan.mesh_shape, parts);
  if (K == 1) return local;
  const std::int64_t k = index_along(plan.mesh_shape, coord, parts);
  const ReduceOp op = std::get<Partial>(plan.from[parts.front()]).op;
  T* x = local.data_as<T>();
  const std::int64_t n = local.numel();

  if (op == ReduceOp::Sum || op == ReduceOp::Avg) {
    const bool int_mean = !fp && op == ReduceOp::Avg;
    auto share = [&](T value, T r) -> T {
      if constexpr (fp)
        return value * (r / static_cast<T>(2 * K));
      else
        return r;
    };
    if (k > 0) {
      const Tensor r = stream(stream_seed(seed, static_cast<std::uint64_t>(k)));
      const T* rv = r.data_as<T>();
      for (std::int64_t i = 0; i < n; ++i) x[i] = share(x[i], rv[i]);
    } else {
      std::vector<T> others(static_cast<std::size_t>(n), T{0});
      for (std::int64_t j = 1; j < K; ++j) {
        const Tensor r = stream(stream_seed(seed, static_cast<std::uint64_t>(j)));
        const T* rv = r.data_as<T>();
        for (std::int64_t i = 0; i < n; ++i) others[i] += share(x[i], rv[i]);
      }
      // An int64 mean: rank 0 holds K x less the others' parts, which are
      // not multiples of K, so any truncation before the one division shows.
      for (std::int64_t i = 0; i < n; ++i) x[i] = (int_mean ? x[i] * static_cast<T>(K) : x[i]) - others[i];
    }
    if (op == ReduceOp::Avg && !int_mean)
      for (std::int64_t i = 0; i < n; ++i) x[i] *= static_cast<T>(K);
    return local;
  }
  // Max / Min.
  const Tensor winner = stream(stream_seed(seed, static_cast<std::uint64_t>(K + 1)));
  const Tensor delta = stream(stream_seed(seed, static_cast<std::uint64_t>(k)));
  const T* w = winner.data_as<T>();
  const T* d = delta.data_as<T>();
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t win = 0;
    T step{};
    if constexpr (fp) {
      win = std::min<std::int64_t>(K - 1, static_cast<std::int64_t>(w[i] * static_cast<T>(K)));
      step = d[i];
    } else {
      win = (w[i] + 1000) % K;
      step = d[i] + 1000;
    }
    if (win != k) x[i] = op == ReduceOp::Max ? x[i] - step : x[i] + step;
  }
  return local;
}

std::vector<double> as_doubles(const Tensor& t) {
  return visit_dtype(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = t.data_as<T>();
    return std::vector<double>(p, p + t.numel());
  });
}

std::string coord_text(const Shape& c) { return fmt::format("({})", fmt::join(c, ",")); }

// Checks every rank's shard against the expected values; adds what differs
// to res.problems.
void check_results(const Plan& plan, std::uint64_t seed, const std::vector<Tensor>& results, RunResult& res) {
  const int n = static_cast<int>(results.size());
  for (int r = 0; r < n; ++r) {
    const Shape coord = unravel_index(r, plan.mesh_shape);
    const Box want = local_box(plan.mesh_shape, plan.global_shape, plan.to, coord);
    const Tensor& got = results[static_cast<std::size_t>(r)];
    if (!got.defined() || got.shape() != want.size || got.dtype() != plan.dtype)
      res.problems.push_back(fmt::format("rank {} {}: got a {} {} shard, expected {} {} for box {}", r,
                                         coord_text(coord),
                                         got.defined() ? fmt::format("{}", fmt::join(got.shape(), "x")) : "undefined",
                                         got.dtype(), fmt::join(want.size, "x"), plan.dtype, want));
  }
  if (!res.problems.empty()) return;

  // Each group of ranks that differ only along the target's Partial mesh
  // dims holds the value reduced over the group; other ranks hold it alone.
  const std::vector<int> parts = partial_dims(plan.to);
  const std::int64_t K = group_size(plan.mesh_shape, parts);
  const ReduceOp op = parts.empty() ? ReduceOp::Sum : std::get<Partial>(plan.to[parts.front()]).op;
  for (int r = 0; r < n && res.problems.size() < kMaxProblems; ++r) {
    const Shape coord = unravel_index(r, plan.mesh_shape);
    if (index_along(plan.mesh_shape, coord, parts) != 0) continue;
    const Box want = local_box(plan.mesh_shape, plan.global_shape, plan.to, coord);
    Tensor expected_t = Tensor::empty(want.size, plan.dtype);
    fill_random(expected_t, seed, plan.global_shape, want.offset);
    const std::vector<double> expected = as_doubles(expected_t);
    std::vector<double> got = as_doubles(results[static_cast<std::size_t>(r)]);
    std::vector<int> group{r};
    for (std::int64_t j = 1; j < K; ++j) {
      Shape peer = coord;
      std::int64_t rest = j;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        peer[*it] = rest % plan.mesh_shape[*it];
        rest /= plan.mesh_shape[*it];
      }
      const int pr = static_cast<int>(ravel_index(peer, plan.mesh_shape));
      group.push_back(pr);
      const std::vector<double> v = as_doubles(results[static_cast<std::size_t>(pr)]);
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (op == ReduceOp::Max)
          got[i] = std::max(got[i], v[i]);
        else if (op == ReduceOp::Min)
          got[i] = std::min(got[i], v[i]);
        else
          got[i] += v[i];
      }
    }
    if (op == ReduceOp::Avg && K > 1)
      for (double& g : got)
        g = is_floating(plan.dtype) ? g / static_cast<double>(K) : std::trunc(g / static_cast<double>(K));

    std::int64_t bad = 0, first = -1;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const bool ok =
          res.tolerant ? std::abs(got[i] - expected[i]) <= 1e-6 + 1e-6 * std::abs(expected[i]) : got[i] == expected[i];
      if (!ok && bad++ == 0) first = static_cast<std::int64_t>(i);
    }
    if (bad == 0) continue;
    Shape index = unravel_index(first, want.size);
    for (std::size_t d = 0; d < index.size(); ++d) index[d] += want.offset[d];
    res.problems.push_back(
        fmt::format("{} {} {}: {} of {} elements differ; element [{}] is {}, expected {}",
                    group.size() == 1 ? "rank" : "ranks",
                    group.size() == 1 ? std::to_string(r) : fmt::format("{{{}}}", fmt::join(group, ",")), want, bad,
                    got.size(), fmt::join(index, ","), got[first], expected[first]));
  }
}

}  // namespace

RunResult run_plan(const Plan& plan, std::uint64_t seed, Communicator& world) {
  const int n = static_cast<int>(numel(plan.mesh_shape));
  if (world.size() != n)
    throw ValueError(fmt::format("the mesh {} has {} ranks but the run has {}: expected them to agree",
                                 fmt::join(plan.mesh_shape, "x"), n, world.size()));
  RunResult res;
  res.backend = std::string(world.backend());
  DeviceMesh mesh(world, plan.mesh_shape);
  Tensor local =
      visit_dtype(plan.dtype, [&](auto zero) { return make_source<decltype(zero)>(plan, seed, mesh.coordinate()); });
  world.barrier();
  const CommStats before = world.stats();
  Tensor out = execute_plan(plan, mesh, local);
  const std::int64_t mine = static_cast<std::int64_t>((world.stats() - before).recv_bytes);
  res.recv_bytes.assign(static_cast<std::size_t>(n), 0);
  world.all_gather(&mine, res.recv_bytes.data(), sizeof mine);
  res.measured_recv_bytes = *std::max_element(res.recv_bytes.begin(), res.recv_bytes.end());
  res.tolerant = is_floating(plan.dtype) && (sums_values(plan.from) || sums_values(plan.to));

  // Rank 0 collects every shard (ranks may be processes) and checks them;
  // the verdict is broadcast so that every rank returns the same result.
  constexpr int kHeaderTag = 1, kDataTag = 2;
  struct Header {
    std::int64_t defined, ndim, dtype;
    std::int64_t dims[8];
  };
  if (world.rank() != 0) {
    Header h{out.defined() ? 1 : 0,
             out.defined() ? static_cast<std::int64_t>(out.shape().size()) : 0,
             static_cast<std::int64_t>(out.defined() ? out.dtype() : plan.dtype),
             {}};
    for (std::size_t d = 0; d < static_cast<std::size_t>(h.ndim) && d < 8; ++d) h.dims[d] = out.shape()[d];
    world.send(&h, sizeof h, 0, kHeaderTag);
    world.send(out.defined() ? out.data() : nullptr, out.defined() ? out.nbytes() : 0, 0, kDataTag);
  }
  std::int64_t verified = 0;
  if (world.rank() == 0) {
    std::vector<Tensor> results(static_cast<std::size_t>(n));
    results[0] = out;
    for (int r = 1; r < n; ++r) {
      Header h{};
      world.recv(&h, sizeof h, r, kHeaderTag);
      Tensor t;
      std::size_t bytes = 0;
      if (h.defined && h.ndim <= 8) {
        t = Tensor::empty(Shape(h.dims, h.dims + h.ndim), static_cast<DType>(h.dtype));
        bytes = t.nbytes();
      }
      world.recv(t.defined() ? t.data() : nullptr, bytes, r, kDataTag);
      results[static_cast<std::size_t>(r)] = std::move(t);
    }
    check_results(plan, seed, results, res);
    verified = res.problems.empty() ? 1 : 0;
  }
  world.broadcast(&verified, sizeof verified, 0);
  res.verified = verified == 1;
  return res;
}

}  // namespace dtensor::cli
