// Save and load throughput of dtensor::dcp against plain POSIX I/O of the
// same bytes, measured in the same run.
//
// The checkpoint: --tensors f32 tensors (default 4) of --mib MiB in all
// (default 1024), each [rows, 1024], laid out S(0) on a 1-D mesh of --ranks
// thread ranks (default 8), or of the job's processes under mpirun. Rows:
//   save  S(0), N ranks   dcp::save                  vs plain write()+fsync
//   load  S(0), N ranks   dcp::load, same layout     vs plain read()
//   load  S(0), N/2 ranks dcp::load on a split group vs plain read()
//   load  S(1), N ranks   dcp::load, other layout    vs plain read()
// "plain" is rank 0 alone writing the checkpoint's total bytes to one file
// with write(), then fsync of the file and of its directory, and reading
// them back with read() into a fresh buffer (a loader must return new
// memory, as dcp::load does). dcp::save fsyncs each rank's file, the
// manifest and the directories, so both sides pay for durability. Nothing
// is dropped from the page cache: both loads read files just written, warm.
// GiB/s is the checkpoint's total bytes over the wall time on rank 0 from a
// barrier to a barrier after the call, best of --rounds rounds, each round
// running dtensor and plain back to back. `read/needed` is the file bytes
// all ranks read over the bytes of their target shards (LoadStats): 1.00
// when each rank reads only what it keeps; S(1) from S(0) boxes reads whole
// 1 MiB checksummed chunks of every box on every rank.
// The values loaded in the first round are compared with what was saved.
// glibc's mmap threshold is pinned at its default (128 KiB): left dynamic,
// it rises after the first free of a block up to 32 MiB, so that later
// rounds reuse already-mapped memory for shards up to that size but not for
// larger ones, nor for plain's buffer (4 ranks at 256 MiB loaded 2.5x
// faster than plain that way, against 0.8x pinned); pinned, every load maps
// new memory, as a process's one load at start-up does.
//
// Run (OPENBLAS_CORETYPE unset for figures you quote):
//   env -u OPENBLAS_CORETYPE build/bench/checkpoint                   # 1 GiB, 8 thread ranks
//   env -u OPENBLAS_CORETYPE build/bench/checkpoint --mib 256 --ranks 2
//   mpirun -np 4 build/bench/checkpoint --mib 256                     # the job's processes
//   build/bench/checkpoint --json                                     # one JSON object per row
// Under mpirun the processes must share --dir (one node, or a shared file
// system); rank 0's plain I/O runs while the others wait in a barrier.
#include <dtensor/checkpoint/checkpoint.h>
#include <dtensor/dtensor.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdlib.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace dtensor;
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

// Columns of every tensor: rows of 4 KiB, so that an S(1) shard of a row is
// a run of 1024 / N floats.
constexpr std::int64_t kColumns = 1024;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;
constexpr int kGlibcDefaultMmapThreshold = 128 * 1024;  // M_MMAP_THRESHOLD, mallopt(3)
constexpr std::uint64_t kSeed = 2024;  // tensor i holds Tensor::rand(shape, f32, kSeed + i)

struct Options {
  std::int64_t mib = 1024;
  int tensors = 4;
  int ranks = 8;
  int rounds = 3;
  std::string parent = "/tmp";
  bool json = false;
};

// The checkpoint's tensors: names and one global shape.
struct Checkpoint {
  std::vector<std::string> names;
  Shape shape;
  std::uint64_t total_bytes = 0;
};

Checkpoint checkpoint_of(const Options& o) {
  Checkpoint c;
  const std::int64_t rows =
      std::max<std::int64_t>(1, o.mib * (1 << 20) / o.tensors / (kColumns * static_cast<std::int64_t>(sizeof(float))));
  c.shape = {rows, kColumns};
  for (int i = 0; i < o.tensors; ++i) c.names.push_back(fmt::format("layer{}.weight", i));
  c.total_bytes = static_cast<std::uint64_t>(o.tensors * rows * kColumns) * sizeof(float);
  return c;
}

// One row of the table; times are rank 0's best over the rounds.
struct Row {
  std::string operation;
  std::string layout;
  int ranks = 0;
  double dtensor_seconds = std::numeric_limits<double>::infinity();
  double plain_seconds = std::numeric_limits<double>::infinity();
  double read_over_needed = 0;  // loads only
};

// Rank 0's wall time of fn on every rank, from a barrier to a barrier.
double timed(Communicator& world, const std::function<void()>& fn) {
  world.barrier();
  const auto start = Clock::now();
  fn();
  world.barrier();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

[[noreturn]] void fail(const std::string& what, const fs::path& path) {
  throw std::runtime_error(fmt::format("[bench/checkpoint] {} {}: {}", what, path.string(), std::strerror(errno)));
}

void fsync_path(const fs::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) fail("fsync of", path);
  ::close(fd);
}

// The plain side of a save: one file, write() until done, fsync of the
// file and of its directory (what a durable new file needs).
void write_plain(const fs::path& path, const std::byte* data, std::size_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("opening", path);
  for (std::size_t done = 0; done < bytes;) {
    const ssize_t n = ::write(fd, data + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing", path);
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync of", path);
  ::close(fd);
  fsync_path(path.parent_path(), O_RDONLY | O_DIRECTORY);
}

// The plain side of a load: the whole file with read() into new memory.
std::unique_ptr<std::byte[]> read_plain(const fs::path& path, std::size_t bytes) {
  std::unique_ptr<std::byte[]> out(new std::byte[bytes]);  // uninitialised, as a loader's would be
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("opening", path);
  for (std::size_t done = 0; done < bytes;) {
    const ssize_t n = ::read(fd, out.get() + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("reading", path);
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return out;
}

// This rank's shards of the checkpoint's tensors, S(0) on `mesh`.
std::map<std::string, DTensor> make_tensors(const DeviceMesh& mesh, const Checkpoint& c) {
  const Layout layout = Layout::parse("S(0)");
  const Box box = local_box(mesh.shape(), c.shape, layout, mesh.coordinate());
  std::map<std::string, DTensor> out;
  for (std::size_t i = 0; i < c.names.size(); ++i) {
    Tensor local = Tensor::empty(box.size, DType::Float32);
    fill_random(local, kSeed + i, c.shape, box.offset);
    out.emplace(c.names[i], DTensor::from_local(std::move(local), mesh, layout, c.shape, FromLocalCheck::Trust));
  }
  return out;
}

std::map<std::string, dcp::Target> targets_of(const DeviceMesh& mesh, const std::string& layout,
                                              const Checkpoint& c) {
  std::map<std::string, dcp::Target> out;
  for (const std::string& name : c.names)
    out.emplace(name, dcp::Target{mesh, Layout::parse(layout), c.shape, DType::Float32});
  return out;
}

// Throws unless every loaded shard holds the values that were saved.
void check_loaded(const std::map<std::string, DTensor>& loaded, const Checkpoint& c) {
  for (std::size_t i = 0; i < c.names.size(); ++i) {
    const DTensor& t = loaded.at(c.names[i]);
    const Box box = t.local_box();
    Tensor expected = Tensor::empty(box.size, DType::Float32);
    fill_random(expected, kSeed + i, c.shape, box.offset);
    if (std::memcmp(expected.bytes(), t.to_local().bytes(), expected.nbytes()) != 0)
      throw std::runtime_error(fmt::format("[bench/checkpoint] tensor {} box {} as {} loaded other values than saved",
                                           c.names[i], box, t.placements()));
  }
}

// One load variant: `layout` on the first `ranks` ranks of the world.
struct LoadCase {
  std::string layout;
  int ranks;
};

std::vector<LoadCase> load_cases(int world_size) {
  std::vector<LoadCase> out{{"S(0)", world_size}};
  if (world_size >= 2) out.push_back({"S(0)", world_size / 2});
  out.push_back({"S(1)", world_size});
  return out;
}

}  // namespace

namespace {

// A load variant's group: the first `load.ranks` ranks of the world, split
// off once (a collective); the others have no mesh and wait.
struct LoadGroup {
  LoadCase load;
  std::unique_ptr<Communicator> comm;
  std::optional<DeviceMesh> mesh;
};

// What one rank keeps across the rounds.
struct Bench {
  Communicator& world;
  Checkpoint checkpoint;
  fs::path dir;  // fresh, removed at the end by rank 0
  std::map<std::string, DTensor> tensors;
  std::vector<std::byte> plain_source;  // rank 0: the bytes plain I/O writes
  std::vector<LoadGroup> loads;

  bool lead() const { return world.rank() == 0; }
  fs::path checkpoint_dir() const { return dir / "checkpoint"; }
  fs::path plain_file() const { return dir / "plain.bin"; }
};

// A fresh directory under `parent`, made by rank 0 and named to all.
fs::path make_work_dir(Communicator& world, const std::string& parent) {
  std::array<char, 4096> path{};
  if (world.rank() == 0) {
    std::string pattern = (fs::path(parent) / "dtensor-bench-checkpoint-XXXXXX").string();
    if (pattern.size() >= path.size() || ::mkdtemp(pattern.data()) == nullptr) fail("making a directory in", parent);
    std::copy(pattern.begin(), pattern.end(), path.begin());
  }
  world.broadcast_host(path.data(), path.size(), 0);
  return fs::path(path.data());
}

std::vector<LoadGroup> split_load_groups(Communicator& world) {
  std::vector<LoadGroup> out;
  for (const LoadCase& load : load_cases(world.size())) {
    LoadGroup g{load, world.split(world.rank() < load.ranks ? 0 : -1, world.rank()), std::nullopt};
    if (g.comm) g.mesh.emplace(*g.comm, Shape{load.ranks});
    out.push_back(std::move(g));
  }
  return out;
}

void keep_best(double& best, double seconds) { best = std::min(best, seconds); }

// One load variant then the plain read, both timed into `row`; the loaded
// values are compared with the saved ones when `check`.
void measure_load(Bench& b, const LoadGroup& g, bool check, Row& row) {
  std::map<std::string, dcp::Target> targets;
  if (g.mesh) targets = targets_of(*g.mesh, g.load.layout, b.checkpoint);
  std::map<std::string, DTensor> loaded;
  dcp::LoadStats stats;
  keep_best(row.dtensor_seconds, timed(b.world, [&] {
              if (g.mesh) loaded = dcp::load(b.checkpoint_dir().string(), targets, &stats);
            }));
  const double mine[2] = {static_cast<double>(stats.bytes_read), static_cast<double>(stats.bytes_needed)};
  double all[2] = {0, 0};
  b.world.all_reduce(mine, all, 2, DType::Float64, ReduceOp::Sum);
  row.read_over_needed = all[0] / all[1];
  if (check && g.mesh) check_loaded(loaded, b.checkpoint);
  loaded.clear();  // freed outside the timings, as the plain buffer below

  std::unique_ptr<std::byte[]> plain;
  keep_best(row.plain_seconds, timed(b.world, [&] {
              if (b.lead()) plain = read_plain(b.plain_file(), b.checkpoint.total_bytes);
            }));
}

// One round: save, plain write, then each load with a plain read after it.
void run_round(Bench& b, bool first, std::vector<Row>& rows) {
  if (b.lead()) {  // both sides write new files, untimed removal of the last round's
    fs::remove_all(b.checkpoint_dir());
    fs::remove(b.plain_file());
  }
  keep_best(rows[0].dtensor_seconds, timed(b.world, [&] { dcp::save(b.checkpoint_dir().string(), b.tensors); }));
  keep_best(rows[0].plain_seconds, timed(b.world, [&] {
              if (b.lead()) write_plain(b.plain_file(), b.plain_source.data(), b.plain_source.size());
            }));
  for (std::size_t i = 0; i < b.loads.size(); ++i) measure_load(b, b.loads[i], first, rows[i + 1]);
}

double gib_per_second(const Checkpoint& c, double seconds) { return static_cast<double>(c.total_bytes) / kGiB / seconds; }

void print_header(const Options& o, const Checkpoint& c, int ranks, std::string_view backend, const fs::path& dir) {
  fmt::print("checkpoint: {} f32 tensors [{}] ({:.2f} GiB), saved S(0) on a 1-D mesh of {} {} ranks; best of {} "
             "rounds in {}\n",
             c.names.size(), fmt::join(c.shape, ","), static_cast<double>(c.total_bytes) / kGiB, ranks, backend,
             o.rounds, dir.string());
  fmt::print("plain: rank 0 write()s one file + fsync (file, directory), read()s it into a new buffer; page cache "
             "warm for both loads\n");
  fmt::print("{:<6} {:>6} {:>5} {:>14} {:>12} {:>8} {:>12}\n", "op", "layout", "ranks", "dtensor GiB/s",
             "plain GiB/s", "ratio", "read/needed");
}

void print_row(const Row& r, const Checkpoint& c, std::string_view backend, bool json) {
  const double dtensor = gib_per_second(c, r.dtensor_seconds), plain = gib_per_second(c, r.plain_seconds);
  if (json) {
    fmt::print("{{\"operation\": \"{}\", \"layout\": \"{}\", \"ranks\": {}, \"backend\": \"{}\", \"bytes\": {}, "
               "\"dtensor_gib_per_s\": {:.4f}, \"plain_gib_per_s\": {:.4f}, \"ratio\": {:.4f}, "
               "\"read_over_needed\": {}}}\n",
               r.operation, r.layout, r.ranks, backend, c.total_bytes, dtensor, plain, dtensor / plain,
               r.operation == "save" ? "null" : fmt::format("{:.4f}", r.read_over_needed));
  } else {
    const std::string read = r.operation == "save" ? "-" : fmt::format("{:.2f}", r.read_over_needed);
    fmt::print("{:<6} {:>6} {:>5} {:>14.2f} {:>12.2f} {:>8.2f} {:>12}\n", r.operation, r.layout, r.ranks, dtensor,
               plain, dtensor / plain, read);
  }
  std::fflush(stdout);
}

std::vector<Row> empty_rows(const Bench& b) {
  std::vector<Row> rows{{.operation = "save", .layout = "S(0)", .ranks = b.world.size()}};
  for (const LoadGroup& g : b.loads) rows.push_back({.operation = "load", .layout = g.load.layout, .ranks = g.load.ranks});
  return rows;
}

// Everything one rank does; rank 0 prints.
void run_rank(Communicator& world, const Options& o, std::string_view backend) {
  Bench b{world, checkpoint_of(o), make_work_dir(world, o.parent), {}, {}, {}};
  struct RemoveAtEnd {
    const Bench& b;
    ~RemoveAtEnd() {
      std::error_code ignored;
      if (b.lead()) fs::remove_all(b.dir, ignored);
    }
  } remove_at_end{b};
  const DeviceMesh mesh(world, {world.size()});
  b.tensors = make_tensors(mesh, b.checkpoint);
  if (b.lead()) {
    b.plain_source.resize(b.checkpoint.total_bytes);
    std::memset(b.plain_source.data(), 0x5a, b.plain_source.size());  // real pages, not the zero page
  }
  b.loads = split_load_groups(world);
  if (b.lead() && !o.json) print_header(o, b.checkpoint, world.size(), backend, b.dir);
  std::vector<Row> rows = empty_rows(b);
  for (int round = 0; round < o.rounds; ++round) run_round(b, round == 0, rows);
  if (b.lead())
    for (const Row& r : rows) print_row(r, b.checkpoint, backend, o.json);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"checkpoint: dcp::save / dcp::load throughput against plain write()/read() of the same bytes"};
  Options o;
  app.add_option("--mib", o.mib, "checkpoint size in MiB, all tensors together")->check(CLI::PositiveNumber);
  app.add_option("--tensors", o.tensors, "f32 tensors [rows, 1024] sharing the size")->check(CLI::Range(1, 1024));
  app.add_option("--ranks", o.ranks, "thread ranks (under mpirun: ignored, the job's size)")
      ->check(CLI::Range(1, 256));
  app.add_option("--rounds", o.rounds, "rounds; each row is the best")->check(CLI::Range(1, 1000));
  app.add_option("--dir", o.parent, "where the bench makes (and at the end removes) its directory")
      ->check(CLI::ExistingDirectory);
  app.add_flag("--json", o.json, "one JSON object per row instead of the table");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "checkpoint: {}\n", e.what());
    return 2;
  }
  ::mallopt(M_MMAP_THRESHOLD, kGlibcDefaultMmapThreshold);  // see the top of the file
  if (launch_backend() == "mpi") {
    int launch_argc = 1;  // launch() sees no flags of ours
    return launch(launch_argc, argv, [&](Communicator& world) { run_rank(world, o, "MPI"); });
  }
  try {
    run_threads(o.ranks, [&](Communicator& world) { run_rank(world, o, "thread"); });
  } catch (const std::exception& e) {
    fmt::print(stderr, "checkpoint: {}\n", e.what());
    return 1;
  }
  return 0;
}
