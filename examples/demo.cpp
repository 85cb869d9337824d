// The first program to run: a tensor on a 2x4 mesh of 8 ranks walks through
// a few layouts. For each move it prints the plan the library chose, the
// bytes each rank received, and checks every shard against the unsharded
// tensor. The same binary runs on thread ranks or as an MPI job:
//   build/examples/demo --ranks 8
//   mpirun -np 8 build/examples/demo
//   build/examples/demo --ranks 8 --device cuda   (8 simulated ranks on one GPU)
#include <dtensor/dtensor.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <numeric>
#include <atomic>
#include <optional>

using namespace dtensor;

namespace {

// Prints which box of the global tensor every rank holds under `layout`.
void print_layout(const Shape& mesh_shape, const Shape& shape, const Layout& layout) {
  fmt::print("  layout {} of a {} tensor:\n", layout, fmt::join(shape, "x"));
  for (std::int64_t r = 0; r < numel(mesh_shape); ++r) {
    Shape coord = unravel_index(r, mesh_shape);
    Box box = local_box(mesh_shape, shape, layout, coord);
    std::string note;
    for (int m = 0; m < layout.mesh_ndim(); ++m)
      if (auto* p = std::get_if<Partial>(&layout[m])) note = fmt::format("  (partial {} over mesh dim {})", p->op, m);
    fmt::print("    rank {} at ({}) holds {}{}\n", r, fmt::join(coord, ","), box, note);
  }
}

struct Step {
  std::string title;
  std::string to;
};

// Step 1 and the moves after it: a 12x10 tensor distributed from rank 0,
// then redistributed through `steps`, every shard checked and the busiest
// rank's received bytes measured against the plan's. Returns this rank's
// failed checks; `n` is left at the next step's number.
std::int64_t walk_layouts(Communicator& comm, const DeviceMesh& mesh, const Shape& shape, int& n) {
  const std::vector<Step> steps{
      {"gather the columns back (all_gather along tp)", "S(0),R"},
      {"move the split from rows to columns on dp (all_to_all)", "S(1),R"},
      {"shard rows by tp inside each dp column half", "S(1),S(0)"},
      {"swap which mesh dim splits which tensor dim", "S(0),S(1)"},
      {"replicate everywhere", "R,R"},
  };
  const Shape& mesh_shape = mesh.shape();
  const bool lead = comm.rank() == 0;
  std::int64_t failures = 0;
  Tensor full = Tensor::arange(shape, DType::Float32);
  if (lead) {
    fmt::print("dtensor demo: {} ranks as a {} mesh ({}), a {} float32 tensor holding 0..{}\n\n", comm.size(),
               fmt::join(mesh_shape, "x"), fmt::join(mesh.dim_names(), ","), fmt::join(shape, "x"), full.numel() - 1);
    fmt::print("1. distribute_tensor from rank 0 as S(0),S(1): rows over dp, columns over tp\n");
    print_layout(mesh_shape, shape, Layout::parse("S(0),S(1)"));
  }
  DTensor x = distribute_tensor(lead ? full : Tensor(), mesh, Layout::parse("S(0),S(1)"));
  n = 2;
  for (const Step& step : steps) {
    Layout to = Layout::parse(step.to);
    const Plan& plan = x.plan_to(to);
    CommStats before = comm.stats();
    DTensor y = x.redistribute(to);
    const std::uint64_t mine = (comm.stats() - before).recv_bytes;
    if (!equal(y.to_local(), slice_box(full, y.local_box()))) {
      failures++;
      fmt::print("  rank {}: WRONG shard after {} -> {}\n", comm.rank(), x.placements(), to);
    }
    // Every rank's count, for the busiest (ranks may be processes: no
    // shared memory, so they are gathered like any data).
    std::vector<std::uint64_t> recv(static_cast<std::size_t>(comm.size()));
    comm.all_gather_host(&mine, recv.data(), sizeof mine);
    if (lead) {
      fmt::print("\n{}. {}: {} -> {}\n", n, step.title, x.placements(), to);
      fmt::print("{}\n", plan);
      std::uint64_t busiest = *std::max_element(recv.begin(), recv.end());
      fmt::print("  measured: the busiest rank received {} bytes (plan said {}); every shard checked\n", busiest,
                 plan.max_recv_bytes());
      print_layout(mesh_shape, shape, to);
    }
    x = y;
    ++n;
  }
  return failures;
}

// Step n: a Partial tensor, every rank holding ones; the sum over tp is its
// size. Returns this rank's failed checks.
std::int64_t reduce_partial(const DeviceMesh& mesh, bool lead, int n) {
  const Shape& mesh_shape = mesh.shape();
  DTensor p = DTensor::from_local(Tensor::ones({3, 5}, DType::Float32, mesh.device()), mesh, Layout::parse("R,P(sum)"),
                                  Shape{3, 5});
  Tensor reduced = p.full_tensor();
  if (lead) {
    fmt::print("\n{}. a Partial(sum) over tp of ones, reduced: every element is {} (expected {})\n", n,
               reduced.get({0, 0}), mesh_shape[1]);
    fmt::print("{}\n", p.plan_to(Layout::replicated(2)));
  }
  return reduced.get({2, 4}) != static_cast<double>(mesh_shape[1]) ? 1 : 0;
}

// Step n: a Megatron MLP, data parallel over dp, tensor parallel over tp.
// Only the weights are placed by hand; propagation finds the rest. Returns
// this rank's failed checks.
std::int64_t megatron_mlp(const DeviceMesh& mesh, bool lead, int n) {
  Tensor x_full = Tensor::rand({8, 8}, DType::Float64, 11);
  Tensor w1_full = Tensor::rand({16, 8}, DType::Float64, 12);  // [ffn, hidden]: column-parallel
  Tensor w2_full = Tensor::rand({8, 16}, DType::Float64, 13);  // [hidden, ffn]: row-parallel
  DTensor xs = distribute_tensor(lead ? x_full : Tensor(), mesh, Layout::parse("S(0),R"));
  DTensor w1 = distribute_tensor(lead ? w1_full : Tensor(), mesh, Layout::parse("R,S(0)"));
  DTensor w2 = distribute_tensor(lead ? w2_full : Tensor(), mesh, Layout::parse("R,S(1)"));
  if (lead)
    fmt::print(
        "\n{}. a Megatron MLP, y = gelu(x W1^T) W2^T: x {} over dp, W1 {} (column-parallel), W2 {} "
        "(row-parallel)\n",
        n, xs.placements(), w1.placements(), w2.placements());
  CommCounter counter(mesh);
  std::vector<std::string> explained;
  auto explain_sink = [&](const std::string& line) { explained.push_back(line); };
  DTensor y = [&] {
    std::optional<ExplainScope> explain;
    if (lead) explain.emplace(explain_sink);
    DTensor h = call_op("gelu", {call_op("linear", {xs, w1})});
    return call_op("linear", {h, w2});
  }();
  DTensor y_out = y.redistribute(xs.placements());  // the output wanted back in x's layout
  CommStats used = counter.counts();
  Tensor y_full = y_out.full_tensor();
  Tensor y_ref = call_op("linear", {call_op("gelu", {call_op("linear", {x_full, w1_full})}), w2_full});
  const bool matches = allclose(y_full, y_ref, 1e-9, 1e-9);
  if (lead) {
    for (auto& line : explained) fmt::print("  {}\n", line);
    fmt::print("  y is {} until needed; back to {}: {}\n", y.placements(), y_out.placements(), used);
    fmt::print("  (Megatron's forward: exactly one all_reduce, on tp; result {})\n",
               matches ? "matches the unsharded MLP" : "WRONG");
  }
  return matches ? 0 : 1;
}

// One verdict for the whole job, on every rank: the failed checks of all
// ranks together, printed by rank 0.
std::int64_t job_verdict(Communicator& comm, std::int64_t failures) {
  std::vector<std::int64_t> all_failures(static_cast<std::size_t>(comm.size()));
  comm.all_gather_host(&failures, all_failures.data(), sizeof failures);
  failures = std::accumulate(all_failures.begin(), all_failures.end(), std::int64_t{0});
  if (comm.rank() == 0) {
    if (failures)
      fmt::print("\n{} check(s) FAILED\n", failures);
    else
      fmt::print("\nall shards matched the unsharded tensor\n");
  }
  return failures;
}

// One rank's demo on a 2 x size/2 mesh; returns the job's failed checks.
std::int64_t run_demo(Communicator& comm) {
  if (comm.size() % 2)
    throw ValueError(fmt::format("the demo's mesh is 2 x n: expected an even number of ranks, got {}", comm.size()));
  DeviceMesh mesh(comm, Shape{2, comm.size() / 2}, {"dp", "tp"});
  const bool lead = comm.rank() == 0;
  const Shape shape{12, 10};  // 12 rows over 2, 10 columns over 4: uneven on purpose
  int n = 0;
  std::int64_t failures = walk_layouts(comm, mesh, shape, n);
  failures += reduce_partial(mesh, lead, n);
  ++n;
  failures += megatron_mlp(mesh, lead, n);
  return job_verdict(comm, failures);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtensor demo: one tensor, several layouts, the plans between them"};
  int ranks = 8;
  app.add_option("--ranks", ranks, "thread ranks, even (the mesh is 2 x ranks/2); under mpirun the job's processes")
      ->check(CLI::Range(2, 64));
  std::string device = "cpu";  // read by launch(); declared here for --help
  app.add_option("--device", device,
                 "where the ranks keep their shards: cpu, or cuda (thread ranks share one GPU; "
                 "under mpirun, one GPU per process over NCCL)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  CLI11_PARSE(app, argc, argv);
  std::atomic<std::int64_t> failures_seen{0};  // thread ranks all store the same verdict

  LaunchOptions options;
  options.default_ranks = 8;
  const int rc = launch(
      argc, argv, [&](Communicator& comm) { failures_seen.store(run_demo(comm)); }, options);
  if (rc != 0) return rc;
  return failures_seen ? 1 : 0;
}
