// dtensor-plan: prints how dtensor would redistribute a tensor from one
// layout to another, and with --run executes and checks it on thread ranks
// (one per mesh rank) or, under mpirun, on the processes of the MPI job.
#include <cctype>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <atomic>
#include <fstream>
#include <iostream>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "dtensor/dtensor.h"
#include "dtensor/pictures/svg.h"
#include "layout_text.h"
#include "plan_run.h"

namespace {

using namespace dtensor;

constexpr int kExitVerifyFailed = 1;
constexpr int kExitUsage = 2;
constexpr int kExitOutOfMemory = 3;
// --run holds every rank's source and target shard at once (thread ranks
// share one process; under MPI rank 0 collects every result), besides the
// executor's buffers: beyond this much the run is refused up front.
constexpr std::int64_t kRunBudgetBytes = std::int64_t{1} << 30;  // 1 GiB
constexpr int kMaxMeshDims = 4;
// Beyond the planner's limit a plan would take too long and too much memory
// to make; beyond kMaxRunRanks --run's one thread per rank stops being useful
// on one machine.
constexpr std::int64_t kMaxRanks = dtensor::kMaxPlanRanks;
constexpr std::int64_t kMaxRunRanks = 256;

/// A bad argument: the message names the option and the value.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string mesh, shape, dtype = "f32", from, to, slow_dims;
  std::string svg;                      // --svg FILE: the plan's picture
  std::string html;                     // --html FILE: the page with the picture, the steps and a hover
  std::vector<std::string> dim_names;  // --dims dp,tp: the mesh dims' names in pictures
  // As typed: the argument parser would clamp or wrap values out of range.
  std::optional<std::string> ranks_text;
  std::string seed_text = "0";
  bool json = false, run = false;
  // Checked from the texts by parse_numbers.
  std::optional<std::int64_t> ranks;
  std::uint64_t seed = 0;
};

// A library message without its "[where] " prefix, for quoting after ours.
std::string_view bare(std::string_view what) {
  if (what.starts_with('[')) {
    auto close = what.find("] ");
    if (close != std::string_view::npos) return what.substr(close + 2);
  }
  return what;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Comma- or x-separated non-negative integers; names the bad item.
std::vector<std::int64_t> parse_ints(std::string_view option, std::string_view text, std::string_view seps,
                                     std::string_view example) {
  std::vector<std::int64_t> out;
  std::string_view rest = text;
  while (true) {
    auto pos = rest.find_first_of(seps);
    std::string_view item = trim(rest.substr(0, pos));
    std::int64_t v = 0;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || ptr != item.data() + item.size() || v < 0)
      throw UsageError(fmt::format("{} '{}': '{}' is not a size: expected e.g. {}", option, text, item, example));
    out.push_back(v);
    if (pos == std::string_view::npos) break;
    rest = rest.substr(pos + 1);
  }
  return out;
}

// The integer options, base 10, digits only: a value outside [lo, hi] is
// refused, never clamped or wrapped.
std::uint64_t parse_whole(std::string_view option, std::string_view text, std::uint64_t lo, std::uint64_t hi,
                          std::string_view what) {
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < lo || v > hi)
    throw UsageError(fmt::format("{} '{}': expected {} from {} to {}", option, text, what, lo, hi));
  return v;
}

void parse_numbers(Options& o) {
  if (o.ranks_text)
    o.ranks = static_cast<std::int64_t>(
        parse_whole("--ranks", *o.ranks_text, 1, static_cast<std::uint64_t>(kMaxRanks), "a whole number of ranks"));
  o.seed = parse_whole("--seed", o.seed_text, 0, std::numeric_limits<std::uint64_t>::max(), "a whole-number seed");
}

Shape parse_mesh(const Options& o) {
  Shape mesh = parse_ints("--mesh", o.mesh, "x,", "2x4 (1 to 4 dims)");
  if (static_cast<int>(mesh.size()) > kMaxMeshDims)
    throw UsageError(fmt::format("--mesh '{}': {} dims; a mesh has 1 to {} dims", o.mesh, mesh.size(), kMaxMeshDims));
  for (std::size_t m = 0; m < mesh.size(); ++m)
    if (mesh[m] < 1)
      throw UsageError(fmt::format("--mesh '{}': mesh dim {} has size {}; every mesh dim needs at least 1 rank", o.mesh,
                                   m, mesh[m]));
  const std::optional<std::int64_t> product = checked_product(mesh);
  if (!product)
    throw UsageError(
        fmt::format("--mesh '{}': its rank count does not fit in int64; the planner handles at most {} "
                    "ranks",
                    o.mesh, kMaxRanks));
  if (*product > kMaxRanks)
    throw UsageError(fmt::format("--mesh '{}': {} ranks; the planner handles at most {}", o.mesh, *product, kMaxRanks));
  const std::int64_t ranks = *product;
  if (o.run && ranks > kMaxRunRanks)
    throw UsageError(fmt::format("--mesh '{}' has {} ranks: --run starts one thread per rank, at most {}", o.mesh,
                                 ranks, kMaxRunRanks));
  if (o.ranks && ranks != *o.ranks)
    throw UsageError(fmt::format("--mesh '{}' has {} ranks, but --ranks {}: the mesh must multiply out to the ranks",
                                 o.mesh, ranks, *o.ranks));
  return mesh;
}

Shape parse_global_shape(const Options& o) {
  try {
    return parse_shape(o.shape);
  } catch (const dtensor::Error& e) {
    throw UsageError(fmt::format("--shape '{}': {}", o.shape, bare(e.what())));
  }
}

DType parse_cpu_dtype(const Options& o) {
  std::optional<DType> d;
  try {
    d = parse_dtype(o.dtype);
  } catch (const dtensor::Error&) {
  }
  // The planner's tables are taken for the dtypes the CPU computes natively.
  if (!d || (*d != DType::Float32 && *d != DType::Float64 && *d != DType::Int64))
    throw UsageError(fmt::format("--dtype '{}': expected f32, f64 or i64", o.dtype));
  return *d;
}

Layout parse_layout(std::string_view option, const std::string& text, const Shape& mesh, const Shape& shape) {
  Layout layout;
  try {
    layout = Layout::parse(text);
  } catch (const dtensor::Error& e) {
    throw UsageError(fmt::format("{} '{}': {}", option, text, bare(e.what())));
  }
  try {
    return validate_layout(layout, mesh, shape);
  } catch (const dtensor::Error& e) {
    throw UsageError(fmt::format("{} '{}' does not fit --mesh {} --shape {}: {}", option, text, fmt::join(mesh, "x"),
                                 shape.empty() ? "''" : fmt::format("{}", fmt::join(shape, ",")), bare(e.what())));
  }
}

CostModel parse_cost_model(const Options& o, const Shape& mesh) {
  CostModel cost;
  if (trim(o.slow_dims).empty()) return cost;
  cost.links.assign(mesh.size(), cost.default_link);
  for (std::int64_t d : parse_ints("--slow-dims", o.slow_dims, ",", "0 or 0,1")) {
    if (d >= static_cast<std::int64_t>(mesh.size()))
      throw UsageError(fmt::format("--slow-dims '{}': mesh dim {} out of range: the mesh {} has dims 0..{}",
                                   o.slow_dims, d, fmt::join(mesh, "x"), mesh.size() - 1));
    cost.links[static_cast<std::size_t>(d)] = inter_node_link();
  }
  return cost;
}

std::string layout_text(const Layout& l) { return fmt::format("{}", l); }

nlohmann::ordered_json plan_json(const Plan& plan) {
  nlohmann::ordered_json j;
  j["mesh"] = plan.mesh_shape;
  j["shape"] = plan.global_shape;
  j["dtype"] = std::string(dtype_name(plan.dtype));
  j["from"] = layout_text(plan.from);
  j["to"] = layout_text(plan.to);
  j["steps"] = nlohmann::ordered_json::array();
  for (const PlanStep& s : plan.steps)
    j["steps"].push_back(
        {{"op", std::string(step_name(s.kind))}, {"mesh_dims", s.mesh_dims}, {"recv_bytes", s.max_recv_bytes()}});
  j["recv_bytes"] = plan.max_recv_bytes();
  j["est_seconds"] = plan.est_seconds;
  return j;
}

// "28 KiB (28672 B)", or "208 B".
std::string exact_bytes(std::int64_t b) {
  return b < 1024 ? human_bytes(b) : fmt::format("{} ({} B)", human_bytes(b), b);
}

std::string mesh_formula(const Shape& mesh) {
  if (mesh.size() == 1) return fmt::format("rank = c0 for coordinate (c0)");
  Shape strides = row_major_strides(mesh);
  std::vector<std::string> terms, names;
  for (std::size_t m = 0; m < mesh.size(); ++m) {
    terms.push_back(strides[m] == 1 ? fmt::format("c{}", m) : fmt::format("{}*c{}", strides[m], m));
    names.push_back(fmt::format("c{}", m));
  }
  return fmt::format("rank = {} for coordinate ({})", fmt::join(terms, " + "), fmt::join(names, ","));
}

void print_human(const Plan& plan, const CostModel& cost, const std::optional<cli::RunResult>& run) {
  const std::size_t is = itemsize(plan.dtype);
  const std::int64_t total_bytes = byte_size(plan.global_shape, is);
  fmt::print("Redistribute a {} {} tensor ({}) on a {} mesh of {} ranks\n", cli::shape_text(plan.global_shape),
             plan.dtype, human_bytes(total_bytes),
             plan.mesh_shape.size() == 1 ? "1-D" : fmt::format("{}", fmt::join(plan.mesh_shape, "x")),
             numel(plan.mesh_shape));
  fmt::print("  from {}\n    to {}\n", plan.from, plan.to);
  fmt::print("  mesh: {}\n", mesh_formula(plan.mesh_shape));
  std::vector<int> slow;
  for (int m = 0; m < static_cast<int>(plan.mesh_shape.size()); ++m)
    if (cost.link(m) == inter_node_link()) slow.push_back(m);
  if (slow.empty())
    fmt::print("  links: every mesh dim is intra-node\n");
  else
    fmt::print("  links: mesh dim{} {} inter-node (slow), the rest intra-node\n", slow.size() == 1 ? "" : "s",
               fmt::join(slow, ","));

  fmt::print("\nBefore: {}\n", plan.from);
  fmt::print("{}", cli::explain_placements(plan.mesh_shape, plan.global_shape, plan.from, "  "));
  fmt::print("{}", cli::layout_text(plan.mesh_shape, plan.global_shape, is, plan.from, "  "));

  fmt::print("\nPlan: ");
  if (plan.steps.empty()) {
    fmt::print("nothing to do: the layouts are the same\n");
  } else {
    const int nc = plan.num_collectives();
    fmt::print("{} step{}, {} collective{}; the busiest rank receives {}; estimated {}\n", plan.steps.size(),
               plan.steps.size() == 1 ? "" : "s", nc, nc == 1 ? "" : "s", human_bytes(plan.max_recv_bytes()),
               human_seconds(plan.est_seconds));
    for (std::size_t i = 0; i < plan.steps.size(); ++i) {
      const PlanStep& s = plan.steps[i];
      const std::string dims = s.mesh_dims.size() == 1 ? fmt::format("mesh dim {}", s.mesh_dims[0])
                                                       : fmt::format("mesh dims [{}]", fmt::join(s.mesh_dims, ","));
      fmt::print("  step {}: {} on {}: {} -> {}\n", i + 1, s.kind, dims, s.from, s.to);
      if (!s.reason.empty()) fmt::print("     why: {}\n", s.reason);
      if (is_local(s.kind))
        fmt::print("     local: no communication; estimated {}\n", human_seconds(s.est_seconds));
      else
        fmt::print("     the busiest rank receives {}; estimated {}\n", exact_bytes(s.max_recv_bytes()),
                   human_seconds(s.est_seconds));
    }
  }

  fmt::print("\nAfter: {}\n", plan.to);
  fmt::print("{}", cli::explain_placements(plan.mesh_shape, plan.global_shape, plan.to, "  "));
  fmt::print("{}", cli::layout_text(plan.mesh_shape, plan.global_shape, is, plan.to, "  "));

  if (run) {
    if (run->backend == "mpi")
      fmt::print("\nRun as an MPI job of {} processes (one per rank):\n", numel(plan.mesh_shape));
    else
      fmt::print("\nRun on {} threads (one per rank):\n", numel(plan.mesh_shape));
    fmt::print("  verified: {}{}\n", run->verified ? "yes" : "NO",
               run->verified ? (run->tolerant ? " (every rank's result within 1e-6 of the expected values)"
                                              : " (every rank's result is exactly the expected shard)")
                             : "");
    for (const std::string& p : run->problems) fmt::print("  mismatch: {}\n", p);
    fmt::print("  measured: the busiest rank received {}; planned {}{}\n", exact_bytes(run->measured_recv_bytes),
               exact_bytes(plan.max_recv_bytes()),
               run->measured_recv_bytes == plan.max_recv_bytes() ? "" : "  <- differs from the plan");
  }
}

struct Prepared {
  Plan plan;
  CostModel cost;
};

// The bytes of every rank's source and target shard, added up: what --run
// holds at the least.
std::int64_t run_bytes(const Plan& plan) {
  const std::size_t is = itemsize(plan.dtype);
  std::int64_t total = 0;
  for (std::int64_t r = 0; r < numel(plan.mesh_shape); ++r) {
    const Shape coord = unravel_index(r, plan.mesh_shape);
    for (const Layout* l : {&plan.from, &plan.to})
      total = checked_add(total, byte_size(local_box(plan.mesh_shape, plan.global_shape, *l, coord).size, is),
                          "bytes of the shards --run holds");
  }
  return total;
}

void check_run_budget(const Plan& plan) {
  const std::int64_t bytes = run_bytes(plan);
  if (bytes > kRunBudgetBytes)
    throw UsageError(
        fmt::format("--run of a {} {} tensor ({}) on {} ranks holds {} of shards ({} B); --run is "
                    "limited to {}: plan without --run, or run a smaller --shape",
                    cli::shape_text(plan.global_shape), plan.dtype,
                    human_bytes(byte_size(plan.global_shape, itemsize(plan.dtype))), numel(plan.mesh_shape),
                    human_bytes(bytes), bytes, human_bytes(kRunBudgetBytes)));
}

Prepared prepare(const Options& o) {
  const Shape mesh = parse_mesh(o);
  const Shape shape = parse_global_shape(o);
  const DType dtype = parse_cpu_dtype(o);
  if (auto problem = plan_size_problem(mesh, shape, dtype))
    throw UsageError(fmt::format("--shape '{}' --dtype {} on --mesh '{}': {}", o.shape, o.dtype, o.mesh, *problem));
  const Layout from = parse_layout("--from", o.from, mesh, shape);
  const Layout to = parse_layout("--to", o.to, mesh, shape);
  const CostModel cost = parse_cost_model(o, mesh);
  Plan plan;
  try {
    plan = plan_redistribute(PlanRequest{mesh, shape, dtype, from, to, cost});
  } catch (const dtensor::ValueError& e) {
    throw UsageError(fmt::format("no plan from --from '{}' to --to '{}': {}", o.from, o.to, bare(e.what())));
  }
  if (o.run) check_run_budget(plan);

  return Prepared{std::move(plan), cost};
}

// Prints the plan (and the run's outcome) and returns the exit status.
int report(const Options& o, const Plan& plan, const CostModel& cost, const std::optional<cli::RunResult>& run,
           const std::string& run_error) {
  if (o.json) {
    nlohmann::ordered_json j = plan_json(plan);
    if (run) {
      j["verified"] = run->verified;
      if (run_error.empty())
        j["measured_recv_bytes"] = run->measured_recv_bytes;
      else
        j["measured_recv_bytes"] = nullptr;
    }
    std::cout << j.dump() << '\n';
    for (const std::string& p : run ? run->problems : std::vector<std::string>{})
      fmt::print(stderr, "dtensor-plan: --run: {}\n", p);
  } else {
    print_human(plan, cost, run);
  }
  return run && !run->verified ? kExitVerifyFailed : 0;
}

// Writes the plan's picture (--svg) and page (--html).
void write_pictures(const Options& o, const Plan& plan) {
  if (!o.dim_names.empty() && o.dim_names.size() != plan.mesh_shape.size())
    throw UsageError(fmt::format("--dims '{}' names {} mesh dims, but --mesh '{}' has {}", fmt::join(o.dim_names, ","),
                                 o.dim_names.size(), o.mesh, plan.mesh_shape.size()));
  pictures::PictureOptions options;
  options.mesh_dim_names = o.dim_names;
  options.itemsize = itemsize(plan.dtype);
  auto write = [](const std::string& option, const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
    out.close();
    if (!out) throw UsageError(fmt::format("{} '{}': the file could not be written", option, path));
  };
  if (!o.svg.empty()) write("--svg", o.svg, pictures::plan_svg(plan, options));
  if (!o.html.empty()) write("--html", o.html, pictures::plan_html(plan, options));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App
      app{"Shows how dtensor redistributes a sharded tensor from one layout to another: the steps the planner picks, "
          "why, their bytes and time, and which rank holds which block before and after.",
          "dtensor-plan"};
  app.add_option("--mesh", o.mesh, "mesh shape, 1 to 4 dims, e.g. 2x4")->required();
  app.add_option("--shape", o.shape, "global tensor shape, e.g. 64,128 (sizes may be 0)")->required();
  app.add_option("--dtype", o.dtype, "element type: f32, f64 or i64")->capture_default_str();
  app.add_option("--from", o.from, "source placements, one per mesh dim, e.g. 'S(0),S(1)' or 'S(0)[1],S(0)[0]'")
      ->required();
  app.add_option("--to", o.to, "target placements, e.g. 'R,R' (S(d), R, P(sum|avg|max|min))")->required();
  app.add_option("--slow-dims", o.slow_dims, "comma list of mesh dims whose links are inter-node, e.g. 0");
  app.add_option("--ranks", o.ranks_text, "check that the mesh multiplies out to this many ranks");
  app.add_flag("--json", o.json, "print one JSON object instead of the explanation");
  app.add_option("--svg", o.svg, "also draw the plan as an SVG picture: the layout before and after each step");
  app.add_option("--html", o.html, "also write one self-contained HTML page: the picture, the steps, a hover");
  app.add_option("--dims", o.dim_names, "names of the mesh dims for pictures, e.g. dp,tp")->delimiter(',');
  app.add_flag("--run", o.run, "also run the plan on threads with random data and check the result");
  app.add_option("--seed", o.seed_text, "seed of the random data for --run")->capture_default_str();
  app.footer(
      "Example: dtensor-plan --mesh 2x4 --shape 64,128 --from 'S(0),S(1)' --to 'R,R'\n"
      "Picture: dtensor-plan --mesh 2x2 --dims dp,tp --shape 8,6 --from 'S(0),P(sum)' --to 'R,S(1)' --svg plan.svg\n"
      "Exit status: 0 ok, 1 --run found a wrong result, 2 bad arguments (--run: shards beyond 1 GiB), 3 --run "
      "ran out of memory.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "dtensor-plan: {} (see --help)\n", e.what());
    return kExitUsage;
  }
  try {
    parse_numbers(o);
    const Prepared p = prepare(o);
    if (!o.svg.empty() || !o.html.empty()) write_pictures(o, p.plan);
    if (!o.run) return report(o, p.plan, p.cost, std::nullopt, "");
    // One rank per mesh rank: threads unless started by mpirun.
    std::atomic<int> status{0};
    std::atomic<bool> out_of_memory{false};
    LaunchOptions options;
    options.default_ranks = static_cast<int>(numel(p.plan.mesh_shape));
    const int launched = launch(
        argc, argv,
        [&](Communicator& world) {
          const std::int64_t mesh_ranks = numel(p.plan.mesh_shape);
          if (world.size() != mesh_ranks) {
            // Only under mpirun (thread ranks are started from the mesh): a
            // bad argument, exit 2 on every rank, not a wrong result.
            if (world.rank() == 0)
              fmt::print(stderr,
                         "dtensor-plan: --mesh '{}' has {} ranks, but the MPI job has {} processes: expected them "
                         "to agree\n",
                         o.mesh, mesh_ranks, world.size());
            status.store(kExitUsage);
            return;
          }
          // A failure mid-run propagates: launch reports it.
          std::optional<cli::RunResult> run;
          try {
            run = cli::run_plan(p.plan, o.seed, world);
          } catch (const std::bad_alloc&) {
            // Said as such, with the size, and thrown on as our error so
            // that the other ranks stop at once.
            out_of_memory.store(true);
            throw dtensor::Error(fmt::format("--run ran out of memory on rank {} with a {} {} tensor ({}) on {} ranks",
                                             world.rank(), cli::shape_text(p.plan.global_shape), p.plan.dtype,
                                             human_bytes(byte_size(p.plan.global_shape, itemsize(p.plan.dtype))),
                                             mesh_ranks));
          }
          if (world.rank() == 0)
            status.store(report(o, p.plan, p.cost, run, ""));
          else if (!run->verified)
            status.store(kExitVerifyFailed);
        },
        options);
    if (out_of_memory.load()) return kExitOutOfMemory;
    return launched != 0 ? launched : status.load();
  } catch (const UsageError& e) {
    fmt::print(stderr, "dtensor-plan: {}\n", e.what());
    return kExitUsage;
  } catch (const dtensor::Error& e) {
    fmt::print(stderr, "dtensor-plan: {}\n", e.what());
    return kExitUsage;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "dtensor-plan: out of memory planning --mesh '{}' --shape '{}'\n", o.mesh, o.shape);
    return kExitOutOfMemory;
  }
}
