// Coalesced redistribution (dtensor/api/coalesced.h): redistribute_all gives
// exactly what per-tensor redistribute gives, on random meshes, shapes
// (uneven and empty included), dtypes and moves; it issues one collective
// per bucket, as many buckets as its packing rule says, and the bytes the
// per-tensor plans say; other moves run alone; autograd (one call each way)
// and bad arguments.
#include <boost/test/unit_test.hpp>

#include <optional>
#include <random>

#include <fmt/ranges.h>

#include "support.h"

using namespace dtensor;

namespace coalesced_suite {

// The DTensor whose global value is `full` under `layout` (Partial addends
// from testing::source_shard), its shards converted to `dtype` (bf16 shards
// are made in f32 and rounded, since source_shard computes in f32/f64).
DTensor make(const Tensor& full, const DeviceMesh& mesh, const Layout& layout, std::uint64_t seed,
             std::optional<DType> dtype = std::nullopt) {
  Tensor local = testing::source_shard(full, mesh.shape(), layout, mesh.coordinate(), seed);
  if (dtype && *dtype != local.dtype()) local = local.to(*dtype);
  return DTensor::from_local(local, mesh, layout, full.shape(), FromLocalCheck::Trust);
}

// A shape of 1 to 3 dims of sizes 0 to 9 (uneven over most meshes; empty
// now and then).
Shape random_shape(std::mt19937_64& rng) {
  Shape shape(1 + rng() % 3);
  for (auto& s : shape) s = static_cast<std::int64_t>(rng() % 10);
  return shape;
}

struct Move {
  Layout from, to;
};

// A move of a kind chosen by `kind`: 0 P -> R, 1 P -> S(d), 2 S(d) -> R on
// one random mesh dim of an otherwise random layout (usually one collective;
// the planner may choose more where other dims nest), 3 any random move.
Move random_move(std::mt19937_64& rng, int kind, int mesh_nd, int nd) {
  const Layout base = testing::random_layout(rng, mesh_nd, nd, ReduceOp::Sum, 0);
  const int m = static_cast<int>(rng() % static_cast<std::uint64_t>(mesh_nd));
  const auto d = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(nd));
  const ReduceOp op = std::array{ReduceOp::Sum, ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}[rng() % 4];
  switch (kind) {
    case 0: return {base.with(m, Partial{op}), base.with(m, Replicate{})};
    case 1: return {base.with(m, Partial{op}), base.with(m, Shard{d})};
    case 2: return {base.with(m, Shard{d}), base.with(m, Replicate{})};
    default:
      return {testing::random_layout(rng, mesh_nd, nd, op, 2), testing::random_layout(rng, mesh_nd, nd, op, 0)};
  }
}

template <class Body>
void on_meshes(const std::vector<Shape>& meshes, Body&& body) {
  for (const Shape& mesh_shape : testing::backend_meshes(meshes)) {
    testing::FailureLog log;
    testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
      DeviceMesh mesh(comm, mesh_shape);
      body(mesh, log);
    });
    testing::check_no_failures(log.failures);
  }
}

BOOST_AUTO_TEST_SUITE(coalesced_redistribution)

// Random batches of 1 to 8 moves (mostly single collectives, some of every
// other kind), f32/f64/bf16, buckets from a few hundred bytes to 25 MiB:
// every output equals tensors[i].redistribute(targets[i]) bit for bit, in
// the same layout (bf16 all_reduce: up to the rounding of the sum's order).
BOOST_AUTO_TEST_CASE(values_equal_per_tensor_redistribute) {
  const std::uint64_t seed = testing::seeded(20261203);
  on_meshes({{4}, {3}, {2, 2}, {2, 3}}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    for (std::size_t c = 0; c < testing::scaled_cases(40, 4); ++c) {
      std::mt19937_64 rng(seed + c);
      const std::size_t count = 1 + rng() % 8;
      const double bucket_mib = std::array{25.0, 1e-3, 2e-4}[rng() % 3];
      std::vector<DTensor> inputs;
      std::vector<Layout> targets;
      std::string what;
      for (std::size_t i = 0; i < count; ++i) {
        const Shape shape = random_shape(rng);
        const DType dtype = std::array{DType::Float32, DType::Float64, DType::BFloat16}[rng() % 3];
        const int kind = static_cast<int>(rng() % 5 % 4);  // kinds 0-2 more often than 3
        const Move mv = random_move(rng, kind, mesh.ndim(), static_cast<int>(shape.size()));
        const DType made = dtype == DType::Float64 ? DType::Float64 : DType::Float32;
        inputs.push_back(
            make(testing::integer_tensor(shape, made, seed + 31 * c + i), mesh, mv.from, seed + c, dtype));
        targets.push_back(mv.to);
        what += fmt::format(" [{} {} {} -> {}]", fmt::join(shape, "x"), dtype, mv.from, mv.to);
      }
      const std::vector<DTensor> got = redistribute_all(inputs, targets, {.bucket_mib = bucket_mib});
      for (std::size_t i = 0; i < count; ++i) {
        const DTensor want = inputs[i].redistribute(targets[i]);
        // A packed all_reduce adds the same addends, but a ring's segment
        // owners (which start the sum) shift with the packing: bf16 sums of
        // these values round, so there the order shows in the last bits (as
        // in any bucketed all_reduce). f32/f64 sums of integers are exact.
        const auto sig = coalescible_signature(inputs[i].plan_to(targets[i]));
        const bool rounds = inputs[i].dtype() == DType::BFloat16 && sig && sig->kind == StepKind::AllReduce;
        const bool same = rounds ? allclose(got[i].to_local().to(DType::Float32), want.to_local().to(DType::Float32),
                                            2e-2, 1.0)
                                 : equal(got[i].to_local(), want.to_local());
        if (got[i].placements() != want.placements() || got[i].shape() != want.shape() || !same)
          log.add(fmt::format("seed {} case {} mesh {} bucket_mib {} tensor {} of{}: got {}, expected {}", seed, c,
                              fmt::join(mesh.shape(), "x"), bucket_mib, i, what, got[i], want));
      }
    }
  });
}

// Random batches as above, two started back to back and waited in the
// reverse order: each equals redistribute_all of the same arguments bit for
// bit (the same buckets and packing, bf16 included) and the started calls
// count exactly what the blocking ones count; a second wait is refused.
BOOST_AUTO_TEST_CASE(started_batches_equal_the_blocking_call) {
  const std::uint64_t seed = testing::seeded(20261207);
  on_meshes({{4}, {2, 2}, {3}}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    for (std::size_t c = 0; c < testing::scaled_cases(20, 4); ++c) {
      std::mt19937_64 rng(seed + c);
      const double bucket_mib = std::array{25.0, 1e-3, 2e-4}[rng() % 3];
      std::vector<DTensor> inputs[2];
      std::vector<Layout> targets[2];
      std::string what;
      for (int batch = 0; batch < 2; ++batch)
        for (std::size_t i = 0, count = 1 + rng() % 6; i < count; ++i) {
          const Shape shape = random_shape(rng);
          const DType dtype = std::array{DType::Float32, DType::Float64, DType::BFloat16}[rng() % 3];
          const Move mv = random_move(rng, static_cast<int>(rng() % 5 % 4), mesh.ndim(), static_cast<int>(shape.size()));
          const DType made = dtype == DType::Float64 ? DType::Float64 : DType::Float32;
          inputs[batch].push_back(
              make(testing::integer_tensor(shape, made, seed + 31 * c + i), mesh, mv.from, seed + c, dtype));
          targets[batch].push_back(mv.to);
          what += fmt::format(" [{}: {} {} {} -> {}]", batch, fmt::join(shape, "x"), dtype, mv.from, mv.to);
        }
      const CommCounter started_counter(mesh);
      StartedRedistribution first = start_redistribute_all(inputs[0], targets[0], {.bucket_mib = bucket_mib});
      StartedRedistribution second = start_redistribute_all(inputs[1], targets[1], {.bucket_mib = bucket_mib});
      std::vector<DTensor> got[2];
      got[1] = second.wait();
      got[0] = first.wait();
      const CommStats started = started_counter.counts();
      const CommCounter blocking_counter(mesh);
      std::vector<DTensor> want[2];
      for (int batch = 0; batch < 2; ++batch)
        want[batch] = redistribute_all(inputs[batch], targets[batch], {.bucket_mib = bucket_mib});
      const CommStats blocking = blocking_counter.counts();
      const std::string where =
          fmt::format("seed {} case {} mesh {} bucket_mib {}:{}", seed, c, fmt::join(mesh.shape(), "x"), bucket_mib, what);
      if (started.calls != blocking.calls || started.bytes_by_kind != blocking.bytes_by_kind)
        log.add(fmt::format("{}: started {}, blocking {}", where, started, blocking));
      for (int batch = 0; batch < 2; ++batch)
        for (std::size_t i = 0; i < want[batch].size(); ++i)
          if (got[batch][i].placements() != want[batch][i].placements() ||
              !equal(got[batch][i].to_local(), want[batch][i].to_local()))
            log.add(fmt::format("{}: batch {} tensor {}: got {}, expected {}", where, batch, i, got[batch][i],
                                want[batch][i]));
      try {
        first.wait();
        log.add(where + ": a second wait did not throw");
      } catch (const ValueError& e) {
        if (std::string(e.what()).find("already waited") == std::string::npos) log.add(where + ": " + e.what());
      }
    }
  });
}

// The counts and bytes of one batch on the last mesh dim (4 ranks, or 2 of a
// 2x2 mesh): 5 tensors of 7x3 (uneven over 2 and 4) f32 whose moves are one
// all_reduce, reduce_scatter or all_gather each.
struct Batch {
  std::vector<DTensor> tensors;
  std::vector<Layout> targets;
  std::vector<Plan> plans;
};

Batch batch(const DeviceMesh& mesh, const std::string& from, const std::string& to, std::size_t n, Shape shape) {
  const std::string prefix = mesh.ndim() == 2 ? "S(1)," : "";
  Batch b;
  for (std::size_t i = 0; i < n; ++i) {
    b.tensors.push_back(make(testing::integer_tensor(shape, DType::Float32, 40 + i), mesh,
                             Layout::parse(prefix + from), 7));
    b.targets.push_back(Layout::parse(prefix + to));
    b.plans.push_back(b.tensors.back().plan_to(b.targets.back()));
  }
  return b;
}

// What this rank receives in the per-tensor plans, in bytes.
std::int64_t plans_bytes(const Batch& b, const DeviceMesh& mesh) {
  std::int64_t sum = 0;
  for (const Plan& p : b.plans) sum += p.recv_bytes[static_cast<std::size_t>(mesh.rank())];
  return sum;
}

BOOST_AUTO_TEST_CASE(one_collective_per_bucket_with_the_plans_bytes) {
  on_meshes({{4}, {2, 2}}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    const int m = mesh.ndim() - 1;
    const auto n = mesh.size(m);
    struct Expect {
      std::string from, to;
      CollectiveKind kind;
    };
    for (const Expect& e : {Expect{"P(sum)", "R", CollectiveKind::AllReduce},
                            Expect{"P(sum)", "S(0)", CollectiveKind::ReduceScatter},
                            Expect{"S(0)", "R", CollectiveKind::AllGather}}) {
      const Batch b = batch(mesh, e.from, e.to, 5, {7, 3});
      const std::string where = fmt::format("mesh {} {} -> {}", fmt::join(mesh.shape(), "x"), e.from, e.to);
      for (const Plan& p : b.plans)
        if (!coalescible_signature(p)) log.add(fmt::format("{}: the plan is not one collective:\n{}", where, p));
      const CommCounter counter(mesh);
      const std::vector<DTensor> got = redistribute_all(b.tensors, b.targets);
      const CommStats used = counter.counts();
      if (used.count(e.kind) != 1 || used.data_collectives() != 1)
        log.add(fmt::format("{}: {}; expected one {}", where, used, e.kind));
      // all_reduce: each rank receives all_reduce_recv_count of the packed
      // count (per tensor the split rounds separately); over the group the
      // bytes are the plans' exactly. The others match per rank.
      const std::int64_t want =
          e.kind == CollectiveKind::AllReduce
              ? all_reduce_recv_count(5 * b.tensors[0].to_local().numel(), n, mesh.coordinate()[m]) * 4
              : plans_bytes(b, mesh);
      if (static_cast<std::int64_t>(used.recv_bytes) != want)
        log.add(fmt::format("{}: {} bytes received, expected {}", where, used.recv_bytes, want));
      double sums[2] = {static_cast<double>(used.recv_bytes), static_cast<double>(plans_bytes(b, mesh))};
      mesh.dim_comm(m).all_reduce(sums, sums, 2, DType::Float64, ReduceOp::Sum);
      if (sums[0] != sums[1]) log.add(fmt::format("{}: the group received {} bytes, the plans {}", where, sums[0], sums[1]));
      for (std::size_t i = 0; i < got.size(); ++i)
        if (!equal(got[i].to_local(), b.tensors[i].redistribute(b.targets[i]).to_local()))
          log.add(fmt::format("{}: tensor {} differs from its redistribute", where, i));
    }
  });
}

// The packing rule: moves of 8x5 f32 (160 bytes each at coordinate 0 on 4
// ranks; 8x3, 96 bytes, on 2x2, where the prefix S(1) splits the columns)
// into buckets of C bytes hold floor(C/b) moves each, so 5 moves take
// ceil(5 / floor(C/b)) calls; a cap below one move sends each alone; moves
// of two dtypes never share a call.
BOOST_AUTO_TEST_CASE(bucket_count_follows_the_packing_rule) {
  on_meshes({{4}, {2, 2}}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    const Batch b = batch(mesh, "P(sum)", "R", 5, {8, 5});
    const double per_move = mesh.ndim() == 1 ? 8 * 5 * 4 : 8 * 3 * 4;
    for (const auto& [bytes, calls] : {std::pair{5 * per_move, 1}, std::pair{2.5 * per_move, 3},
                                       std::pair{3 * per_move, 2}, std::pair{per_move, 5}, std::pair{50.0, 5}}) {
      const CommCounter counter(mesh);
      redistribute_all(b.tensors, b.targets, {.bucket_mib = bytes / (1024.0 * 1024.0)});
      const std::uint64_t got = counter.count(CollectiveKind::AllReduce);
      if (got != static_cast<std::uint64_t>(calls))
        log.add(fmt::format("mesh {} bucket of {} bytes: {} all_reduce calls, expected {}",
                            fmt::join(mesh.shape(), "x"), bytes, got, calls));
    }
    std::vector<DTensor> mixed = b.tensors;
    mixed[1] = DTensor::from_local(mixed[1].to_local().to(DType::Float64), mesh, mixed[1].placements(),
                                   mixed[1].shape(), FromLocalCheck::Trust);
    const CommCounter counter(mesh);
    redistribute_all(mixed, b.targets);
    if (counter.count(CollectiveKind::AllReduce) != 2)
      log.add(fmt::format("mesh {}: f32 and f64 gradients took {} all_reduce calls, expected 2",
                          fmt::join(mesh.shape(), "x"), counter.count(CollectiveKind::AllReduce)));
  });
}

// A first bucket of its own size, and buckets filled from the last tensor
// (DDP's gradient buckets): five moves with a first bucket of one move and
// buckets of two are the calls {4} {3,2} {1,0} from the last, {0} {1,2}
// {3,4} as given; the values are redistribute's either way.
BOOST_AUTO_TEST_CASE(first_bucket_and_order_cut_the_buckets) {
  on_meshes({{4}, {2, 2}}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    const Batch b = batch(mesh, "P(sum)", "R", 5, {8, 5});
    const double per_move = (mesh.ndim() == 1 ? 8 * 5 * 4 : 8 * 3 * 4) / (1024.0 * 1024.0);
    using Calls = std::vector<std::vector<std::size_t>>;
    for (const auto& [order, want] : {std::pair{BucketOrder::LastFirst, Calls{{4}, {3, 2}, {1, 0}}},
                                      std::pair{BucketOrder::AsGiven, Calls{{0}, {1, 2}, {3, 4}}}}) {
      const CoalesceOptions options{.bucket_mib = 2 * per_move, .first_bucket_mib = per_move, .order = order};
      const Calls calls = coalesced_calls(b.tensors, b.targets, options);
      const CommCounter counter(mesh);
      const std::vector<DTensor> got = redistribute_all(b.tensors, b.targets, options);
      const std::string where = fmt::format("mesh {} order {}", fmt::join(mesh.shape(), "x"),
                                            order == BucketOrder::LastFirst ? "last first" : "as given");
      if (calls != want) log.add(fmt::format("{}: calls {}, expected {}", where, calls, want));
      if (counter.count(CollectiveKind::AllReduce) != want.size())
        log.add(fmt::format("{}: {} all_reduce calls, expected {}", where, counter.count(CollectiveKind::AllReduce),
                            want.size()));
      for (std::size_t i = 0; i < got.size(); ++i)
        if (!equal(got[i].to_local(), b.tensors[i].redistribute(b.targets[i]).to_local()))
          log.add(fmt::format("{}: tensor {} differs from its redistribute", where, i));
    }
  });
}

// No-ops issue nothing and return the input; an all_to_all (S(0) -> S(1))
// and a local slice (R -> S(0)) run as their own redistribute, beside a
// packed pair.
BOOST_AUTO_TEST_CASE(other_moves_run_alone) {
  on_meshes({{4}}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    const Tensor full = testing::integer_tensor({6, 5}, DType::Float32, 3);
    const std::vector<DTensor> in{make(full, mesh, Layout::parse("S(0)"), 1), make(full, mesh, Layout::parse("R"), 1),
                                  make(full, mesh, Layout::parse("P(sum)"), 1), make(full, mesh, Layout::parse("S(1)"), 1),
                                  make(full, mesh, Layout::parse("P(sum)"), 2)};
    const std::vector<Layout> to{Layout::parse("S(1)"), Layout::parse("S(0)"), Layout::parse("R"),
                                 Layout::parse("S(1)"), Layout::parse("R")};
    const CommCounter counter(mesh);
    const std::vector<DTensor> got = redistribute_all(in, to);
    const CommStats used = counter.counts();
    if (used.count(CollectiveKind::AllToAll) + used.count(CollectiveKind::AllGather) != 1 ||
        used.count(CollectiveKind::AllReduce) != 1 || used.data_collectives() != 2)
      log.add(fmt::format("{}; expected one all_to_all (or its exchange) and one all_reduce", used));
    if (got[3].to_local().data() != in[3].to_local().data()) log.add("the no-op did not return its input");
    for (std::size_t i = 0; i < in.size(); ++i)
      if (!equal(got[i].to_local(), in[i].redistribute(to[i]).to_local()))
        log.add(fmt::format("tensor {} ({} -> {}) differs from its redistribute", i, in[i].placements(), to[i]));
  });
}

// A 1x9 tensor S(0) -> R on 4 ranks alone is a direct exchange (only rank 0
// holds rows: the planner skips the ring's hops); beside an all_gather of
// the same mesh dim it rides along in that call, with the same values.
BOOST_AUTO_TEST_CASE(an_exchange_joins_the_all_gather_of_its_move) {
  on_meshes({{4}}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    const DTensor thin = make(testing::integer_tensor({1, 9}, DType::Float64, 1), mesh, Layout::parse("S(0)"), 1);
    const DTensor tall = make(testing::integer_tensor({8, 3}, DType::Float64, 2), mesh, Layout::parse("S(0)"), 1);
    if (thin.plan_to(Layout::parse("R")).steps.front().kind != StepKind::Exchange)
      log.add(fmt::format("the premise changed:\n{}", thin.plan_to(Layout::parse("R"))));
    const std::vector<DTensor> in{thin, tall};
    const std::vector<Layout> to(2, Layout::parse("R"));
    const CommCounter counter(mesh);
    const std::vector<DTensor> got = redistribute_all(in, to);
    if (counter.count(CollectiveKind::AllGather) != 1 || counter.counts().data_collectives() != 1)
      log.add(fmt::format("{}; expected one all_gather", counter.counts()));
    for (std::size_t i = 0; i < 2; ++i)
      if (!equal(got[i].to_local(), in[i].redistribute(to[i]).to_local())) log.add(fmt::format("tensor {} differs", i));
  });
}

// A small P -> S on a 2-D mesh is an all_reduce then a local slice (the
// planner's choice: one collective instead of two); such moves share one
// all_reduce, each sliced after it, with what redistribute gives.
BOOST_AUTO_TEST_CASE(an_all_reduce_then_a_slice_packs) {
  on_meshes({{2, 2}}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    const Layout from = Layout::parse("P(sum),P(sum)"), to = Layout::parse("S(0),R");
    std::vector<DTensor> in;
    for (std::uint64_t k = 0; k < 3; ++k)
      in.push_back(make(testing::integer_tensor({5 + static_cast<std::int64_t>(k), 3}, DType::Float64, k), mesh, from,
                        k + 1));
    const Plan plan = in[0].plan_to(to);
    if (plan.steps.size() != 2 || plan.steps[0].kind != StepKind::AllReduce || plan.steps[1].kind != StepKind::Slice)
      log.add(fmt::format("the premise changed:\n{}", plan));
    const CommCounter counter(mesh);
    const std::vector<DTensor> got = redistribute_all(in, std::vector<Layout>(in.size(), to));
    if (counter.count(CollectiveKind::AllReduce) != 1 || counter.counts().data_collectives() != 1)
      log.add(fmt::format("{}; expected one all_reduce", counter.counts()));
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (got[i].placements() != to) log.add(fmt::format("tensor {} is {}, expected {}", i, got[i].placements(), to));
      if (!equal(got[i].to_local(), in[i].redistribute(to).to_local())) log.add(fmt::format("tensor {} differs", i));
    }
  });
}

// Under grad mode the call is recorded as one group: the moves of tensors
// that require a gradient share their collective as the others do, and their
// gradients go back together in one call (here R -> S forward, a local
// slice; the gradients S -> R backward, one all_gather for both), equal to
// what per-tensor redistributes pass back.
BOOST_AUTO_TEST_CASE(a_recorded_call_packs_its_backward_too) {
  on_meshes({{4}}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    const Tensor full = testing::integer_tensor({6, 4}, DType::Float64, 5);
    DTensor x = make(full, mesh, Layout::parse("S(0)"), 1), y = make(full, mesh, Layout::parse("S(0)"), 1);
    DTensor a = make(full, mesh, Layout::parse("R"), 1), b = make(full, mesh, Layout::parse("R"), 1);
    for (DTensor* t : {&x, &y, &a, &b}) t->requires_grad_();
    const DTensor quiet = make(full, mesh, Layout::parse("S(0)"), 1);
    const std::vector<DTensor> in{x, quiet, y, a, b};
    const std::vector<Layout> to{Layout::parse("R"), Layout::parse("R"), Layout::parse("R"), Layout::parse("S(0)"),
                                 Layout::parse("S(1)")};
    const CommCounter counter(mesh);
    std::vector<DTensor> got = redistribute_all(in, to);
    if (counter.count(CollectiveKind::AllGather) != 1 || counter.counts().data_collectives() != 1)
      log.add(fmt::format("forward: {}; expected one all_gather for the three moves", counter.counts()));
    if (!got[0].requires_grad() || got[1].requires_grad() || !got[4].requires_grad())
      log.add(fmt::format("requires_grad {} {} {}: expected the recorded inputs' outputs only",
                          got[0].requires_grad(), got[1].requires_grad(), got[4].requires_grad()));
    // The weights make each gradient its own: 1 + 2 * element for a, 3 for b.
    const DTensor loss = add(add(sum(got[0]), sum(mul(got[2], got[1]))),
                             add(sum(mul(got[3], got[3].detach())), sum(mul(got[4], 3.0))));
    const CommCounter backward(mesh);
    loss.backward();
    if (backward.count(CollectiveKind::AllGather) != 1)
      log.add(fmt::format("backward: {}; expected the two gradients S -> R in one all_gather", backward.counts()));
    const auto expect = [&](const DTensor& t, const Tensor& want, const char* what) {
      if (!t.grad()) return log.add(fmt::format("{} got no gradient", what));
      if (t.grad()->placements() != t.placements())
        log.add(fmt::format("{}'s gradient is {}, expected {}", what, t.grad()->placements(), t.placements()));
      if (!equal(t.grad()->full_tensor(), want)) log.add(fmt::format("{}'s gradient differs", what));
    };
    expect(x, Tensor::ones({6, 4}, DType::Float64), "x");
    expect(y, full, "y");
    expect(a, full, "a");
    expect(b, Tensor::full({6, 4}, 3.0, DType::Float64), "b");
    NoGradGuard no_grad;
    const CommCounter plain(mesh);
    got = redistribute_all(in, to);
    if (plain.count(CollectiveKind::AllGather) != 1 || got[0].requires_grad())
      log.add(fmt::format("no grad: {}; expected one unrecorded all_gather", plain.counts()));
  });
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_typed_errors) {
  on_meshes({{4}}, [&](const DeviceMesh& mesh, testing::FailureLog& log) {
    const Tensor full = testing::integer_tensor({4, 4}, DType::Float32, 9);
    const std::vector<DTensor> in{make(full, mesh, Layout::parse("P(sum)"), 1)};
    const std::vector<Layout> to{Layout::parse("R")};
    auto expect = [&](auto&& fn, const std::string& needle, const char* what) {
      try {
        fn();
        log.add(fmt::format("{}: no error", what));
      } catch (const ValueError& e) {
        if (std::string(e.what()).find(needle) == std::string::npos)
          log.add(fmt::format("{}: message '{}' lacks '{}'", what, e.what(), needle));
      }
    };
    expect([&] { redistribute_all(in, std::vector<Layout>{}); }, "1 tensors and 0 target layouts", "span sizes");
    for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()})
      expect([&] { redistribute_all(in, to, {.bucket_mib = bad}); }, fmt::format("bucket_mib = {}", bad), "bucket");
    expect([&] { coalesced_calls(in, to, {.first_bucket_mib = 0.0}); }, "first_bucket_mib = 0", "first bucket");
    DeviceMesh other(mesh.comm(), {2, 2});
    const std::vector<DTensor> two{in[0], make(full, other, Layout::parse("R,R"), 1)};
    const std::vector<Layout> two_to{to[0], Layout::parse("R,R")};
    try {
      redistribute_all(two, two_to);
      log.add("two meshes: no error");
    } catch (const MeshError& e) {
      if (std::string(e.what()).find("tensor 1 lives on mesh") == std::string::npos)
        log.add(fmt::format("two meshes: message '{}'", e.what()));
    }
    try {
      redistribute_all(in, std::vector<Layout>{Layout::parse("S(2)")});
      log.add("S(2) of a 2-d tensor: no error");
    } catch (const LayoutError&) {
    }
    if (!redistribute_all(std::span<const DTensor>{}, std::span<const Layout>{}).empty()) log.add("empty batch");
  });
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace coalesced_suite
