// Traces (dtensor/api/trace.h): a TraceScope around a small sharded
// program writes a Chrome trace that is valid trace-event JSON (every event
// has ph, ts, pid, tid; complete events a dur >= 0; every process and track
// named), shows one process per rank, and holds exactly as many collective
// events of each kind on each rank as CommCounter counts over the same
// scope. Without a scope nothing is recorded. DTENSOR_TRACE=FILE records a
// whole launch(). On 4 thread ranks, and as a 4-process MPI job.
#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "dtensor/api/trace.h"
#include "support.h"

using namespace dtensor;
using nlohmann::json;

namespace trace_suite {

const Shape kMesh{2, 2};

// One path for every rank: rank 0's choice, broadcast (under MPI each
// process would otherwise pick its own).
std::string shared_temp_path(Communicator& world, std::string_view stem) {
  constexpr std::size_t kMaxPath = 512;
  std::array<char, kMaxPath> buf{};
  if (world.rank() == 0) {
    const auto path = std::filesystem::temp_directory_path() / fmt::format("dtensor_{}_{}.json", stem, ::getpid());
    const std::string text = path.string();
    BOOST_REQUIRE_LT(text.size(), kMaxPath);
    std::copy(text.begin(), text.end(), buf.begin());
  }
  world.broadcast(buf.data(), buf.size(), 0);
  return std::string(buf.data());
}

// A matmul of sharded operands (which moves data or leaves a Partial), a
// redistribution to replicated (a plan of steps with collectives) and a
// coalesced one (two plans, one collective).
void sharded_program(const DeviceMesh& mesh) {
  const Tensor a_full = testing::integer_tensor({8, 6}, DType::Float32, 11);
  const Tensor b_full = testing::integer_tensor({6, 4}, DType::Float32, 12);
  const Layout a_layout = Layout::parse("S(0),S(1)");
  const Layout b_layout = Layout::parse("R,S(0)");
  const DTensor a = DTensor::from_local(testing::source_shard(a_full, mesh.shape(), a_layout, mesh.coordinate(), 1),
                                        mesh, a_layout, a_full.shape());
  const DTensor b = DTensor::from_local(testing::source_shard(b_full, mesh.shape(), b_layout, mesh.coordinate(), 2),
                                        mesh, b_layout, b_full.shape());
  const DTensor c = matmul(a, b);
  const DTensor replicated = c.redistribute(Layout::parse("R,R"));
  const Layout partial = Layout::parse("P(sum),R");
  const std::vector<DTensor> grads{DTensor::from_local(testing::source_shard(b_full, mesh.shape(), partial,
                                                                             mesh.coordinate(), 3),
                                                       mesh, partial, b_full.shape()),
                                   DTensor::from_local(testing::source_shard(a_full, mesh.shape(), partial,
                                                                             mesh.coordinate(), 4),
                                                       mesh, partial, a_full.shape())};
  const std::vector<Layout> targets(grads.size(), Layout::parse("R,R"));
  (void)redistribute_all(grads, targets);
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(fmt::format("cannot open the trace '{}'", path));
  return json::parse(in);
}

// The trace event format's rules, as Perfetto and chrome://tracing read it;
// one message per broken rule.
std::vector<std::string> format_violations(const json& trace, int ranks) {
  std::vector<std::string> out;
  if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
    return {"the top level is not an object with a traceEvents array"};
  std::set<int> named_pids, pids;
  std::set<std::pair<int, int>> named_tracks, tracks;
  std::map<std::string, int> flow_balance;  // id: starts minus finishes
  for (const json& e : trace["traceEvents"]) {
    for (const char* key : {"ph", "ts", "pid", "tid", "name"})
      if (!e.contains(key)) out.push_back(fmt::format("event {} has no \"{}\"", e.dump(), key));
    if (!out.empty()) return out;
    if (!e["ts"].is_number() || !e["pid"].is_number_integer() || !e["tid"].is_number_integer())
      out.push_back(fmt::format("event {}: ts, pid and tid must be numbers", e.dump()));
    const std::string ph = e["ph"];
    const int pid = e["pid"], tid = e["tid"];
    if (ph == "M" && e["name"] == "process_name" && e["args"].contains("name")) named_pids.insert(pid);
    if (ph == "M" && e["name"] == "thread_name" && e["args"].contains("name")) named_tracks.insert({pid, tid});
    if (ph == "X") {
      if (!e.contains("dur") || !e["dur"].is_number() || e["dur"].get<double>() < 0)
        out.push_back(fmt::format("complete event {} has no dur >= 0", e.dump()));
      if (e["ts"].get<double>() < 0) out.push_back(fmt::format("event {} starts before the trace", e.dump()));
      pids.insert(pid);
      tracks.insert({pid, tid});
    }
    if (ph == "s") ++flow_balance[e.value("id", json()).dump()];
    if (ph == "f") --flow_balance[e.value("id", json()).dump()];
  }
  for (int r = 0; r < ranks; ++r)
    if (!named_pids.count(r)) out.push_back(fmt::format("no process_name for rank {}", r));
  for (int pid : pids)
    if (!named_pids.count(pid)) out.push_back(fmt::format("events of pid {}, which has no process_name", pid));
  for (const auto& [pid, tid] : tracks)
    if (!named_tracks.count({pid, tid})) out.push_back(fmt::format("pid {} tid {} has no thread_name", pid, tid));
  for (const auto& [id, balance] : flow_balance)
    if (balance != 0) out.push_back(fmt::format("flow id {} has unpaired start/finish events", id));
  return out;
}

// This rank's complete events on one track ("op" or "collective"), counted by name.
std::map<std::string, std::uint64_t> events_by_name(const json& trace, int rank, std::string_view category) {
  std::map<std::string, std::uint64_t> out;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["pid"] == rank && e.value("cat", "") == category) ++out[e["name"].get<std::string>()];
  return out;
}

// Skips (and counts) a case where the backend cannot run it here.
struct mesh_runs {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    return testing::can_run(numel(kMesh));
  }
};
struct on_threads {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    boost::test_tools::assertion_result runs(testing::test_backend() == "threads");
    runs.message() << "launch() inside an MPI job would start MPI a second time";
    return runs;
  }
};

BOOST_AUTO_TEST_SUITE(traces)

// The acceptance test of the format and of the counts: the trace agrees
// with CommCounter kind by kind on every rank, names the ops, and labels
// redistribution collectives with their plan step.
BOOST_AUTO_TEST_CASE(trace_matches_comm_counter, *boost::unit_test::precondition(mesh_runs{})) {
  testing::FailureLog log;
  testing::run_ranks(static_cast<int>(numel(kMesh)), [&](Communicator& world) {
    const DeviceMesh mesh(world, kMesh);
    const std::string path = shared_temp_path(world, "trace_counts");
    CommStats counted;
    {
      TraceScope trace(mesh, path);
      const CommCounter counter(mesh);
      sharded_program(mesh);
      counted = counter.counts();
      trace.finish();
    }
    const json trace = read_json(path);
    const int rank = mesh.rank();
    for (const auto& v : format_violations(trace, mesh.comm().size())) log.add(fmt::format("rank {}: {}", rank, v));
    const auto collectives = events_by_name(trace, rank, "collective");
    for (int k = 0; k < kNumCollectiveKinds; ++k) {
      const auto kind = static_cast<CollectiveKind>(k);
      const auto it = collectives.find(std::string(collective_name(kind)));
      const std::uint64_t traced = it == collectives.end() ? 0 : it->second;
      if (traced != counted.count(kind))
        log.add(fmt::format("rank {}: {} {} events, CommCounter counted {}", rank, traced, kind, counted.count(kind)));
    }
    if (counted.data_collectives() == 0) log.add(fmt::format("rank {}: the program moved no data", rank));
    if (!events_by_name(trace, rank, "op").count("matmul"))
      log.add(fmt::format("rank {}: no matmul event on the ops track", rank));
    bool labelled_step = false;
    for (const json& e : trace["traceEvents"])
      if (e["pid"] == rank && e.value("cat", "") == "collective" && e["args"].contains("plan_step") &&
          e["args"].contains("bytes") && e["args"].contains("group"))
        labelled_step = true;
    if (!labelled_step) log.add(fmt::format("rank {}: no collective event names its plan step", rank));
    bool labelled_coalesced = false;
    for (const json& e : trace["traceEvents"])
      if (e["pid"] == rank && e.value("cat", "") == "collective" &&
          e["args"].value("plan_step", "").find("2 plans coalesced") != std::string::npos)
        labelled_coalesced = true;
    if (!labelled_coalesced) log.add(fmt::format("rank {}: no collective event names the coalesced plans", rank));
    world.barrier();  // every rank has read the file
    if (world.rank() == 0) std::filesystem::remove(path);
  });
  testing::check_no_failures(log.failures);
}

// No scope, no recording: the thread-local stays null, and a finished scope
// gains no events from what runs after it.
BOOST_AUTO_TEST_CASE(nothing_recorded_without_a_scope, *boost::unit_test::precondition(mesh_runs{})) {
  testing::FailureLog log;
  testing::run_ranks(static_cast<int>(numel(kMesh)), [&](Communicator& world) {
    const DeviceMesh mesh(world, kMesh);
    if (trace_recording()) log.add("recording before any TraceScope");
    sharded_program(mesh);
    const std::string path = shared_temp_path(world, "trace_empty");
    TraceScope trace(mesh, path);
    if (!trace_recording()) log.add("not recording inside a TraceScope");
    trace.finish();
    if (trace_recording()) log.add("still recording after finish()");
    sharded_program(mesh);
    if (trace.recorded_events() != 0)
      log.add(fmt::format("rank {}: {} events recorded outside the scope", mesh.rank(), trace.recorded_events()));
    const json written = read_json(path);
    for (const json& e : written["traceEvents"])
      if (e["ph"] != "M") log.add(fmt::format("rank {}: an empty scope wrote {}", mesh.rank(), e.dump()));
    world.barrier();
    if (world.rank() == 0) std::filesystem::remove(path);
  });
  testing::check_no_failures(log.failures);
}

// Point-to-point messages: each send and its recv are one flow arrow, from
// the sender's process to the receiver's (world ranks, also for a message on
// a mesh dim's communicator), forward in time; a message whose recv ran
// after the scope ended gets no arrow, so every arrow in the file is paired.
BOOST_AUTO_TEST_CASE(messages_are_flow_arrows, *boost::unit_test::precondition(mesh_runs{})) {
  testing::FailureLog log;
  testing::run_ranks(static_cast<int>(numel(kMesh)), [&](Communicator& world) {
    const DeviceMesh mesh(world, kMesh);
    const std::string path = shared_temp_path(world, "trace_flows");
    Communicator& row = mesh.dim_comm(1);  // ranks {0,1} and {2,3}
    const int right = (row.rank() + 1) % static_cast<int>(row.size());
    const int left = (row.rank() + static_cast<int>(row.size()) - 1) % static_cast<int>(row.size());
    const int next = (world.rank() + 1) % world.size(), prev = (world.rank() + world.size() - 1) % world.size();
    std::array<double, 4> out{1, 2, 3, 4}, in{};
    {
      TraceScope trace(mesh, path);
      for (int round = 0; round < 2; ++round) {  // two messages on one route: paired in order
        row.send(out.data(), sizeof(out), right, 5);
        row.recv(in.data(), sizeof(in), left, 5);
      }
      world.send(out.data(), sizeof(out), next, 9);
      world.recv(in.data(), sizeof(in), prev, 9);
      world.send(out.data(), sizeof(out), world.rank(), 11);  // to itself: an arrow too
      world.recv(in.data(), sizeof(in), world.rank(), 11);
      // A refused message (the recv wanted another size) is gone: the next
      // one on its route still pairs with its own recv.
      world.send(out.data(), sizeof(double), next, 12);
      world.send(out.data(), sizeof(out), next, 12);
      try {
        world.recv(in.data(), sizeof(in), prev, 12);
        log.add(fmt::format("rank {}: a recv of the wrong size was accepted", world.rank()));
      } catch (const CommError&) {
      }
      world.recv(in.data(), sizeof(in), prev, 12);
      world.send(out.data(), sizeof(out), next, 10);  // received after the scope: no arrow
      trace.finish();
    }
    world.recv(in.data(), sizeof(in), prev, 10);
    const json trace = read_json(path);
    const int rank = mesh.rank();
    for (const auto& v : format_violations(trace, world.size())) log.add(fmt::format("rank {}: {}", rank, v));
    // Each arrow: where it starts and where it ends.
    std::map<std::string, std::pair<json, json>> arrows;
    for (const json& e : trace["traceEvents"]) {
      if (e["ph"] == "s") arrows[e["id"].dump()].first = e;
      if (e["ph"] == "f") arrows[e["id"].dump()].second = e;
    }
    // From this rank: 2 on the row to its right neighbour, 2 on the world to
    // the next rank (tags 9 and 12's second; the tag-10 message's recv ran
    // after the scope, the refused one had none), 1 to itself.
    std::map<int, int> to;
    for (const auto& [id, ends] : arrows) {
      const auto& [start, finish] = ends;
      if (start.is_null() || finish.is_null()) {
        log.add(fmt::format("rank {}: flow {} has one end", rank, id));
        continue;
      }
      if (finish.value("bp", "") != "e") log.add(fmt::format("flow {} does not bind to the recv's slice", id));
      if (start["ts"].get<double>() > finish["ts"].get<double>())
        log.add(fmt::format("flow {} points back in time: {} -> {}", id, start.dump(), finish.dump()));
      if (start["pid"] == rank) ++to[finish["pid"].get<int>()];
    }
    const int row_right = mesh.rank_of(std::array<std::int64_t, 2>{mesh.coordinate()[0], right});
    std::map<int, int> expected{{row_right, 2}};
    expected[next] += 2;
    expected[world.rank()] += 1;
    if (to != expected)
      log.add(fmt::format("rank {}: arrows to {} (rank: count), expected {}", rank, fmt::join(to, ", "),
                          fmt::join(expected, ", ")));
    // The send and recv events name their direction, peer (a world rank) and tag.
    int sends = 0, recvs = 0;
    for (const json& e : trace["traceEvents"]) {
      if (e["ph"] != "X" || e["pid"] != rank || (e["name"] != "send" && e["name"] != "recv")) continue;
      const json& args = e["args"];
      if (args.value("direction", "") != e["name"]) log.add(fmt::format("rank {}: direction of {}", rank, e.dump()));
      (e["name"] == "send" ? sends : recvs) += 1;
      if (!args.contains("peer") || !args.contains("tag")) log.add(fmt::format("rank {}: {}", rank, e.dump()));
    }
    if (sends != 7 || recvs != 5) log.add(fmt::format("rank {}: {} sends and {} recvs traced", rank, sends, recvs));
    world.barrier();
    if (world.rank() == 0) std::filesystem::remove(path);
  });
  testing::check_no_failures(log.failures);
}

// The regions a step names (CommScope: the user's "forward", the backward's
// and the optimizer's own) are events on a "scopes" track, each once: a
// "backward" inside the user's "backward" is not a second one, and a region
// opened before the recording began is not in it.
BOOST_AUTO_TEST_CASE(named_regions_are_events_on_the_scopes_track, *boost::unit_test::precondition(mesh_runs{})) {
  testing::FailureLog log;
  testing::run_ranks(static_cast<int>(numel(kMesh)), [&](Communicator& world) {
    const DeviceMesh mesh(world, kMesh);
    const std::string path = shared_temp_path(world, "trace_scopes");
    DTensor w = distribute_tensor(testing::integer_tensor({4, 6}, DType::Float64, 5), mesh, Layout::parse("S(0),R"));
    w.requires_grad_();
    {
      const CommScope outside("outside");  // open before the recording: not in it
      TraceScope trace(mesh, path);
      DTensor loss = [&] {
        const CommScope forward("forward");
        return sum(mul(w, w));
      }();
      {
        const CommScope backward("backward");
        loss.backward();  // opens its own "backward": the same region
      }
      // Regions closed out of order leave nothing dangling: "b", opened
      // inside "a", outlives it; a second "a" afterwards is a region of its
      // own (a dangling innermost "a" would swallow it, and ASan would see
      // the read).
      {
        std::optional<CommScope> a;
        a.emplace("a");
        const CommScope b("b");
        a.reset();
      }
      { const CommScope again("a"); }
      trace.finish();
    }
    const json trace = read_json(path);
    const int rank = mesh.rank();
    for (const auto& v : format_violations(trace, world.size())) log.add(fmt::format("rank {}: {}", rank, v));
    const auto scopes = events_by_name(trace, rank, "scope");
    const std::map<std::string, std::uint64_t> expected{{"a", 2}, {"b", 1}, {"backward", 1}, {"forward", 1}};
    if (scopes != expected)
      log.add(fmt::format("rank {}: scopes {}, expected a twice, b, forward and backward once each", rank,
                          fmt::join(scopes, ", ")));
    for (const json& e : trace["traceEvents"])
      if (e["ph"] == "X" && e["pid"] == rank && e.value("cat", "") == "scope" && e["tid"] != 3)
        log.add(fmt::format("rank {}: a scope off the scopes track: {}", rank, e.dump()));
    world.barrier();
    if (world.rank() == 0) std::filesystem::remove(path);
  });
  testing::check_no_failures(log.failures);
}

// A recording that ends before one nested in it (held by pointer, so the
// order is the program's) leaves the inner one recording into nothing freed:
// the inner file has the program that ran after the outer one ended.
BOOST_AUTO_TEST_CASE(an_outer_recording_may_end_first, *boost::unit_test::precondition(mesh_runs{})) {
  testing::FailureLog log;
  testing::run_ranks(static_cast<int>(numel(kMesh)), [&](Communicator& world) {
    const DeviceMesh mesh(world, kMesh);
    const std::string outer_path = shared_temp_path(world, "trace_outer");
    const std::string inner_path = shared_temp_path(world, "trace_inner");
    auto outer = std::make_unique<TraceScope>(mesh, outer_path);
    TraceScope inner(mesh, inner_path);
    outer->finish();
    outer.reset();
    sharded_program(mesh);
    inner.finish();
    const json trace = read_json(inner_path);
    for (const auto& v : format_violations(trace, world.size())) log.add(fmt::format("rank {}: {}", mesh.rank(), v));
    if (!events_by_name(trace, mesh.rank(), "op").count("matmul"))
      log.add(fmt::format("rank {}: the inner recording lost the program", mesh.rank()));
    if (trace_recording()) log.add("still recording after both ended");
    world.barrier();
    if (world.rank() == 0) {
      std::filesystem::remove(outer_path);
      std::filesystem::remove(inner_path);
    }
  });
  testing::check_no_failures(log.failures);
}

// Errors name what was wrong: an empty path at once, an unwritable one on
// every rank at finish().
BOOST_AUTO_TEST_CASE(bad_paths_are_named, *boost::unit_test::precondition(mesh_runs{})) {
  testing::FailureLog log;
  testing::run_ranks(static_cast<int>(numel(kMesh)), [&](Communicator& world) {
    const DeviceMesh mesh(world, kMesh);
    try {
      TraceScope trace(mesh, "");
      log.add("an empty path was accepted");
    } catch (const ValueError& e) {
      if (std::string(e.what()).find("[trace]") == std::string::npos) log.add(fmt::format("message: {}", e.what()));
    }
    const std::string bad = "/nonexistent-dtensor-dir/trace.json";
    TraceScope trace(mesh, bad);
    try {
      trace.finish();
      log.add(fmt::format("rank {}: finish() wrote to {}", mesh.rank(), bad));
    } catch (const Error& e) {
      if (std::string(e.what()).find(bad) == std::string::npos)
        log.add(fmt::format("rank {}: the message does not name the path: {}", mesh.rank(), e.what()));
    }
  });
  testing::check_no_failures(log.failures);
}

// DTENSOR_TRACE=FILE: launch() records every rank's whole run into FILE,
// naming each rank by the mesh its program builds. Threads only.
BOOST_AUTO_TEST_CASE(dtensor_trace_records_a_launch, *boost::unit_test::precondition(on_threads{})) {
  const auto path =
      (std::filesystem::temp_directory_path() / fmt::format("dtensor_launch_{}.json", ::getpid())).string();
  ::setenv("DTENSOR_TRACE", path.c_str(), 1);
  std::string program = "trace_test", ranks_flag = "--ranks", ranks = "4";
  std::array<char*, 4> argv{program.data(), ranks_flag.data(), ranks.data(), nullptr};
  int argc = 3;
  const int code = launch(argc, argv.data(), [](Communicator& world) {
    const DeviceMesh mesh(world, kMesh);
    sharded_program(mesh);
  });
  ::unsetenv("DTENSOR_TRACE");
  BOOST_REQUIRE_EQUAL(code, 0);
  const json trace = read_json(path);
  for (const auto& v : format_violations(trace, 4)) BOOST_ERROR(v);
  std::set<std::string> process_names;
  for (const json& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name") process_names.insert(e["args"]["name"].get<std::string>());
  BOOST_CHECK(process_names.count("rank 3 at [1,1] of mesh 2x2"));
  for (int rank = 0; rank < 4; ++rank) {
    BOOST_CHECK(events_by_name(trace, rank, "op").count("matmul"));
    BOOST_CHECK(events_by_name(trace, rank, "collective").count("split"));  // the mesh's own groups
  }
  std::filesystem::remove(path);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace trace_suite
