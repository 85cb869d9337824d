#include "support.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <boost/test/unit_test.hpp>

#include "dtensor/core/cuda.h"

namespace dtensor::testing {

namespace {
// The MPI job's size from the launcher's environment (needed before MPI is
// initialised: datasets are built at static initialisation).
int mpi_job_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(name)) return std::atoi(v);
  return 1;
}

Communicator& mpi_test_world() {
  // Lives until exit; MPI is finalised after it by mpi_world's atexit hook.
  static std::unique_ptr<Communicator> world = mpi_world();
  return *world;
}
}  // namespace

namespace {
double test_scale() {
  static const double scale = [] {
    const char* text = std::getenv("DTENSOR_TEST_SCALE");
    if (text == nullptr || *text == '\0') return 1.0;
    char* end = nullptr;
    const double v = std::strtod(text, &end);
    if (*end != '\0' || !(v > 0.0 && v <= 1.0))
      throw ValueError(fmt::format("DTENSOR_TEST_SCALE='{}': expected a number in (0, 1]", text));
    BOOST_TEST_MESSAGE(fmt::format("DTENSOR_TEST_SCALE={}: property loops run that fraction of their cases", v));
    return v;
  }();
  return scale;
}
}  // namespace

bool reduced_scale() { return test_scale() < 1.0; }

std::uint64_t seeded(std::uint64_t fixed) {
  static const std::uint64_t offset = [] {
    const char* text = std::getenv("DTENSOR_TEST_SEED");
    if (text == nullptr || *text == '\0') return std::uint64_t{0};
    char* end = nullptr;
    const unsigned long long v = std::strtoull(text, &end, 0);
    if (*end != '\0' || *text == '-')
      throw ValueError(fmt::format("DTENSOR_TEST_SEED='{}': expected an unsigned integer", text));
    BOOST_TEST_MESSAGE(fmt::format("DTENSOR_TEST_SEED={}: every property loop's seed is moved by it", v));
    return static_cast<std::uint64_t>(v);
  }();
  return fixed + offset;
}

std::size_t scaled_cases(std::size_t full, std::size_t at_least) {
  const double scale = test_scale();
  const auto scaled = static_cast<std::size_t>(std::ceil(static_cast<double>(full) * scale));
  return std::min(full, std::max(scaled, at_least));
}

std::string_view test_backend() { return launched_under_mpi() ? "mpi" : "threads"; }

bool can_run(std::int64_t ranks) { return test_backend() == "threads" || ranks == mpi_job_size(); }

std::vector<std::size_t> runnable_meshes(const std::vector<Shape>& meshes) {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < meshes.size(); ++i)
    if (can_run(numel(meshes[i]))) out.push_back(i);
  return out;
}

std::vector<Shape> backend_meshes(const std::vector<Shape>& thread_meshes) {
  if (test_backend() == "threads") return thread_meshes;
  std::vector<Shape> out;
  for (const Shape& m : thread_meshes)
    if (can_run(numel(m))) out.push_back(m);
  if (out.empty()) {
    const std::int64_t n = mpi_job_size();
    out.push_back({n});
    if (n % 2 == 0 && n >= 4) out.push_back({2, n / 2});
  }
  return out;
}

void run_ranks(int ranks, const std::function<void(Communicator& world)>& fn, std::chrono::milliseconds timeout) {
  if (test_backend() == "threads") {
    run_threads(ranks, fn, ThreadsOptions{timeout});
    return;
  }
  Communicator& world = mpi_test_world();
  if (world.size() != ranks)
    throw ValueError(
        fmt::format("run_ranks({}) under an MPI job of {} processes: expected equal sizes", ranks, world.size()));
  try {
    fn(world);
  } catch (const std::exception& e) {
    std::cerr << "test case " << boost::unit_test::framework::current_test_case().full_name() << ": rank "
              << world.rank() << " of " << world.size() << " failed: " << e.what() << "; aborting the MPI job"
              << std::endl;
    mpi_abort(1);
  }
}

void check_no_failures(const std::vector<std::string>& failures) {
  for (const std::string& f : failures) BOOST_ERROR(f);
  BOOST_TEST(failures.empty(), failures.size() << " check(s) failed on the ranks");
}

bool reports_results(const Communicator& world) { return test_backend() == "mpi" || world.rank() == 0; }

Tensor integer_tensor(const Shape& shape, DType dtype, std::uint64_t seed) {
  Tensor u = Tensor::rand(shape, DType::Float64, seed);
  Tensor t = Tensor::empty(shape, dtype);
  const double* p = u.data_as<double>();
  visit_dtype(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* q = t.data_as<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) q[i] = static_cast<T>(std::floor(p[i] * 1024.0) - 512.0);
  });
  return t;
}

Tensor source_shard(const Tensor& full, const Shape& mesh_shape, const Layout& layout, const Shape& coord,
                    std::uint64_t seed) {
  Box box = local_box(mesh_shape, full.shape(), layout, coord);
  Tensor local = slice_box(full, box);
  // Index of this rank among the ranks of its Partial group, and group size.
  std::int64_t index = 0, group = 1;
  ReduceOp op = ReduceOp::Sum;
  for (int m = 0; m < layout.mesh_ndim(); ++m) {
    if (auto* p = std::get_if<Partial>(&layout[m])) {
      index = index * mesh_shape[m] + coord[m];
      group *= mesh_shape[m];
      op = p->op;
    }
  }
  if (group == 1) return local;
  // Per-rank integer perturbations, from a seed that depends on the box and
  // the group index; index 0 balances them so the reduction is the value.
  auto perturbation = [&](std::int64_t k) {
    Tensor d = Tensor::empty(box.size, DType::Float64);
    fill_random(d, seed * 1000003 + static_cast<std::uint64_t>(k), box.size, Shape(box.size.size(), 0));
    return d;
  };
  visit_dtype(full.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* v = local.data_as<T>();
    const std::int64_t n = local.numel();
    if (op == ReduceOp::Sum || op == ReduceOp::Avg) {
      // Sum: rank k>0 holds a_k, rank 0 holds x - sum a_k.
      // Avg: rank k>0 holds x + a_k, rank 0 holds x - sum a_k.
      std::vector<T> total(n, T(0));
      for (std::int64_t k = 1; k < group; ++k) {
        Tensor d = perturbation(k);
        for (std::int64_t i = 0; i < n; ++i) total[i] += static_cast<T>(std::floor(d.data_as<double>()[i] * 64) - 32);
      }
      if (index == 0) {
        for (std::int64_t i = 0; i < n; ++i) v[i] = v[i] - total[i];
      } else {
        Tensor d = perturbation(index);
        for (std::int64_t i = 0; i < n; ++i) {
          T a = static_cast<T>(std::floor(d.data_as<double>()[i] * 64) - 32);
          v[i] = op == ReduceOp::Sum ? a : v[i] + a;
        }
      }
    } else if (index != 0) {
      Tensor d = perturbation(index);
      for (std::int64_t i = 0; i < n; ++i) {
        T a = static_cast<T>(std::floor(d.data_as<double>()[i] * 64));
        v[i] = op == ReduceOp::Max ? v[i] - a : v[i] + a;
      }
    }
  });
  return local;
}

Layout random_layout(std::mt19937_64& rng, int mesh_nd, int nd, ReduceOp op, int partial_odds) {
  std::vector<Placement> ps;
  for (int m = 0; m < mesh_nd; ++m) {
    int pick = static_cast<int>(rng() % 8);
    if (pick < partial_odds)
      ps.push_back(Partial{op});
    else if (nd > 0 && pick < partial_odds + 4)
      ps.push_back(Shard{static_cast<std::int64_t>(rng() % nd)});
    else
      ps.push_back(Replicate{});
  }
  if (rng() % 2 == 0) return Layout(ps);
  std::vector<std::pair<std::int64_t, std::vector<int>>> order;
  Layout plain(ps);
  for (int d = 0; d < nd; ++d) {
    std::vector<int> dims = plain.split_order(d);
    if (dims.size() < 2) continue;
    std::shuffle(dims.begin(), dims.end(), rng);
    order.emplace_back(d, dims);
  }
  return Layout(ps, order);
}

std::int64_t lower_bound_elements(const Shape& mesh_shape, const Shape& global, const Layout& from, const Layout& to,
                                  const Shape& coord) {
  Box held = local_box(mesh_shape, global, from, coord);
  Box needed = local_box(mesh_shape, global, to, coord);
  for (int m = 0; m < to.mesh_ndim(); ++m)
    if (auto* p = std::get_if<Partial>(&to[m]); p && p->op == ReduceOp::Sum && coord[m] != 0) return 0;
  return needed.numel() - intersect(needed, held).numel();
}

boost::test_tools::assertion_result needs_gpu(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result ok(cuda::device_count() > 0);
  if (!cuda::built())
    ok.message() << "this build has no CUDA";
  else if (cuda::device_count() == 0)
    ok.message() << cuda::describe_device();
  return ok;
}

}  // namespace dtensor::testing
