// Propagation itself, on ops registered here: the cheapest candidate wins,
// decisions are cached, ties break the same way on every rank, explain mode
// says what happened, and an op with no valid strategy names itself.
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <functional>
#include <optional>

#include "checks.h"
#include "dtensor/core/cuda.h"
#include "op_cases.h"
#include "support.h"

using namespace dtensor;

namespace propagation_suite {

// "twice": y = 2x, linear, so a Partial(sum) passes through; any shard too.
// Its strategy is given per mesh dim, for the registry to expand.
const OpDef& twice() {
  static const OpDef& def = [] {
    OpDef d;
    d.name = "test_twice";
    d.doc = "2x (a linear test op)";
    d.meta = [](std::span<const TensorMeta> in, const OpAttrs&) { return in[0]; };
    d.dim_strategy = [](const StrategyQuery& q) {
      std::vector<DimStrategy> per_dim{{{Replicate{}}, Replicate{}}, {{Partial{}}, Partial{}}};
      for (std::int64_t k = 0; k < static_cast<std::int64_t>(q.inputs[0].shape.size()); ++k)
        per_dim.push_back({{Shard{k}}, Shard{k}});
      return per_dim;
    };
    d.cpu_kernel = [](const KernelArgs& a) {
      Tensor out = a.inputs[0].clone();
      visit_dtype(out.dtype(), [&](auto zero) {
        using T = decltype(zero);
        T* p = out.data_as<T>();
        for (std::int64_t i = 0; i < out.numel(); ++i) p[i] = static_cast<T>(2 * p[i]);
      });
      return out;
    };
    return std::cref(OpRegistry::global().add(std::move(d)));
  }();
  return def;
}

// "needs_nothing": no candidate at all, to see the error.
const OpDef& impossible() {
  static const OpDef& def = [] {
    OpDef d;
    d.name = "test_impossible";
    d.meta = [](std::span<const TensorMeta> in, const OpAttrs&) { return in[0]; };
    d.strategy = [](const StrategyQuery&) { return std::vector<Strategy>{}; };
    d.cpu_kernel = [](const KernelArgs& a) { return a.inputs[0]; };
    return std::cref(OpRegistry::global().add(std::move(d)));
  }();
  return def;
}

// "gpu_only": a kernel for CUDA and none for the CPU, to see the error for
// a device an op has no kernel on.
const OpDef& gpu_only() {
  static const OpDef& def = [] {
    OpDef d;
    d.name = "test_gpu_only";
    d.meta = [](std::span<const TensorMeta> in, const OpAttrs&) { return in[0]; };
    d.dim_strategy = [](const StrategyQuery&) { return std::vector<DimStrategy>{{{Replicate{}}, Replicate{}}}; };
    d.cuda_kernel = [](const KernelArgs& a) { return a.inputs[0].clone(); };
    return std::cref(OpRegistry::global().add(std::move(d)));
  }();
  return def;
}

// An op's own attribute struct, as a custom op brings it.
struct ScaleAttrs {
  double factor = 1;
  bool operator==(const ScaleAttrs&) const = default;
  std::size_t hash() const { return hash_fields(factor); }
  static constexpr std::string_view kName = "ScaleAttrs";
};

const OpDef& scale() {
  static const OpDef& def = [] {
    OpDef d;
    d.name = "test_scale";
    d.meta = [](std::span<const TensorMeta> in, const OpAttrs& attrs) {
      attrs.get<ScaleAttrs>("test_scale");  // ValueError for another op's attributes
      return in[0];
    };
    d.dim_strategy = [](const StrategyQuery& q) {
      std::vector<DimStrategy> per_dim{{{Replicate{}}, Replicate{}}, {{Partial{}}, Partial{}}};
      for (std::int64_t k = 0; k < static_cast<std::int64_t>(q.inputs[0].shape.size()); ++k)
        per_dim.push_back({{Shard{k}}, Shard{k}});
      return per_dim;
    };
    d.cpu_kernel = [](const KernelArgs& a) {
      const double f = a.attrs.get<ScaleAttrs>("test_scale").factor;
      Tensor out = a.inputs[0].clone();
      visit_dtype(out.dtype(), [&](auto zero) {
        using T = decltype(zero);
        T* p = out.data_as<T>();
        for (std::int64_t i = 0; i < out.numel(); ++i) p[i] = static_cast<T>(f * p[i]);
      });
      return out;
    };
    return std::cref(OpRegistry::global().add(std::move(d)));
  }();
  return def;
}

const testing::RegisterSamples twice_samples("test_twice", [](std::mt19937_64& rng) {
  twice();
  testing::OpSample sample;
  sample.inputs = {testing::uniform({5, 3}, DType::Float64, rng())};
  return std::vector<testing::OpSample>{sample};
});
// test_impossible has no valid strategy on any mesh, so the harness cannot
// run it; its samples list is empty on purpose and the op is checked below.
const testing::RegisterSamples impossible_samples("test_impossible",
                                                  [](std::mt19937_64&) { return std::vector<testing::OpSample>{}; });
// test_gpu_only has no CPU kernel: checked below, not by the harness.
const testing::RegisterSamples gpu_only_samples("test_gpu_only",
                                                [](std::mt19937_64&) { return std::vector<testing::OpSample>{}; });
const testing::RegisterSamples scale_samples("test_scale", [](std::mt19937_64& rng) {
  scale();
  testing::OpSample sample;
  sample.inputs = {testing::uniform({5, 3}, DType::Float64, rng())};
  sample.attrs = ScaleAttrs{.factor = -1.5};
  return std::vector<testing::OpSample>{sample};
});

}  // namespace propagation_suite
using namespace propagation_suite;

BOOST_AUTO_TEST_SUITE(propagation)

BOOST_AUTO_TEST_CASE(linear_op_keeps_partial_and_shards_without_communication) {
  twice();
  std::vector<std::string> failures;
  std::mutex mu;
  run_threads(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2, 2});
    Tensor full = testing::integer_tensor({6, 5}, DType::Float64, 3);
    for (const char* text : {"S(0),S(1)", "P(sum),S(0)", "R,R", "S(1),P(sum)"}) {
      Layout l = Layout::parse(text);
      DTensor x =
          DTensor::from_local(testing::source_shard(full, {2, 2}, l, mesh.coordinate(), 3), mesh, l, full.shape());
      CommCounter counter(mesh);
      DTensor y = call_op("test_twice", {x});
      std::lock_guard lock(mu);
      if (!(y.placements() == l)) failures.push_back(fmt::format("{} became {}", text, y.placements()));
      if (counter.counts().data_collectives() != 0)
        failures.push_back(fmt::format("{} communicated: {}", text, counter.counts()));
    }
  });
  testing::check_no_failures(failures);
}

// Row-sharded A times row-sharded B (the natural layouts of two activations):
// the cheapest move of the inputs alone is an all_to_all of A into a Partial
// C of N x N per rank; counting the reduction that C then owes, gathering B
// and keeping C row-sharded wins, and C is never Partial.
BOOST_AUTO_TEST_CASE(matmul_counts_the_reduction_a_partial_output_owes) {
  std::vector<std::string> failures;
  std::mutex mu;
  const Tensor a = testing::integer_tensor({64, 64}, DType::Float64, 1);
  const Tensor b = testing::integer_tensor({64, 64}, DType::Float64, 2);
  const Tensor want = call_op("matmul", {a, b});
  run_threads(2, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2});
    const Layout rows = Layout::parse("S(0)");
    DTensor A = DTensor::from_local(slice_box(a, local_box(mesh.shape(), a.shape(), rows, mesh.coordinate())), mesh,
                                    rows, a.shape());
    DTensor B = DTensor::from_local(slice_box(b, local_box(mesh.shape(), b.shape(), rows, mesh.coordinate())), mesh,
                                    rows, b.shape());
    CommCounter counter(mesh);
    DTensor C = call_op("matmul", {A, B});
    const CommStats c = counter.counts();
    Tensor got = C.full_tensor();
    std::lock_guard lock(mu);
    if (!(C.placements() == rows)) failures.push_back(fmt::format("C is {}, expected S(0)", C.placements()));
    if (c.count(CollectiveKind::AllGather) != 1 || c.data_collectives() != 1)
      failures.push_back(fmt::format("expected one all_gather of B, got {}", c));
    if (!equal(got, want)) failures.push_back("wrong values");
  });
  testing::check_no_failures(failures);
}

// FSDP over TP nests dim 0 by the inner mesh dim first; ops built on
// expand_to_mesh must accept that order as it is rather than redistribute.
BOOST_AUTO_TEST_CASE(non_default_nesting_runs_where_it_lies) {
  twice();
  std::vector<std::string> failures;
  std::mutex mu;
  run_threads(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2, 2});
    Tensor full = testing::integer_tensor({9, 4}, DType::Float64, 5);
    for (const char* text : {"S(0)[1],S(0)[0]", "S(1)[1],S(1)[0]"}) {
      Layout l = Layout::parse(text);
      DTensor x =
          DTensor::from_local(testing::source_shard(full, {2, 2}, l, mesh.coordinate(), 5), mesh, l, full.shape());
      Tensor w_full = testing::integer_tensor({4, 3}, DType::Float64, 6);
      DTensor w = DTensor::from_local(w_full, mesh, Layout::parse("R,R"), w_full.shape());
      CommCounter counter(mesh);
      DTensor twice_x = call_op("test_twice", {x});
      DTensor sum = call_op("add", {x, x});
      DTensor product = call_op("matmul", {x, w});  // S(1) cases contract k: Partial out, w sliced locally
      const auto counts = counter.counts();
      Tensor product_full = product.full_tensor();
      Tensor expect = slice_box(full, local_box(Shape{2, 2}, full.shape(), l, mesh.coordinate()));
      std::lock_guard lock(mu);
      for (const DTensor* y : {&twice_x, &sum}) {
        if (!(y->placements() == l))
          failures.push_back(fmt::format("{} became {}", text, y->placements()));
        else if (!allclose(y->to_local(), mul(expect, 2.0)))
          failures.push_back(fmt::format("{}: wrong values on rank {}", text, comm.rank()));
      }
      if (counts.data_collectives() != 0) failures.push_back(fmt::format("{} communicated: {}", text, counts));
      if (!allclose(product_full, matmul(full, w_full)))
        failures.push_back(fmt::format("{}: wrong matmul on rank {}", text, comm.rank()));
    }
  });
  testing::check_no_failures(failures);
}

// A repeated decision is a cache hit, counted; how fast a hit is belongs to
// bench/dispatch, not to a test.
BOOST_AUTO_TEST_CASE(repeated_decisions_are_cache_hits) {
  twice();
  std::uint64_t hits = 0, misses = 0;
  const int n = 1000;
  run_threads(1, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {1});
    DTensor x = DTensor::from_local(Tensor::ones({4, 4}), mesh, Layout::parse("R"), Shape{4, 4});
    const OpDef& op = OpRegistry::global().get("test_twice");
    std::vector<TensorMeta> metas{{x.shape(), x.dtype()}};
    std::vector<Layout> layouts{x.placements()};
    clear_propagation_cache();
    decide(op, mesh.shape(), metas, layouts, {}, {});
    for (int i = 0; i < n; ++i) decide(op, mesh.shape(), metas, layouts, {}, {});
    const auto stats = propagation_cache_stats();
    hits = stats.hits;
    misses = stats.misses;
  });
  BOOST_TEST(misses == 1u);
  BOOST_TEST(hits == static_cast<std::uint64_t>(n));
}

BOOST_AUTO_TEST_CASE(explain_mode_says_what_happened) {
  twice();
  std::vector<std::string> lines;
  run_threads(2, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2});
    DTensor x = DTensor::from_local(Tensor::ones({4, 3}), mesh, Layout::parse("S(0)"), Shape{8, 3});
    if (comm.rank() == 0) {
      ExplainScope explain([&](const std::string& line) { lines.push_back(line); });
      call_op("test_twice", {x});
    } else {
      call_op("test_twice", {x});
    }
  });
  BOOST_TEST_REQUIRE(lines.size() == 1u);
  BOOST_TEST(lines[0].find("test_twice: inputs [S(0)]; chose [S(0)] -> S(0)") != std::string::npos, lines[0]);
  BOOST_TEST(lines[0].find("0 collectives") != std::string::npos, lines[0]);
}

BOOST_AUTO_TEST_CASE(explain_says_why_a_reshape_redistributes) {
  std::vector<std::string> lines;
  run_threads(2, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2});
    DTensor x = DTensor::from_local(Tensor::ones({4, 3}), mesh, Layout::parse("S(1)"), Shape{4, 6});
    std::optional<ExplainScope> explain;
    if (comm.rank() == 0) explain.emplace([&](const std::string& line) { lines.push_back(line); });
    DTensor flat = reshape(x, {24});
    DTensor rows = reshape(x, {2, 2, 6});  // S(1) survives as S(2): nothing to say
  });
  BOOST_TEST_REQUIRE(lines.size() == 3u);
  BOOST_TEST(lines[0].find("reshape: S(1) does not survive [4,6]->[24], redistributing to ") == 0u, lines[0]);
  BOOST_TEST(lines[1].find("reshape: inputs [S(1)]; chose [") == 0u, lines[1]);
  BOOST_TEST(lines[2].find("reshape: inputs [S(1)]; chose [S(1)] -> S(2)") == 0u, lines[2]);
}

BOOST_AUTO_TEST_CASE(no_strategy_is_a_typed_error_naming_the_op) {
  impossible();
  std::string message;
  run_threads(1, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {1});
    DTensor x = DTensor::from_local(Tensor::ones({2, 3}), mesh, Layout::parse("S(1)"), Shape{2, 3});
    try {
      call_op("test_impossible", {x});
    } catch (const LayoutError& e) {
      message = e.what();
    }
  });
  BOOST_TEST(message.find("[test_impossible] no sharding strategy for inputs [S(1)]") != std::string::npos, message);
}

BOOST_AUTO_TEST_CASE(unknown_op_names_the_op) {
  try {
    call_op("no_such_op", {Tensor::ones({2})});
    BOOST_ERROR("no error");
  } catch (const ValueError& e) {
    BOOST_TEST(std::string(e.what()).find("unknown op 'no_such_op'") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(a_handle_calls_the_op_without_a_lookup) {
  const OpDef& def = twice();
  const Op by_find = Op::find("test_twice");
  BOOST_TEST((&by_find.def() == &def));
  BOOST_TEST((&OpRegistry::global().get("test_twice") == &def));  // the name is a hash lookup of the same op
  const Tensor x = testing::integer_tensor({4, 3}, DType::Float64, 5);
  const Tensor want = call_op("test_twice", {x});
  BOOST_TEST(equal(call_op(by_find, {x}), want));
  BOOST_TEST(equal(call_op(def, {x}), want));  // a const OpDef& converts to an Op
  std::vector<std::string> failures;
  std::mutex mu;
  run_threads(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2, 2});
    const Layout l = Layout::parse("S(0),P(sum)");
    DTensor dx = DTensor::from_local(testing::source_shard(x, {2, 2}, l, mesh.coordinate(), 5), mesh, l, x.shape());
    DTensor y = call_op(by_find, {dx});
    DTensor z = call_op(def, {dx});
    Tensor fy = y.full_tensor(), fz = z.full_tensor();
    std::lock_guard lock(mu);
    if (!(y.placements() == l)) failures.push_back(fmt::format("by handle: {} became {}", l, y.placements()));
    if (!equal(fy, want) || !equal(fz, want)) failures.push_back("by handle: wrong values");
  });
  testing::check_no_failures(failures);
}

BOOST_AUTO_TEST_CASE(a_device_without_a_kernel_is_a_typed_error_naming_op_and_device) {
  gpu_only();
  testing::check_throws<UnsupportedError>(
      [] {
        call_op("test_gpu_only", {Tensor::ones({2, 3})});
      },
      "[test_gpu_only] has no cpu kernel");
  run_threads(2, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {2});
    DTensor x = DTensor::from_local(Tensor::ones({2, 3}), mesh, Layout::parse("R"), Shape{2, 3});
    testing::check_throws<UnsupportedError>([&] { call_op("test_gpu_only", {x}); },
                                            "[test_gpu_only] has no cpu kernel");
  });
  // A CPU-only build has no CUDA kernel for any op (its CUDA table is null);
  // a CUDA build has one for every built-in op.
  for (const std::string& name : OpRegistry::global().names()) {
    const OpDef& op = OpRegistry::global().get(name);
    if (name.starts_with("test_")) continue;
    BOOST_TEST(static_cast<bool>(op.cpu_kernel), name);
    BOOST_TEST(static_cast<bool>(op.cuda_kernel) == cuda::built(), name);
  }
}

BOOST_AUTO_TEST_CASE(registry_checks_what_it_is_given) {
  OpDef both;
  both.name = "test_both_strategies";
  both.meta = [](std::span<const TensorMeta> in, const OpAttrs&) { return in[0]; };
  both.strategy = [](const StrategyQuery&) { return std::vector<Strategy>{}; };
  both.dim_strategy = [](const StrategyQuery&) { return std::vector<DimStrategy>{}; };
  testing::check_throws<ValueError>([&] { OpRegistry::global().add(both); }, "gives both strategy and dim_strategy");
  OpDef none;
  none.name = "test_no_strategy";
  none.meta = both.meta;
  testing::check_throws<ValueError>([&] { OpRegistry::global().add(none); }, "needs a meta function and a strategy");
  OpDef again;
  again.name = "add";
  again.meta = both.meta;
  again.strategy = both.strategy;
  testing::check_throws<ValueError>([&] { OpRegistry::global().add(again); }, "op 'add' is already registered");
  BOOST_TEST(!OpRegistry::global().contains("test_both_strategies"));
  BOOST_TEST(OpRegistry::global().contains("add"));
}

BOOST_AUTO_TEST_CASE(typed_attributes_compare_hash_and_name_the_expected_struct) {
  const OpAttrs a = ReduceAttrs{.dims = {1}, .keepdim = true};
  const OpAttrs b = ReduceAttrs{.dims = {1}, .keepdim = true};
  const OpAttrs c = ReduceAttrs{.dims = {1}};
  const OpAttrs d = DimsAttrs{.dims = {1}};
  BOOST_TEST((a == b));
  BOOST_TEST(a.hash() == b.hash());
  BOOST_TEST(!(a == c));
  BOOST_TEST(!(a == d));  // same fields, another struct
  BOOST_TEST(!(a == OpAttrs{}));
  BOOST_TEST((OpAttrs{} == OpAttrs{}));
  BOOST_TEST(a.get<ReduceAttrs>("sum").keepdim);
  BOOST_TEST(OpAttrs{}.get<ReduceAttrs>("sum").dims.empty());  // none given: the defaults
  BOOST_TEST(d.get_if<ReduceAttrs>() == nullptr);
  testing::check_throws<ValueError>(
      [&] {
        call_op("sum", {Tensor::ones({2, 3})}, d);
      },
      "[sum] got attributes of type DimsAttrs; expected ReduceAttrs");
  // A custom op's own struct: decisions are cached per value.
  scale();
  clear_propagation_cache();
  run_threads(1, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {1});
    DTensor x = DTensor::from_local(Tensor::ones({2, 3}, DType::Float64), mesh, Layout::parse("S(0)"), Shape{2, 3});
    DTensor y = call_op("test_scale", {x}, ScaleAttrs{.factor = 2});
    DTensor y2 = call_op("test_scale", {x}, ScaleAttrs{.factor = 2});
    DTensor z = call_op("test_scale", {x}, ScaleAttrs{.factor = 3});
    const CacheStats stats = propagation_cache_stats();
    BOOST_TEST(stats.misses == 2u);
    BOOST_TEST(stats.hits == 1u);
    BOOST_TEST(equal(z.full_tensor(), Tensor::full({2, 3}, 3.0, DType::Float64)));
    testing::check_throws<ValueError>([&] { call_op("test_scale", {x}, ReduceAttrs{}); },
                                      "[test_scale] got attributes of type ReduceAttrs; expected ScaleAttrs");
  });
}

BOOST_AUTO_TEST_SUITE_END()
