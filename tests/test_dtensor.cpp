// The DTensor front end: known answers taken from what PyTorch's DTensor
// tests assert (each with no more collectives and bytes than PyTorch needs),
// the exhaustive 4x2 round trip, distribute_tensor / from_local, and errors.
#include <boost/test/unit_test.hpp>

#include <algorithm>

// The old names of api/embedding.h and api/shape_ops.h still compile.
#include "dtensor/api/nn.h"
#include "dtensor/api/shape.h"
#include "support.h"

using namespace dtensor;
using dtensor::testing::FailureLog;

namespace dtensor_suite {

struct Moved {
  std::vector<CommStats> per_rank;
  std::vector<std::string> failures;

  std::uint64_t max_calls() const {
    std::uint64_t m = 0;
    for (auto& s : per_rank) m = std::max(m, s.data_collectives());
    return m;
  }
  std::uint64_t calls(CollectiveKind k) const {
    std::uint64_t m = 0;
    for (auto& s : per_rank) m = std::max(m, s.count(k));
    return m;
  }
  std::uint64_t busiest_bytes() const {
    std::uint64_t m = 0;
    for (auto& s : per_rank) m = std::max(m, s.recv_bytes);
    return m;
  }
};

// Redistributes a seeded integer tensor from `from` to `to` on every rank of
// `mesh_shape`, checks each new shard (or the reduced full tensor, for a
// Partial target) and returns what each rank's communicator counted.
Moved redistribute_and_count(const Shape& mesh_shape, const Shape& shape, const std::string& from,
                             const std::string& to, DType dtype = DType::Float32, std::uint64_t seed = 11) {
  const int world = static_cast<int>(numel(mesh_shape));
  Moved moved;
  moved.per_rank.resize(world);
  FailureLog log;
  Layout lf = Layout::parse(from), lt = Layout::parse(to);
  run_threads(world, [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape);
    Tensor full = testing::integer_tensor(shape, dtype, seed);
    Layout f = validate_layout(lf, mesh_shape, shape);
    DTensor src =
        DTensor::from_local(testing::source_shard(full, mesh_shape, f, mesh.coordinate(), seed), mesh, f, shape);
    CommStats before = comm.stats();
    DTensor dst = src.redistribute(lt);
    moved.per_rank[comm.rank()] = comm.stats() - before;
    if (!lt.has_partial()) {
      if (!equal(dst.to_local(), slice_box(full, dst.local_box())))
        log.add(
            fmt::format("rank {}: {} -> {} on {} gives a wrong shard", comm.rank(), from, to, fmt::join(shape, "x")));
    } else if (!equal(dst.full_tensor(), full)) {
      log.add(fmt::format("rank {}: {} -> {} on {} reduces to a wrong tensor", comm.rank(), from, to,
                          fmt::join(shape, "x")));
    }
  });
  moved.failures = std::move(log.failures);
  return moved;
}

void expect_ok(const Moved& m) { testing::check_no_failures(m.failures); }

}  // namespace dtensor_suite
using namespace dtensor_suite;

BOOST_AUTO_TEST_SUITE(known_answers)

BOOST_AUTO_TEST_CASE(shard_to_replicate_is_one_all_gather) {
  for (Shape shape : {Shape{12, 3}, Shape{13, 3}, Shape{14, 3}, Shape{3, 12}, Shape{3, 13}, Shape{3, 14}})
    for (std::string from : {"S(0)", "S(1)"}) {
      BOOST_TEST_CONTEXT(from << " -> R on " << fmt::format("{}", fmt::join(shape, "x"))) {
        Moved m = redistribute_and_count({4}, shape, from, "R");
        expect_ok(m);
        BOOST_TEST(m.max_calls() == 1u);
        BOOST_TEST(m.calls(CollectiveKind::AllGather) + m.calls(CollectiveKind::AllToAll) == 1u);
      }
    }
}

BOOST_AUTO_TEST_CASE(replicate_to_shard_is_local_chunk) {
  for (Shape shape : {Shape{12, 3}, Shape{13, 3}, Shape{3, 14}})
    for (int d : {0, 1}) {
      BOOST_TEST_CONTEXT("R -> S(" << d << ") on " << fmt::format("{}", fmt::join(shape, "x"))) {
        Moved m = redistribute_and_count({4}, shape, "R", fmt::format("S({})", d));
        expect_ok(m);  // the check compares with chunk(x, 4, d)[rank]
        BOOST_TEST(m.max_calls() == 0u);
      }
    }
}

BOOST_AUTO_TEST_CASE(moved_from_dtensor_reads_as_empty) {
  // Outputs share their layout and shape through one pointer; a moved-from
  // DTensor must still answer its accessors (empty), not dereference null.
  BOOST_CHECK_NO_THROW(run_threads(2, [](Communicator& comm) {
    DeviceMesh mesh(comm, {2});
    DTensor a = DTensor::from_local(Tensor::ones({4, 3}), mesh, Layout::parse("S(0)"));
    DTensor b = std::move(a);
    if (b.placements() != Layout::parse("S(0)") || b.shape() != Shape{8, 3})
      throw Error(fmt::format("moved-to DTensor reads {} {}", b.placements(), fmt::join(b.shape(), "x")));
    // NOLINTNEXTLINE(bugprone-use-after-move): reading a moved-from object is the point
    if (a.placements().mesh_ndim() != 0 || !a.shape().empty() || a.dim() != 0)
      throw Error(fmt::format("moved-from DTensor reads {} with {} dims", a.placements(), a.dim()));
  }));
}

BOOST_AUTO_TEST_CASE(partial_to_replicate_is_one_all_reduce) {
  // A rank's Error fails the case through run_threads' RankFailed.
  BOOST_CHECK_NO_THROW(run_threads(4, [](Communicator& comm) {
    DeviceMesh mesh(comm, {4});
    DTensor p = DTensor::from_local(Tensor::ones({12, 3}), mesh, Layout::parse("P(sum)"), Shape{12, 3});
    CommStats before = comm.stats();
    Tensor r = p.redistribute(Layout::parse("R")).to_local();
    CommStats moved = comm.stats() - before;
    if (!equal(r, Tensor::full({12, 3}, 4.0))) throw Error("P(sum) of ones on 4 ranks is not 4");
    if (moved.count(CollectiveKind::AllReduce) != 1 || moved.data_collectives() != 1)
      throw Error(fmt::format("expected one all_reduce, got {} collectives", moved.data_collectives()));
    // Ring volume: 2(n-1)/n of the data.
    if (moved.recv_bytes != 2 * 3 * 36 * 4 / 4) throw Error(fmt::format("all_reduce moved {} bytes", moved.recv_bytes));
  }));
}

BOOST_AUTO_TEST_CASE(partial_to_shard_is_one_reduce_scatter) {
  for (Shape shape : {Shape{12, 3}, Shape{13, 3}, Shape{3, 14}})
    for (int d : {0, 1}) {
      BOOST_TEST_CONTEXT("P(sum) -> S(" << d << ") on " << fmt::format("{}", fmt::join(shape, "x"))) {
        Moved m = redistribute_and_count({4}, shape, "P(sum)", fmt::format("S({})", d));
        expect_ok(m);
        BOOST_TEST(m.max_calls() == 1u);
        BOOST_TEST(m.calls(CollectiveKind::ReduceScatter) == 1u);
      }
    }
}

BOOST_AUTO_TEST_CASE(shard_to_shard_is_one_all_to_all) {
  for (Shape shape : {Shape{8, 8}, Shape{8, 8, 8}, Shape{8, 5}, Shape{5, 8}, Shape{5, 5}})
    for (auto [from, to] : {std::pair{"S(0)", "S(1)"}, std::pair{"S(1)", "S(0)"}}) {
      BOOST_TEST_CONTEXT(from << " -> " << to << " on " << fmt::format("{}", fmt::join(shape, "x"))) {
        Moved m = redistribute_and_count({4}, shape, from, to);
        expect_ok(m);
        BOOST_TEST(m.max_calls() == 1u);
        BOOST_TEST(m.calls(CollectiveKind::AllToAll) == 1u);
      }
    }
}

BOOST_AUTO_TEST_CASE(uneven_local_shapes) {
  std::vector<Shape> shapes(4);
  run_threads(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {4});
    DTensor t = distribute_tensor(comm.rank() == 0 ? Tensor::arange({2, 8}) : Tensor(), mesh, Layout::parse("S(0)"));
    shapes[comm.rank()] = t.to_local().shape();
  });
  BOOST_TEST((shapes == std::vector<Shape>{{1, 8}, {1, 8}, {0, 8}, {0, 8}}));
}

BOOST_AUTO_TEST_CASE(two_by_two_mesh) {
  Moved a = redistribute_and_count({2, 2}, {8, 8}, "S(0),S(1)", "S(0),S(0)");
  expect_ok(a);
  BOOST_TEST(a.max_calls() == 1u);
  Moved b = redistribute_and_count({2, 2}, {8, 8}, "S(0),S(1)", "S(1),S(0)");
  expect_ok(b);
  BOOST_TEST(b.max_calls() <= 2u);
  Moved c = redistribute_and_count({2, 2}, {8, 8}, "S(0),S(0)", "S(1),S(1)");
  expect_ok(c);
  BOOST_TEST(c.max_calls() <= 2u);
}

BOOST_AUTO_TEST_CASE(two_by_two_by_two_mesh) {
  Moved a = redistribute_and_count({2, 2, 2}, {8, 8, 8}, "S(0),S(0),S(0)", "S(1),S(1),S(1)");
  expect_ok(a);
  BOOST_TEST(a.max_calls() <= 3u);
  Moved b = redistribute_and_count({2, 2, 2}, {8, 8, 8}, "S(0),S(1),S(2)", "S(2),S(1),S(0)");
  expect_ok(b);
  BOOST_TEST(b.max_calls() <= 2u);
  Moved c = redistribute_and_count({2, 2, 2}, {8, 8, 8}, "S(1),S(0),S(0)", "R,S(0),S(0)");
  expect_ok(c);
  BOOST_TEST(c.max_calls() == 1u);
}

BOOST_AUTO_TEST_CASE(mesh_dim_of_size_one_never_communicates) {
  for (auto [from, to] : {std::pair{"S(0),R", "R,R"}, std::pair{"P(sum),R", "R,R"}, std::pair{"S(0),S(1)", "S(1),S(1)"},
                          std::pair{"P(max),S(0)", "S(1),S(0)"}}) {
    BOOST_TEST_CONTEXT(from << " -> " << to << " on 1x3") {
      Moved m = redistribute_and_count({1, 3}, {6, 7}, from, to);
      expect_ok(m);
      BOOST_TEST(m.max_calls() == 0u);
    }
  }
}

BOOST_AUTO_TEST_CASE(gather_on_two_by_four_moves_seven_eighths) {
  Moved m = redistribute_and_count({2, 4}, {64, 128}, "S(0),S(1)", "R,R");
  expect_ok(m);
  BOOST_TEST(m.busiest_bytes() == 64u * 128 * 4 * 7 / 8);
  for (auto& s : m.per_rank) BOOST_TEST(s.recv_bytes == 64u * 128 * 4 * 7 / 8);
}

BOOST_AUTO_TEST_CASE(exhaustive_four_by_two, *boost::unit_test::timeout(300)) {
  // Every source in {R,S0,S1,P}^2 to every target in {R,S0,S1}^2 round-trips.
  const std::vector<std::string> sources{"R", "S(0)", "S(1)", "P(sum)"}, targets{"R", "S(0)", "S(1)"};
  std::vector<std::pair<Layout, Layout>> pairs;
  for (auto& a : sources)
    for (auto& b : sources)
      for (auto& c : targets)
        for (auto& d : targets) pairs.emplace_back(Layout::parse(a + "," + b), Layout::parse(c + "," + d));
  FailureLog log;
  const Shape mesh_shape{4, 2}, shape{16, 24};
  run_threads(8, [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape);
    Tensor full = testing::integer_tensor(shape, DType::Float64, 5);
    for (auto& [from, to] : pairs) {
      DTensor src =
          DTensor::from_local(testing::source_shard(full, mesh_shape, from, mesh.coordinate(), 5), mesh, from, shape);
      DTensor dst = src.redistribute(to);
      if (!equal(dst.to_local(), slice_box(full, dst.local_box())))
        log.add(fmt::format("rank {}: {} -> {} gives a wrong shard", comm.rank(), from, to));
      // And back, when the source has no Partial to return to.
      if (!from.has_partial() && !equal(dst.redistribute(from).to_local(), src.to_local()))
        log.add(fmt::format("rank {}: {} -> {} -> {} does not round-trip", comm.rank(), from, to, from));
    }
  });
  testing::check_no_failures(log.failures);
  BOOST_TEST(pairs.size() == 16u * 9u);
}

BOOST_AUTO_TEST_CASE(fsdp_over_tp_order_round_trips) {
  Moved a = redistribute_and_count({2, 2}, {8, 6}, "S(0)[1],S(0)[0]", "S(0),S(0)");
  expect_ok(a);
  Moved b = redistribute_and_count({2, 2}, {8, 6}, "R,S(0)", "S(0)[1],S(0)[0]");
  expect_ok(b);
  BOOST_TEST(b.max_calls() == 0u);  // splitting further is local
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(front_end)

BOOST_AUTO_TEST_CASE(distribute_and_gather_back) {
  FailureLog log;
  run_threads(6, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2, 3}, {"dp", "tp"});
    Tensor full = Tensor::rand({7, 5}, DType::Float64, 3);
    for (std::string text : {"S(0),S(1)", "R,S(0)", "P(sum),S(1)", "S(1),P(max)", "S(0),S(0)", "R,R"}) {
      CommStats before = comm.stats();
      DTensor t = distribute_tensor(comm.rank() == 2 ? full : Tensor(), mesh, Layout::parse(text), 2);
      CommStats moved = comm.stats() - before;
      Box box = t.local_box();
      // A rank receives only its own shard.
      std::uint64_t header = sizeof(std::int64_t) * 4;
      if (comm.rank() != 2 && moved.recv_bytes > static_cast<std::uint64_t>(box.numel()) * 8 + header)
        log.add(fmt::format("rank {} received {} bytes for a {}-element shard", comm.rank(), moved.recv_bytes,
                            box.numel()));
      if (!equal(t.full_tensor(), full)) log.add(fmt::format("rank {}: {} does not gather back", comm.rank(), text));
      DTensor again = DTensor::from_local(t.to_local(), mesh, t.placements());  // infer the global shape
      if (again.shape() != full.shape())
        log.add(fmt::format("rank {}: {} infers shape {}", comm.rank(), text, fmt::join(again.shape(), "x")));
    }
    if (mesh.dim_index("tp") != 1) log.add("dim_index(tp) != 1");
  });
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_CASE(errors_name_the_bad_value) {
  std::vector<std::string> messages(3);
  run_threads(2, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2});
    auto catch_msg = [](auto&& fn) -> std::string {
      try {
        fn();
      } catch (const Error& e) {
        return e.what();
      }
      return "no error";
    };
    // Every rank makes the call (from_local checks the ranks agree first) and
    // gets the same error; rank 0 keeps the messages.
    std::vector<std::string> got(3);
    got[0] = catch_msg([&] { DTensor::from_local(Tensor::zeros({4, 4}), mesh, Layout::parse("S(2)"), Shape{8, 4}); });
    got[1] = catch_msg([&] { DTensor::from_local(Tensor::zeros({3, 4}), mesh, Layout::parse("S(0)"), Shape{8, 4}); });
    got[2] = catch_msg([&] { DTensor::from_local(Tensor::zeros({4, 4}), mesh, Layout::parse("S(0),R"), Shape{8, 4}); });
    if (comm.rank() == 0) messages = got;
  });
  BOOST_TEST(messages[0].find("Shard(2)") != std::string::npos, messages[0]);
  BOOST_TEST(messages[1].find("3x4") != std::string::npos, messages[1]);
  BOOST_TEST(messages[2].find("2 placements for a mesh of 1") != std::string::npos, messages[2]);
}

BOOST_AUTO_TEST_CASE(a_failing_rank_is_named) {
  try {
    run_threads(4, [](Communicator& comm) {
      DeviceMesh mesh(comm, {4});
      if (comm.rank() == 2) throw ValueError("boom on purpose");
      distribute_tensor(comm.rank() == 0 ? Tensor::ones({8}) : Tensor(), mesh, Layout::parse("S(0)"));
    });
    BOOST_ERROR("run_threads did not rethrow");
  } catch (const RankFailed& e) {
    BOOST_TEST(e.rank() == 2);
    BOOST_TEST(std::string(e.what()).find("boom on purpose") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(printing)

BOOST_AUTO_TEST_CASE(every_public_value_prints) {
  CommStats s;
  s.record(CollectiveKind::AllGather, 2048);
  s.record(CollectiveKind::AllGather, 1024);
  s.record(CollectiveKind::Barrier, 0);
  BOOST_TEST(fmt::format("{}", s) == "2 collectives, 3 KiB received: all_gather x2 (3 KiB), barrier x1 (0 B)");
  CostModel cost;
  cost.links = {inter_node_link()};
  BOOST_TEST(fmt::format("{}", cost).find("mesh dim 0 [") != std::string::npos, fmt::format("{}", cost));
  BOOST_TEST(fmt::format("{}", Box{{1, 0}, {2, 3}}) == "[1:3, 0:3]");
  BOOST_TEST(fmt::format("{} {} {}", DType::Float64, ReduceOp::Max, Placement(Shard{1})) == "f64 max S(1)");
  BOOST_TEST(human_bytes(28672) == "28 KiB");
  BOOST_TEST(human_seconds(9.09e-6) == "9.09 us");
}

BOOST_AUTO_TEST_SUITE_END()

// The deprecated names forward to the renamed functions: checkpoint() is
// recompute(), with the same value and gradient.
BOOST_AUTO_TEST_SUITE(old_names)

BOOST_AUTO_TEST_CASE(checkpoint_forwards_to_recompute) {
  const Tensor w = Tensor::arange({2, 3}, DType::Float64);
  auto f = [](std::span<const Tensor> in) { return sum(mul(in[0], in[0])); };
  Tensor a = w.detach().requires_grad_(), b = w.detach().requires_grad_();
  const Tensor in_a[] = {a}, in_b[] = {b};
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  const Tensor old_name = checkpoint(f, in_a);
#pragma GCC diagnostic pop
  const Tensor new_name = recompute(f, in_b);
  BOOST_TEST(old_name.get({}) == new_name.get({}));
  old_name.backward();
  new_name.backward();
  BOOST_TEST(allclose(*a.grad(), *b.grad(), 0, 0));
}

BOOST_AUTO_TEST_SUITE_END()
