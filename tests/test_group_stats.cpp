// Counters split by mesh dims (DeviceMesh::group_stats, CommCounterByDims) on
// the backend under test: thread ranks, or a 4- or 6-process MPI job (this
// file is part of test_collectives, which tests/meson.build runs both ways).
// Each case issues seeded all_gathers on dim_comm(0), dim_comm(1), another
// group and the world, and checks each lands under its dims with its bytes,
// while the rank-wide counters (CommCounter) still see the sum.
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "comm_checks.h"
#include "support.h"

#include "dtensor/core/units.h"

using namespace dtensor;
using comm_test::Failures;

namespace group_stats_test {

const std::vector<Shape> kMeshes{{2, 2}, {2, 3}};
const std::vector<std::string> kNames{"dp", "tp"};

boost::test_tools::assertion_result runs_a_mesh(boost::unit_test::test_unit_id) {
  for (const auto& shape : kMeshes)
    if (testing::can_run(numel(shape))) return true;
  boost::test_tools::assertion_result none(false);
  none.message() << "needs a world of 4 or 6 ranks (an MPI job of another size)";
  return none;
}

// Equal-size all_gathers on one communicator, drawn from a seed every rank shares.
struct Gathers {
  std::uint64_t repeats = 0;
  std::size_t elements = 0;

  static Gathers draw(std::mt19937_64& rng) {
    return {1 + rng() % 3, static_cast<std::size_t>(rng() % 7)};  // zero elements included
  }
  // Runs them on `comm`; returns the bytes they must count on this rank.
  std::uint64_t run(Communicator& comm) const {
    std::vector<double> mine(elements, comm.rank()), all(elements * static_cast<std::size_t>(comm.size()));
    for (std::uint64_t i = 0; i < repeats; ++i) comm.all_gather(mine.data(), all.data(), elements * sizeof(double));
    return repeats * static_cast<std::uint64_t>(comm.size() - 1) * elements * sizeof(double);
  }
};

// The entry of `counts` for (dims, kind), or a zero one.
DimsCount find(const std::vector<DimsCount>& counts, const std::vector<int>& dims, CollectiveKind kind) {
  for (const auto& c : counts)
    if (c.mesh_dims == dims && c.kind == kind) return c;
  return {dims, {}, kind, 0, 0};
}

// Runs fn(world, rank, failures) on each mesh shape that can run here.
template <class Fn>
void on_meshes(const Fn& fn) {
  for (const auto& shape : kMeshes) {
    const int n = static_cast<int>(numel(shape));
    if (!testing::can_run(n)) continue;
    BOOST_TEST_CONTEXT("mesh " << fmt::format("{}", fmt::join(shape, "x"))) {
      Failures failures(n);
      testing::run_ranks(n, [&](Communicator& world) { fn(world, shape, failures); });
      failures.report();
    }
  }
}

}  // namespace group_stats_test
using namespace group_stats_test;

BOOST_AUTO_TEST_SUITE(group_stats)

BOOST_AUTO_TEST_CASE(collectives_count_under_their_dims, *boost::unit_test::precondition(runs_a_mesh)) {
  on_meshes([](Communicator& world, const Shape& shape, Failures& failures) {
    const int rank = world.rank();
    DeviceMesh mesh(world, shape, kNames);
    std::mt19937_64 rng(20240611 + static_cast<std::uint64_t>(numel(shape)));
    const Gathers dim0 = Gathers::draw(rng), dim1 = Gathers::draw(rng), swapped = Gathers::draw(rng),
                  whole = Gathers::draw(rng);
    const CommStats rank_before = world.stats();
    const CommStats world_before = world.own_stats();
    const CommCounter total(mesh);
    const CommCounterByDims by_dims(mesh);

    // Made after the counters: its split is the world's call, and the group
    // itself starts from zero. {1,0} spans the ranks of the world, reordered.
    Communicator& group10 = mesh.group_comm(std::vector<int>{1, 0});
    const std::uint64_t bytes0 = dim0.run(mesh.dim_comm(0)), bytes1 = dim1.run(mesh.dim_comm(1)),
                        bytes10 = swapped.run(group10), bytes_world = whole.run(world);

    const auto counts = by_dims.counts();
    EXPECT_R(counts.size() == 4u, "4 entries, got {}", fmt::join(counts, "; "));
    const auto on0 = find(counts, {0}, CollectiveKind::AllGather);
    const auto on1 = find(counts, {1}, CollectiveKind::AllGather);
    const auto on01 = find(counts, {0, 1}, CollectiveKind::AllGather);
    EXPECT_R(on0.count == dim0.repeats && on0.bytes == bytes0 && on0.dim_names == std::vector<std::string>{"dp"},
             "dim 0: {}", on0);
    EXPECT_R(on1.count == dim1.repeats && on1.bytes == bytes1 && on1.dim_names == std::vector<std::string>{"tp"},
             "dim 1: {}", on1);
    EXPECT_R(on01.count == swapped.repeats + whole.repeats && on01.bytes == bytes10 + bytes_world, "dims 0,1: {}",
             on01);
    EXPECT_R(find(counts, {0, 1}, CollectiveKind::Split).count == 1u, "the split of group_comm({{1,0}})");
    EXPECT_R(by_dims.count({1, 0}, CollectiveKind::AllGather) == on01.count, "count() takes dims in any order");
    EXPECT_R(fmt::format("{}", on1) ==
                 fmt::format("[tp] all_gather x{} ({})", dim1.repeats, human_bytes(static_cast<std::int64_t>(bytes1))),
             "format {}", on1);

    // The world's own counters hold its own calls; stats() still the sum.
    const CommStats world_own = world.own_stats() - world_before;
    EXPECT_R(world_own.count(CollectiveKind::AllGather) == whole.repeats && world_own.recv_bytes == bytes_world,
             "world's own: {}", world_own);
    const CommStats sum = total.counts();
    EXPECT_R(sum.recv_bytes == bytes0 + bytes1 + bytes10 + bytes_world &&
                 sum.count(CollectiveKind::AllGather) == dim0.repeats + dim1.repeats + swapped.repeats + whole.repeats,
             "CommCounter totals: {}", sum);
    EXPECT_R((world.stats() - rank_before).recv_bytes == sum.recv_bytes, "stats() is rank-wide");
  });
}

BOOST_AUTO_TEST_CASE(submeshes_report_in_their_own_dims, *boost::unit_test::precondition(runs_a_mesh)) {
  on_meshes([](Communicator& world, const Shape& shape, Failures& failures) {
    const int rank = world.rank();
    DeviceMesh mesh(world, shape, kNames);
    const DeviceMesh tp = mesh.submesh({"tp"});
    const DeviceMesh swapped = mesh.submesh({"tp", "dp"});
    std::mt19937_64 rng(7 + static_cast<std::uint64_t>(numel(shape)));
    const Gathers on_tp = Gathers::draw(rng), on_dp = Gathers::draw(rng), on_all = Gathers::draw(rng);
    const CommCounterByDims tp_counter(tp), swapped_counter(swapped);

    const std::uint64_t bytes_tp = on_tp.run(tp.comm());  // mesh dim 1
    on_dp.run(mesh.dim_comm(0));                          // not a dim of tp
    on_all.run(swapped.comm());                           // the root's group_comm({1,0})

    const auto tp_counts = tp_counter.counts();
    EXPECT_R(tp_counts.size() == 1u && tp_counts[0].mesh_dims == std::vector<int>{0} &&
                 tp_counts[0].count == on_tp.repeats && tp_counts[0].bytes == bytes_tp,
             "tp submesh: {}", fmt::join(tp_counts, "; "));
    EXPECT_R(tp.group_stats().size() == 1u, "tp submesh has one group, got {}", fmt::join(tp.group_stats(), "; "));
    constexpr auto kind = CollectiveKind::AllGather;
    EXPECT_R(swapped_counter.count({0}, kind) == on_tp.repeats && swapped_counter.count({1}, kind) == on_dp.repeats &&
                 swapped_counter.count({0, 1}, kind) == on_all.repeats,
             "swapped submesh: {}", fmt::join(swapped_counter.counts(), "; "));
    EXPECT_R(find(swapped_counter.counts(), {0}, kind).dim_names == std::vector<std::string>{"tp"},
             "names in the submesh's order");
  });
}

BOOST_AUTO_TEST_CASE(one_dim_mesh_has_one_group, *boost::unit_test::precondition(runs_a_mesh)) {
  on_meshes([](Communicator& world, const Shape& shape, Failures& failures) {
    const int rank = world.rank();
    // dim_comm(0) of a 1-d mesh is a communicator of its own; both count as dim 0.
    DeviceMesh mesh(world, {numel(shape)});
    const CommCounterByDims by_dims(mesh);
    const Gathers gathers{2, 3};
    const std::uint64_t bytes = gathers.run(world) + gathers.run(mesh.dim_comm(0));
    const auto counts = by_dims.counts();
    EXPECT_R(mesh.group_stats().size() == 1u, "one group, got {}", fmt::join(mesh.group_stats(), "; "));
    EXPECT_R(counts.size() == 1u && counts[0].count == 4u && counts[0].bytes == bytes && counts[0].dim_names.empty(),
             "{}", fmt::join(counts, "; "));
    EXPECT_R(fmt::format("{}", counts[0]).starts_with("[0] all_gather x4"), "format {}", counts[0]);
  });
}

BOOST_AUTO_TEST_CASE(redistribute_over_dim_1_counts_under_dim_1, *boost::unit_test::precondition(runs_a_mesh)) {
  on_meshes([](Communicator& world, const Shape& shape, Failures& failures) {
    const int rank = world.rank();
    DeviceMesh mesh(world, shape, kNames);
    const Tensor full = testing::integer_tensor({2 * shape[1] + 1, 3}, DType::Float32, 5);  // uneven shards
    const DTensor src = from_full(full, mesh, Layout::parse("R,S(0)"));
    const CommCounterByDims by_dims(mesh);
    const DTensor dst = src.redistribute(Layout::parse("R,R"));
    const auto counts = by_dims.counts();
    const auto gathered = find(counts, {1}, CollectiveKind::AllGather);
    const std::uint64_t others = static_cast<std::uint64_t>(full.numel() - src.to_local().numel()) * sizeof(float);
    EXPECT_R(counts.size() == 1u && gathered.count == 1u && gathered.bytes == others,
             "one all_gather of {} bytes over tp, got {}", others, fmt::join(counts, "; "));
    EXPECT_R(equal(dst.to_local(), full), "R,R holds the full tensor");
  });
}

BOOST_AUTO_TEST_SUITE_END()
