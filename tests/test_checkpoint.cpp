// Distributed checkpoints: saved on one mesh and layout, loaded on any other
// with every element equal and each rank reading only what its box needs;
// one writer per replicated group; Partial reduced or refused; a save that
// fails on one rank leaves the older checkpoint loadable; corrupt,
// truncated and missing pieces are typed errors naming the file, tensor and
// box, on every rank.
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <unistd.h>

#include <dtensor/checkpoint/checkpoint.h>
#include <dtensor/dtensor.h>

#include "dtensor/checkpoint/detail/format.h"
#include "support.h"

using namespace dtensor;
namespace fs = std::filesystem;
namespace ckpt = dtensor::dcp;

namespace checkpoint_suite {

// A directory per case, removed at the end. Under MPI every process of the
// job must use the same one (rank 0's process id names it, sent to the
// others), and none may remove it while others still use it (a barrier
// first).
struct TempDir {
  fs::path path;
  bool shared;
  explicit TempDir(const std::string& what, bool shared_by_the_job = true)
      : shared(shared_by_the_job && testing::test_backend() == "mpi") {
    std::int64_t id = ::getpid();
    if (shared) testing::run_ranks(job_size(), [&](Communicator& world) { world.broadcast(&id, sizeof(id), 0); });
    path = fs::temp_directory_path() / fmt::format("dtensor_ckpt_{}_{}", id, what);
    fs::create_directories(path);
  }
  ~TempDir() {
    if (shared) testing::run_ranks(job_size(), [](Communicator& world) { world.barrier(); });
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
  static int job_size() { return static_cast<int>(numel(testing::backend_meshes({{1}}).front())); }
};

// Test cases that need exactly this many ranks run where the backend has
// them (all on threads; under MPI, the job's size), and are skipped elsewhere.
using testing::ranks_available;

Shape random_mesh(std::mt19937_64& rng) {
  static const std::vector<Shape> meshes{{1}, {2}, {3}, {4}, {8}, {2, 2}, {2, 3}, {4, 2}, {2, 2, 2}, {1, 2, 2}, {3, 1}};
  return meshes[rng() % meshes.size()];
}

Shape random_shape(std::mt19937_64& rng) {
  const int nd = static_cast<int>(rng() % 4);
  Shape s;
  for (int d = 0; d < nd; ++d) s.push_back(rng() % 7 == 0 ? 0 : static_cast<std::int64_t>(1 + rng() % 9));
  return s;
}

using Failures = testing::FailureLog;

// Saves `full` from `mesh_from` laid out `from` (Partial mesh dims hold
// addends), loads it onto `mesh_to` as `to`; each rank's shard must equal
// the full tensor's box, and with one element per chunk the bytes read must
// equal the bytes its box needs.
void round_trip(const fs::path& dir, const Tensor& full, const Shape& mesh_from, const Layout& from,
                const Shape& mesh_to, const Layout& to, std::size_t chunk_bytes, std::uint64_t seed,
                Failures& failures) {
  testing::run_ranks(static_cast<int>(numel(mesh_from)), [&](Communicator& world) {
    const DeviceMesh mesh(world, mesh_from);
    const Tensor local = testing::source_shard(full, mesh_from, from, mesh.coordinate(), seed);
    const DTensor t = DTensor::from_local(local, mesh, from, full.shape());
    ckpt::save(dir.string(), {{"t", t}, {"also", t}}, {.chunk_bytes = chunk_bytes});
  });
  testing::run_ranks(static_cast<int>(numel(mesh_to)), [&](Communicator& world) {
    const DeviceMesh mesh(world, mesh_to);
    ckpt::LoadStats stats;
    const auto got = ckpt::load(dir.string(), {{"t", {mesh, to, full.shape(), full.dtype()}}}, &stats);
    const Tensor want = testing::expected_shard(full, got.at("t").local_box());
    if (!equal(got.at("t").to_local(), want))
      failures.add(fmt::format("rank {}: the loaded shard of box {} differs", world.rank(), got.at("t").local_box()));
    if (stats.bytes_needed != want.nbytes())
      failures.add(
          fmt::format("rank {}: needed {} bytes, its box has {}", world.rank(), stats.bytes_needed, want.nbytes()));
    if (chunk_bytes == itemsize(full.dtype()) ? stats.bytes_read != stats.bytes_needed
                                              : stats.bytes_read < stats.bytes_needed)
      failures.add(fmt::format("rank {}: read {} bytes for the {} its box needs (chunks of {})", world.rank(),
                               stats.bytes_read, stats.bytes_needed, chunk_bytes));
  });
}

// Runs fn on `ranks` ranks, each of which must throw a dtensor Error; returns
// the message and type this process reports (rank 0's on threads, the
// process's own under MPI: a rank's own error, or a CheckpointError naming
// the rank that failed).
std::string error_on_every_rank(int ranks, const std::function<void(Communicator&)>& fn, std::string* type) {
  Failures failures;
  std::string message;
  testing::run_ranks(ranks, [&](Communicator& world) {
    try {
      fn(world);
      failures.add(fmt::format("rank {} threw nothing", world.rank()));
    } catch (const Error& e) {
      if (!testing::reports_results(world)) return;
      message = e.what();
      if (type)
        *type = dynamic_cast<const CheckpointError*>(&e) ? "CheckpointError"
                : dynamic_cast<const ValueError*>(&e)    ? "ValueError"
                                                         : "Error";
    }
  });
  failures.report("every rank must throw");
  return message;
}

}  // namespace checkpoint_suite

using namespace checkpoint_suite;

BOOST_AUTO_TEST_SUITE(checkpoints)

BOOST_AUTO_TEST_CASE(any_mesh_and_layout_to_any_other) {
  const std::uint64_t seed = testing::seeded(20261202);
  std::mt19937_64 rng(seed);
  const std::size_t cases = testing::scaled_cases(testing::test_backend() == "mpi" ? 12 : 60, 8);
  const TempDir tmp("property");
  for (std::size_t c = 0; c < cases; ++c) {
    const Shape shape = random_shape(rng);
    const DType dtype =
        std::array{DType::Float32, DType::Float64, DType::Int64, DType::BFloat16, DType::Float16}[rng() % 5];
    Shape mesh_from = random_mesh(rng), mesh_to = random_mesh(rng);
    if (testing::test_backend() == "mpi") {
      const auto all = testing::backend_meshes({{1}});
      mesh_from = all[rng() % all.size()];
      mesh_to = all[rng() % all.size()];
    }
    const int nd = static_cast<int>(shape.size());
    // 16-bit sources are made in f32 and rounded, and hold no Partial (their
    // reduction would add in 16 bits: not exact).
    const bool narrow = dtype == DType::Float16 || dtype == DType::BFloat16;
    const int partial_odds = narrow ? 0 : 1;
    const Layout from =
        testing::random_layout(rng, static_cast<int>(mesh_from.size()), nd, ReduceOp::Sum, partial_odds);
    const Layout to = testing::random_layout(rng, static_cast<int>(mesh_to.size()), nd, ReduceOp::Sum, 0);
    const std::size_t chunk = rng() % 2 ? itemsize(dtype) : 1 + rng() % 64;
    const Tensor full = narrow ? testing::integer_tensor(shape, DType::Float32, seed + c).to(dtype)
                               : testing::integer_tensor(shape, dtype, seed + c);
    Failures failures;
    const std::string context =
        fmt::format("seed {} case {}: [{}] {} {} on mesh [{}] -> {} on mesh [{}], chunks of {} bytes", seed, c,
                    fmt::join(shape, ","), dtype, from, fmt::join(mesh_from, ","), to, fmt::join(mesh_to, ","), chunk);
    BOOST_TEST_CONTEXT(context) {
      round_trip(tmp.path / "ckpt", full, mesh_from, from, mesh_to, to, chunk, seed + c, failures);
      failures.report(context);
      // The saved boxes partition the tensor: each element written once.
      const auto manifest = ckpt::format::read_manifest(tmp.path / "ckpt");
      std::int64_t saved = 0;
      for (const auto& b : manifest.tensors.at("t").boxes) saved += b.box.numel();
      BOOST_TEST(saved == numel(shape));
    }
  }
}

// Mesh 2x2, (Replicate, Shard(0)): the ranks at coordinate 0 on the
// replicated dim write, one file each; the others write nothing.
BOOST_AUTO_TEST_CASE(one_writer_per_replicated_group, *boost::unit_test::precondition(ranks_available{4})) {
  const TempDir tmp("writers");
  const Tensor full = Tensor::arange({8, 3}, DType::Float64);
  testing::run_ranks(4, [&](Communicator& world) {
    const DeviceMesh mesh(world, {2, 2});
    ckpt::save((tmp.path / "c").string(), {{"w", from_full(full, mesh, Layout::parse("R,S(0)"))}});
  });
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(tmp.path / "c")) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  BOOST_TEST(files == (std::vector<std::string>{"manifest.json", "rank-00000.safetensors", "rank-00001.safetensors"}),
             fmt::format("{}", fmt::join(files, " ")));
  BOOST_TEST(equal(ckpt::load_full((tmp.path / "c").string()).at("w"), full));
  const auto header = ckpt::format::read_safetensors_header(tmp.path / "c" / "rank-00001.safetensors");
  BOOST_TEST_REQUIRE(header.size() == 1u);
  BOOST_TEST(header.begin()->first == "w@4,0");
  BOOST_TEST(header.begin()->second.shape == (Shape{4, 3}));
}

BOOST_AUTO_TEST_CASE(partial_is_reduced_or_refused, *boost::unit_test::precondition(ranks_available{4})) {
  const TempDir tmp("partial");
  const Tensor full = Tensor::arange({5}, DType::Float64);
  Failures failures;  // Boost.Test's assertions are not for the rank threads
  testing::run_ranks(4, [&](Communicator& world) {
    const DeviceMesh mesh(world, {4});
    const DTensor p = DTensor::from_local(Tensor::full({5}, 0.25, DType::Float64), mesh, Layout::parse("P(sum)"));
    ckpt::save((tmp.path / "c").string(), {{"p", p}});
    try {
      ckpt::save((tmp.path / "d").string(), {{"p", p}}, {.allow_communication = false});
      failures.add("a Partial tensor was saved without communication");
    } catch (const LayoutError& e) {
      if (std::string(e.what()).find("tensor p is P(sum)") == std::string::npos) failures.add(e.what());
    } catch (const std::exception& e) {
      failures.add(fmt::format("expected a LayoutError, got: {}", e.what()));
    }
  });
  failures.report("partial");
  BOOST_TEST(equal(ckpt::load_full((tmp.path / "c").string()).at("p"), Tensor::full({5}, 1.0, DType::Float64)));
  BOOST_TEST(!fs::exists(tmp.path / "d" / "manifest.json"));
}

// A save that fails on one rank throws on every rank and leaves the older
// checkpoint as it was; the next save replaces it.
BOOST_AUTO_TEST_CASE(a_failed_save_leaves_the_older_checkpoint, *boost::unit_test::precondition(ranks_available{4})) {
  const TempDir tmp("atomic");
  const std::string dir = (tmp.path / "c").string();
  const Tensor v1 = Tensor::arange({6, 2}, DType::Float32);
  const Tensor v2 = Tensor::full({6, 2}, 7.0, DType::Float32);
  auto save_on_4 = [&](const Tensor& value, std::function<void(int)> hook) {
    return [&, value, hook](Communicator& world) {
      const DeviceMesh mesh(world, {4});
      ckpt::save(dir, {{"w", from_full(value, mesh, Layout::parse("S(0)"))}}, {.before_writing = hook});
    };
  };
  testing::run_ranks(4, save_on_4(v1, {}));
  std::string type;
  const std::string message = error_on_every_rank(4,
                                                  save_on_4(v2,
                                                            [](int rank) {
                                                              if (rank == 2)
                                                                throw CheckpointError("[test] the disk is full");
                                                            }),
                                                  &type);
  BOOST_TEST(type == "CheckpointError");
  BOOST_TEST(message.find("[test] the disk is full") != std::string::npos, message);
  if (testing::test_backend() == "threads")  // rank 0's report names the rank that failed
    BOOST_TEST(message.find("rank 2 failed writing its boxes") != std::string::npos, message);
  BOOST_TEST(equal(ckpt::load_full(dir).at("w"), v1));
  testing::run_ranks(4, save_on_4(v2, {}));
  BOOST_TEST(equal(ckpt::load_full(dir).at("w"), v2));
  BOOST_TEST(!fs::exists(dir + ".saving"));
}

BOOST_AUTO_TEST_CASE(corrupt_truncated_and_missing_pieces_are_named,
                     *boost::unit_test::precondition(ranks_available{4})) {
  const TempDir tmp("corrupt");
  const fs::path dir = tmp.path / "c";
  const Tensor full = Tensor::arange({64}, DType::Float64);
  // A fresh save, then `damage` done once (by rank 0, the others waiting).
  auto save_then = [&](const std::function<void()>& damage) {
    testing::run_ranks(4, [&](Communicator& world) {
      const DeviceMesh mesh(world, {4});
      ckpt::save(dir.string(), {{"w", from_full(full, mesh, Layout::parse("S(0)"))}}, {.chunk_bytes = 64});
      if (world.rank() == 0) damage();
      world.barrier();
    });
  };
  // Loads `name` onto 4 ranks as `layout` (replicated), expecting shape and dtype.
  auto load_on_4 = [&](std::optional<Shape> shape = std::nullopt, std::optional<DType> dtype = std::nullopt,
                       std::string name = "w", std::string layout = "R") {
    return [&, shape, dtype, name, layout](Communicator& world) {
      const DeviceMesh mesh(world, {4});
      (void)ckpt::load(dir.string(), {{name, {mesh, Layout::parse(layout), shape, dtype}}});
    };
  };
  const fs::path file = dir / "rank-00001.safetensors";
  save_then([&] {
    const auto b = ckpt::format::read_manifest(dir).tensors.at("w").boxes.at(1);
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(b.begin + 70));
    f.put('\x7f');
  });
  std::string type;
  std::string m = error_on_every_rank(4, load_on_4(), &type);
  BOOST_TEST(type == "CheckpointError");
  for (const char* part : {"rank-00001.safetensors", "tensor w box", "chunk 1", "does not match its checksum"})
    BOOST_TEST(m.find(part) != std::string::npos, m);

  save_then([&] { fs::resize_file(file, fs::file_size(file) - 8); });
  m = error_on_every_rank(4, load_on_4(), &type);
  BOOST_TEST(m.find("the file ends before byte") != std::string::npos, m);

  save_then([&] { fs::remove(file); });
  m = error_on_every_rank(4, load_on_4(), &type);
  BOOST_TEST(m.find("rank-00001.safetensors named by the manifest cannot be opened") != std::string::npos, m);

  save_then([] {});
  m = error_on_every_rank(4, load_on_4(Shape{65}), &type);
  BOOST_TEST(m.find("tensor w was saved with shape [64]; the target expects [65]") != std::string::npos, m);
  m = error_on_every_rank(4, load_on_4(std::nullopt, DType::Float32), &type);
  BOOST_TEST(m.find("tensor w was saved as f64; the target expects f32") != std::string::npos, m);
  m = error_on_every_rank(4, load_on_4(std::nullopt, std::nullopt, "v"), &type);
  BOOST_TEST(type == "ValueError");
  BOOST_TEST(m.find("has no tensor 'v'; it has: w") != std::string::npos, m);
  m = error_on_every_rank(4, load_on_4(std::nullopt, std::nullopt, "w", "S(1)"), &type);
  BOOST_TEST(type == "ValueError");  // a LayoutError

  save_then([&] { fs::remove(dir / "manifest.json"); });
  m = error_on_every_rank(4, load_on_4(), &type);
  BOOST_TEST(m.find("has no manifest.json") != std::string::npos, m);
}

// A model split over groups (a pipeline's stages): each group of 2 ranks
// saves its own tensors, DTensors on its submesh, and one checkpoint of the
// whole results; a name two groups give with different shapes is refused
// on every rank.
BOOST_AUTO_TEST_CASE(groups_save_their_parts_of_one_checkpoint, *boost::unit_test::precondition(ranks_available{4})) {
  const TempDir tmp("parts");
  const std::string dir = (tmp.path / "c").string();
  const Tensor a = Tensor::arange({6, 4}, DType::Float64), b = Tensor::arange({5}, DType::Float32);
  testing::run_ranks(4, [&](Communicator& world) {
    const DeviceMesh mesh(world, {2, 2}, {"pp", "dp"});
    const DeviceMesh group = mesh.submesh({"dp"});
    std::map<std::string, DTensor> mine;
    if (mesh.coordinate()[0] == 0)
      mine.emplace("first.a", from_full(a, group, Layout::parse("S(0)")));
    else
      mine.emplace("second.b", from_full(b, group, Layout::parse("R")));
    ckpt::save_parts(dir, mine, world);
  });
  const auto got = ckpt::load_full(dir);
  BOOST_TEST(got.size() == 2u);
  BOOST_TEST((got.count("first.a") && equal(got.at("first.a"), a)));
  BOOST_TEST((got.count("second.b") && equal(got.at("second.b"), b)));
  BOOST_TEST(ckpt::verify(dir).tensors == 2u);
  std::string type;
  const std::string m = error_on_every_rank(
      4,
      [&](Communicator& world) {
        const DeviceMesh mesh(world, {2, 2}, {"pp", "dp"});
        const Tensor x = mesh.coordinate()[0] == 0 ? a : Tensor::arange({4}, DType::Float64);
        ckpt::save_parts((tmp.path / "bad").string(),
                         std::map<std::string, DTensor>{{"x", from_full(x, mesh.submesh({"dp"}), Layout::parse("R"))}},
                         world);
      },
      &type);
  BOOST_TEST(type == "ValueError", m);
  BOOST_TEST(m.find("tensor x is") != std::string::npos, m);
}

// A model's named_parameters(): saved from one layout, loaded back into
// parameters laid out otherwise on another mesh, in place, still requiring
// gradients; a parameter of another shape is refused and nothing replaced.
BOOST_AUTO_TEST_CASE(named_parameters_load_into_their_own_layouts,
                     *boost::unit_test::precondition(ranks_available{4})) {
  const TempDir tmp("named");
  const std::string dir = (tmp.path / "c").string();
  const Tensor w = Tensor::arange({6, 4}, DType::Float64), b = Tensor::arange({4}, DType::Float64);
  testing::run_ranks(4, [&](Communicator& world) {
    const DeviceMesh mesh(world, {2, 2});
    DTensor pw = from_full(w, mesh, Layout::parse("S(0),S(1)")), pb = from_full(b, mesh, Layout::parse("R,R"));
    ckpt::save(dir, std::vector<std::pair<std::string, DTensor*>>{{"w", &pw}, {"b", &pb}});
  });
  Failures failures;
  testing::run_ranks(4, [&](Communicator& world) {
    const DeviceMesh mesh(world, {4});
    DTensor pw = DTensor::from_local(Tensor::zeros({6, 1}, DType::Float64), mesh, Layout::parse("S(1)"), Shape{6, 4});
    DTensor pb = DTensor::from_local(Tensor::zeros({1}, DType::Float64), mesh, Layout::parse("S(0)"), Shape{4});
    pw.requires_grad_();
    DTensor wrong = DTensor::from_local(Tensor::zeros({5}, DType::Float64), mesh, Layout::parse("R"), Shape{5});
    try {
      ckpt::load_into(dir, {{"w", &pw}, {"b", &wrong}});
      failures.add("a parameter of shape [5] took b's [4] values");
    } catch (const ShapeError&) {
    }
    if (!equal(pw.to_local(), Tensor::zeros({6, 1}, DType::Float64))) failures.add("w was replaced by a failed load");
    ckpt::load_into(dir, {{"w", &pw}, {"b", &pb}});
    if (pw.placements() != Layout::parse("S(1)") || !pw.requires_grad())
      failures.add(fmt::format("w is {} (requires_grad {})", pw.placements(), pw.requires_grad()));
    if (!equal(pw.full_tensor(), w) || !equal(pb.full_tensor(), b)) failures.add("the loaded values differ");
  });
  failures.report("load_into");
}

// Plain tensors in one process: a 1-rank checkpoint, read whole.
BOOST_AUTO_TEST_CASE(plain_tensors_round_trip) {
  const TempDir tmp("plain", /*shared=*/false);
  const std::map<std::string, Tensor> tensors{{"a", Tensor::arange({3, 4}, DType::BFloat16)},
                                              {"b", Tensor::zeros({0, 5}, DType::Float32)},
                                              {"c", Tensor::full({}, 2.5, DType::Float64)}};
  ckpt::save((tmp.path / "c").string(), tensors);
  const auto got = ckpt::load_full((tmp.path / "c").string());
  BOOST_TEST_REQUIRE(got.size() == 3u);
  for (const auto& [name, t] : tensors) BOOST_TEST(equal(got.at(name), t), name);
}

BOOST_AUTO_TEST_SUITE_END()
