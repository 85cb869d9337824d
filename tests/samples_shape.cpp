// Samples for the shape ops (tests/op_cases.h), and known-answer tests of
// the view rule: which layouts the shape ops give and the collectives they
// issue (none where a shard follows its dim, one all_gather where a reshape
// cannot keep it), and the factories on several layouts and rank counts.
#include <boost/test/unit_test.hpp>

#include "op_cases.h"
#include "support.h"

using namespace dtensor;
using dtensor::testing::OpSample;
using dtensor::testing::RegisterSamples;
using dtensor::testing::uniform;

namespace {

OpAttrs dtype_attrs(DType dtype) { return ToAttrs{.dtype = dtype}; }
OpAttrs shape_attrs(Shape shape) { return ShapeAttrs{.shape = std::move(shape)}; }
OpAttrs dim_attrs(std::int64_t dim) { return DimAttrs{.dim = dim}; }
OpAttrs transpose_attrs(std::int64_t d0, std::int64_t d1) { return TransposeAttrs{.dim0 = d0, .dim1 = d1}; }
OpAttrs narrow_attrs(std::int64_t dim, std::int64_t start, std::int64_t length) {
  return NarrowAttrs{.dim = dim, .start = start, .length = length};
}
OpAttrs flatten_attrs(std::int64_t start, std::int64_t end) { return FlattenAttrs{.start_dim = start, .end_dim = end}; }

OpSample sample(std::vector<Tensor> inputs, OpAttrs attrs) {
  OpSample s;
  s.inputs = std::move(inputs);
  s.attrs = std::move(attrs);
  s.rtol = 0;
  s.atol = 0;  // copies are exact (Partial sources are integer addends)
  return s;
}

Tensor u(const Shape& shape, std::uint64_t seed, DType dtype = DType::Float64) {
  return testing::integer_tensor(shape, dtype, seed);
}

const RegisterSamples transpose_samples("transpose", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({5, 3, 2}, 1)}, transpose_attrs(0, 2)),
                               sample({u({3, 7}, 2, DType::Float32)}, transpose_attrs(-1, 0))};
});
const RegisterSamples permute_samples("permute", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({3, 5, 2}, 3)}, DimsAttrs{.dims = {2, 0, 1}})};
});
const RegisterSamples reshape_samples("reshape", [](std::mt19937_64&) {
  return std::vector<OpSample>{
      sample({u({6, 5}, 4)}, shape_attrs({30})),        // flatten: S(0) stays only where rows line up
      sample({u({4, 6}, 5)}, shape_attrs({8, 3})),      // split 6 -> 2x3 and merge 4*2
      sample({u({5, 1, 3}, 6)}, shape_attrs({-1, 5})),  // merges and splits across a singleton
      sample({u({9, 2}, 7, DType::Int64)}, shape_attrs({3, 3, 2})),
      sample({u({0, 3}, 31)}, shape_attrs({3, 0})),  // zero sizes
  };
});
const RegisterSamples view_samples("view", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({8, 3}, 8)}, shape_attrs({2, 4, 3}))};
});
const RegisterSamples flatten_samples("flatten", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({5, 2, 3}, 9)}, flatten_attrs(0, 1)),
                               sample({u({3, 2, 5}, 10)}, flatten_attrs(1, -1))};
});
const RegisterSamples unflatten_samples("unflatten", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({12, 3}, 11)}, UnflattenAttrs{.dim = 0, .sizes = {4, -1}}),
                               sample({u({3, 10}, 12)}, UnflattenAttrs{.dim = 1, .sizes = {5, 2}})};
});
const RegisterSamples squeeze_samples("squeeze", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({5, 1, 3}, 13)}, DimsAttrs{.dims = {1}}), sample({u({1, 7, 1}, 14)}, {})};
});
const RegisterSamples unsqueeze_samples("unsqueeze", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({5, 3}, 15)}, dim_attrs(1)), sample({u({7}, 16)}, dim_attrs(-1))};
});
const RegisterSamples expand_samples("expand", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({5, 1}, 17)}, shape_attrs({5, 3})),
                               sample({u({1, 3}, 18)}, shape_attrs({2, 5, -1}))};
});
const RegisterSamples narrow_samples("narrow", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({7, 3}, 19)}, narrow_attrs(0, 2, 4)),
                               sample({u({3, 9}, 20, DType::Int64)}, narrow_attrs(-1, -5, 3))};
});
const RegisterSamples cat_samples("cat", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({3, 5}, 21), u({2, 5}, 22)}, dim_attrs(0)),
                               sample({u({5, 2}, 23), u({5, 3}, 24), u({5, 1}, 25)}, dim_attrs(1)),
                               sample({u({0, 3}, 32), u({3, 3}, 33)}, dim_attrs(0))};
});
const RegisterSamples stack_samples("stack", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({5, 3}, 26), u({5, 3}, 27)}, dim_attrs(1))};
});
const RegisterSamples to_samples("to", [](std::mt19937_64&) {
  std::vector<OpSample> out{sample({u({5, 3}, 28)}, dtype_attrs(DType::Float32)),
                            sample({u({7}, 29, DType::Float32)}, dtype_attrs(DType::Int64)),
                            sample({u({3, 5}, 30, DType::Int64)}, dtype_attrs(DType::Float64))};
  return out;
});

template <class Fn>
void on_mesh(const Shape& mesh_shape, Fn fn) {
  testing::FailureLog log;
  run_threads(static_cast<int>(numel(mesh_shape)), [&](Communicator& world) {
    DeviceMesh mesh(world, mesh_shape);
    fn(mesh, log);
  });
  testing::check_no_failures(log.failures);
  BOOST_TEST(log.failures.empty());
}

}  // namespace

BOOST_AUTO_TEST_SUITE(shape_ops)

BOOST_AUTO_TEST_CASE(known_values) {
  Tensor a = Tensor::arange({2, 3}, DType::Float64);
  BOOST_TEST(equal(transpose(a, 0, 1), Tensor::from_vector<double>({0, 3, 1, 4, 2, 5}, {3, 2})));
  BOOST_TEST(equal(reshape(a, {-1}), Tensor::arange({6}, DType::Float64)));
  BOOST_TEST(equal(narrow(a, 1, 1, 2), Tensor::from_vector<double>({1, 2, 4, 5}, {2, 2})));
  BOOST_TEST(equal(cat({a, a}, 0), Tensor::from_vector<double>({0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}, {4, 3})));
  BOOST_TEST(
      equal(stack({a, a}, 2).view({12}), Tensor::from_vector<double>({0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5}, {12})));
  BOOST_TEST(equal(expand(reshape(a, {2, 1, 3}), {2, 2, 3}),
                   Tensor::from_vector<double>({0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5}, {2, 2, 3})));
  BOOST_TEST((squeeze(unsqueeze(a, 0)).shape() == Shape{2, 3}));
  BOOST_TEST((unflatten(flatten(a), 0, {3, 2}).shape() == Shape{3, 2}));
  BOOST_TEST(equal(to(a, DType::Int64), Tensor::arange({2, 3}, DType::Int64)));
  std::vector<Tensor> parts = split(a, 1, std::vector<std::int64_t>{1, 2});
  BOOST_TEST(parts.size() == 2u);
  BOOST_TEST(equal(parts[1], narrow(a, 1, 1, 2)));
  BOOST_TEST(split(Tensor::arange({7}), 0, std::int64_t{3}).size() == 3u);
}

BOOST_AUTO_TEST_CASE(shape_errors_name_the_op_and_the_values) {
  auto message = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const ShapeError& e) {
      return e.what();
    }
    return "no ShapeError";
  };
  BOOST_TEST(message([] { reshape(Tensor::zeros({2, 3}), {4, 2}); }).starts_with("[reshape] shape [4, 2]"));
  BOOST_TEST(message([] { transpose(Tensor::zeros({2, 3}), 0, 2); }).starts_with("[transpose] dim 2 out of range"));
  BOOST_TEST(message([] { narrow(Tensor::zeros({2, 3}), 1, 2, 2); }).starts_with("[narrow] start 2 length 2"));
  BOOST_TEST(message([] { cat({Tensor::zeros({2, 3}), Tensor::zeros({2, 4})}, 0); }).starts_with("[cat] input 1"));
  BOOST_TEST(message([] { expand(Tensor::zeros({2, 3}), {2, 4}); }).starts_with("[expand] dim 1 of size 3"));
  BOOST_TEST(message([] { split(Tensor::zeros({5}), 0, std::vector<std::int64_t>{2, 2}); }).starts_with("[split]"));
}

BOOST_AUTO_TEST_CASE(view_rule_keeps_shards_where_the_boxes_line_up) {
  // Propagation only: op, input shapes and layouts, mesh -> the output layout
  // chosen, and whether the inputs had to move.
  struct Case {
    const char* op;
    std::vector<Shape> shapes;
    std::vector<const char*> layouts;
    OpAttrs attrs;
    Shape mesh;
    const char* want;
    bool moves;
    DType to = DType::Float64;
  };
  const std::vector<Case> cases = {
      {"reshape", {{8, 6}}, {"S(0)"}, shape_attrs({48}), {4}, "S(0)", false},
      {"reshape", {{7, 6}}, {"S(0)"}, shape_attrs({42}), {4}, "R", true},           // uneven rows do not line up
      {"reshape", {{6, 4}}, {"S(1)"}, shape_attrs({6, 2, 2}), {2}, "S(1)", false},  // split, leftmost piece divides
      // 2 rows of 3 do not split 4 ways: moved to rows (all_to_all beats all_gather)
      {"reshape", {{6, 6}}, {"S(1)"}, shape_attrs({6, 2, 3}), {4}, "S(0)", true},
      {"reshape", {{2, 5, 3}}, {"R,S(2)"}, shape_attrs({10, 3}), {2, 2}, "R,S(1)", false},
      {"reshape", {{4, 6}}, {"S(0),S(0)"}, shape_attrs({24}), {2, 2}, "S(0),S(0)", false},
      {"reshape", {{8, 6}}, {"S(0)[1],S(0)[0]"}, shape_attrs({48}), {2, 2}, "S(0)[1],S(0)[0]", false},
      {"transpose", {{8, 3}}, {"S(0)[1],S(0)[0]"}, transpose_attrs(0, 1), {2, 2}, "S(1)[1],S(1)[0]", false},
      {"unsqueeze", {{5, 3}}, {"S(1)"}, dim_attrs(0), {4}, "S(2)", false},
      {"squeeze", {{5, 1, 3}}, {"S(2)"}, DimsAttrs{.dims = {1}}, {4}, "S(1)", false},
      {"permute", {{3, 5, 2}}, {"S(0),S(2)"}, DimsAttrs{.dims = {2, 0, 1}}, {2, 2}, "S(1),S(0)", false},
      {"transpose", {{3, 5}}, {"P(sum),S(0)"}, transpose_attrs(0, 1), {2, 2}, "P(sum),S(1)", false},
      {"expand", {{5, 1}}, {"S(0)"}, shape_attrs({2, 5, 3}), {4}, "S(1)", false},
      {"narrow", {{7, 9}}, {"S(0)"}, narrow_attrs(1, 2, 5), {4}, "S(0)", false},
      {"narrow", {{7, 9}}, {"S(1)"}, narrow_attrs(1, 2, 5), {4}, "S(0)", true},
      {"cat", {{7, 3}, {7, 2}}, {"S(0)", "S(0)"}, dim_attrs(1), {4}, "S(0)", false},
      {"stack", {{5, 3}, {5, 3}}, {"S(1)", "S(1)"}, dim_attrs(0), {4}, "S(2)", false},
      {"to", {{5, 3}}, {"P(sum),S(0)"}, dtype_attrs(DType::Float32), {2, 2}, "P(sum),S(0)", false},
      {"to", {{5, 3}}, {"P(sum)"}, dtype_attrs(DType::Int64), {4}, "P(sum)", true},  // never P: checked below
  };
  for (const Case& c : cases) {
    std::vector<TensorMeta> metas;
    std::vector<Layout> layouts;
    for (std::size_t i = 0; i < c.shapes.size(); ++i) {
      metas.push_back(TensorMeta{c.shapes[i], DType::Float64});
      layouts.push_back(validate_layout(Layout::parse(c.layouts[i]), c.mesh, c.shapes[i]));
    }
    const OpDecision& d = decide(OpRegistry::global().get(c.op), c.mesh, metas, layouts, c.attrs, CostModel{});
    bool moved = false;
    for (auto* p : d.input_plans) moved = moved || p != nullptr;
    const std::string what =
        fmt::format("{} of {} on mesh {}", c.op, fmt::join(c.layouts, " | "), fmt::join(c.mesh, "x"));
    BOOST_TEST(moved == c.moves, what << ": moved " << moved);
    if (std::string_view(c.op) == "to" && c.attrs.get<ToAttrs>("to").dtype == DType::Int64)
      BOOST_TEST(!d.chosen.output.has_partial(), what << " gave " << fmt::format("{}", d.chosen.output));
    else
      BOOST_TEST((d.chosen.output == Layout::parse(c.want)), what << " gave " << fmt::format("{}", d.chosen.output));
  }
}

BOOST_AUTO_TEST_CASE(views_of_nested_shard_orders_match_the_full_tensor) {
  // The harness varies placements in the default nesting order only; here
  // random layouts (half of them with a random nesting order) go through
  // the views on 2-D meshes.
  struct Case {
    const char* op;
    Shape shape;
    OpAttrs attrs;
  };
  const std::vector<Case> cases = {
      {"reshape", {8, 6}, shape_attrs({48})},       {"reshape", {4, 6, 2}, shape_attrs({24, 2})},
      {"reshape", {12, 2}, shape_attrs({4, 3, 2})}, {"transpose", {6, 5, 4}, transpose_attrs(0, 2)},
      {"unsqueeze", {6, 4}, dim_attrs(1)},          {"narrow", {9, 8}, narrow_attrs(1, 1, 5)},
      {"flatten", {4, 3, 5}, flatten_attrs(0, 1)},  {"expand", {8, 1}, shape_attrs({8, 3})},
  };
  std::mt19937_64 rng(99);
  for (const Shape& mesh_shape : {Shape{2, 2}, Shape{2, 3}}) {
    std::vector<std::pair<std::size_t, Layout>> runs;
    for (std::size_t c = 0; c < cases.size(); ++c)
      for (int k = 0; k < 6; ++k)
        runs.emplace_back(c, testing::random_layout(rng, 2, static_cast<int>(cases[c].shape.size()), ReduceOp::Sum, 1));
    on_mesh(mesh_shape, [&](DeviceMesh& mesh, testing::FailureLog& log) {
      for (const auto& [c, layout] : runs) {
        const Case& k = cases[c];
        const Tensor a = testing::integer_tensor(k.shape, DType::Float64, 50 + c);
        const Layout l = validate_layout(layout, mesh_shape, k.shape);
        DTensor x =
            DTensor::from_local(testing::source_shard(a, mesh_shape, l, mesh.coordinate(), 7), mesh, l, k.shape);
        DTensor y = call_op(k.op, {x}, k.attrs);
        Tensor got = y.full_tensor();
        if (mesh.rank() == 0 && !equal(got, call_op(k.op, {a}, k.attrs)))
          log.add(fmt::format("{} of {} on mesh {} gave {} with wrong values", k.op, l, fmt::join(mesh_shape, "x"),
                              y.placements()));
      }
    });
  }
}

BOOST_AUTO_TEST_CASE(transpose_of_a_row_shard_is_a_column_shard_without_communication) {
  const Tensor a = uniform({7, 5}, DType::Float64, 40);
  on_mesh({4}, [&](DeviceMesh& mesh, testing::FailureLog& log) {
    DTensor x = distribute_tensor(a, mesh, Layout::parse("S(0)"));
    CommCounter counter(mesh);
    DTensor y = transpose(x, 0, 1);
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("transpose issued {}", counter.counts()));
    if (y.placements() != Layout::parse("S(1)")) log.add(fmt::format("transpose gave {}", y.placements()));
    Tensor got = y.full_tensor();
    if (mesh.rank() == 0 && !equal(got, transpose(a, 0, 1))) log.add("transpose values differ");
  });
}

BOOST_AUTO_TEST_CASE(flattening_row_shards_keeps_them_without_communication) {
  // [8, 6] S(0) on 4 ranks: rows 2k..2k+1 are elements 12k..12k+11 of [48].
  const Tensor a = uniform({8, 6}, DType::Float64, 41);
  on_mesh({4}, [&](DeviceMesh& mesh, testing::FailureLog& log) {
    DTensor x = distribute_tensor(a, mesh, Layout::parse("S(0)"));
    CommCounter counter(mesh);
    DTensor y = reshape(x, {48});
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("reshape issued {}", counter.counts()));
    if (y.placements() != Layout::parse("S(0)")) log.add(fmt::format("reshape gave {}", y.placements()));
    Tensor got = y.full_tensor();
    if (mesh.rank() == 0 && !equal(got, reshape(a, {48}))) log.add("reshape values differ");
  });
}

BOOST_AUTO_TEST_CASE(flattening_column_shards_moves_them_to_rows_first) {
  // [8, 6] S(1): a rank's columns are not a contiguous run of [48], so the
  // input must move first. The only candidates keep S(0) (rows line up with
  // [48] S(0)) or replicate; the planner prices S(1) -> S(0) (one all_to_all)
  // below S(1) -> R (one all_gather), so the result stays sharded. (PyTorch
  // replicates here.)
  const Tensor a = uniform({8, 6}, DType::Float64, 42);
  on_mesh({4}, [&](DeviceMesh& mesh, testing::FailureLog& log) {
    DTensor x = distribute_tensor(a, mesh, Layout::parse("S(1)"));
    CommCounter counter(mesh);
    DTensor y = reshape(x, {48});
    CommStats moved = counter.counts();
    if (moved.data_collectives() != 1 || moved.count(CollectiveKind::AllToAll) != 1)
      log.add(fmt::format("reshape of S(1) issued {}", moved));
    if (y.placements() != Layout::parse("S(0)")) log.add(fmt::format("reshape of S(1) gave {}", y.placements()));
    Tensor got = y.full_tensor();
    if (mesh.rank() == 0 && !equal(got, reshape(a, {48}))) log.add("reshape values differ");
  });
}

BOOST_AUTO_TEST_CASE(flattening_uneven_row_shards_replicates_them) {
  // [7, 6] S(0) on 4 ranks gives rows 2,2,2,1 (flat runs of 12,12,12,6) but
  // [42] S(0) gives 11,11,11,9: the shard cannot be kept (PyTorch #179502).
  const Tensor a = uniform({7, 6}, DType::Float64, 43);
  on_mesh({4}, [&](DeviceMesh& mesh, testing::FailureLog& log) {
    DTensor x = distribute_tensor(a, mesh, Layout::parse("S(0)"));
    DTensor y = reshape(x, {42});
    if (y.placements() == Layout::parse("S(0)")) log.add("uneven reshape kept S(0)");
    Tensor got = y.full_tensor();
    if (mesh.rank() == 0 && !equal(got, reshape(a, {42}))) log.add("reshape values differ");
  });
}

BOOST_AUTO_TEST_CASE(cat_along_an_unsharded_dim_keeps_the_shards) {
  const Tensor a = uniform({7, 3}, DType::Float64, 44), b = uniform({7, 2}, DType::Float64, 45);
  on_mesh({2, 2}, [&](DeviceMesh& mesh, testing::FailureLog& log) {
    DTensor x = distribute_tensor(a, mesh, Layout::parse("S(0),R"));
    DTensor y = distribute_tensor(b, mesh, Layout::parse("S(0),R"));
    CommCounter counter(mesh);
    DTensor z = cat({x, y}, 1);
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("cat issued {}", counter.counts()));
    if (z.placements() != Layout::parse("S(0),R")) log.add(fmt::format("cat gave {}", z.placements()));
    Tensor got = z.full_tensor();
    if (mesh.rank() == 0 && !equal(got, cat({a, b}, 1))) log.add("cat values differ");
  });
}

BOOST_AUTO_TEST_CASE(split_keeps_the_shards_of_other_dims) {
  const Tensor a = uniform({5, 7}, DType::Float64, 46);
  on_mesh({4}, [&](DeviceMesh& mesh, testing::FailureLog& log) {
    DTensor x = distribute_tensor(a, mesh, Layout::parse("S(0)"));
    CommCounter counter(mesh);
    std::vector<DTensor> parts = split(x, 1, std::vector<std::int64_t>{3, 4});
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("split issued {}", counter.counts()));
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].placements() != Layout::parse("S(0)")) log.add(fmt::format("split gave {}", parts[i].placements()));
      Tensor got = parts[i].full_tensor();
      if (mesh.rank() == 0 && !equal(got, narrow(a, 1, i ? 3 : 0, i ? 4 : 3))) log.add("split values differ");
    }
  });
}

BOOST_AUTO_TEST_CASE(factories_match_the_full_tensor_on_every_layout) {
  const Shape shape{7, 5};
  const std::uint64_t seed = testing::seeded(1234);
  const std::vector<std::pair<Shape, std::vector<const char*>>> cases = {
      {{4}, {"R", "S(0)", "S(1)", "P(sum)"}},
      {{2, 2}, {"S(0),S(1)", "S(1),S(0)", "S(0),S(0)", "S(0)[1],S(0)[0]", "P(sum),S(1)"}},
      {{2, 3}, {"S(1),S(0)", "R,S(1)", "P(sum),P(sum)"}},
      {{8}, {"S(0)", "S(1)"}},
  };
  for (DType dtype : {DType::Float32, DType::Float64}) {
    const Tensor want_rand = Tensor::rand(shape, dtype, seed), want_randn = Tensor::randn(shape, dtype, seed);
    const Tensor want_arange = Tensor::arange(shape, dtype), want_full = Tensor::full(shape, 2.5, dtype);
    for (const auto& [mesh_shape, layouts] : cases)
      on_mesh(mesh_shape, [&](DeviceMesh& mesh, testing::FailureLog& log) {
        for (const char* text : layouts) {
          const Layout l = Layout::parse(text);
          auto check = [&](const char* what, const DTensor& t, const Tensor& want) {
            if (t.placements() != validate_layout(l, mesh_shape, shape))
              log.add(fmt::format("{} on {} has layout {}", what, text, t.placements()));
            Tensor got = t.full_tensor();
            if (mesh.rank() == 0 && !equal(got, want))
              log.add(fmt::format("{} {} on mesh {} layout {} differs (max |diff| {})", what, dtype,
                                  fmt::join(mesh_shape, "x"), text, max_abs_diff(got, want)));
          };
          check("rand", rand(shape, seed, mesh, l, dtype), want_rand);
          check("randn", randn(shape, seed, mesh, l, dtype), want_randn);
          check("arange", arange(shape, mesh, l, dtype), want_arange);
          check("full", full(shape, 2.5, mesh, l, dtype), want_full);
          check("zeros", zeros(shape, mesh, l, dtype), Tensor::zeros(shape, dtype));
          check("ones", ones(shape, mesh, l, dtype), Tensor::ones(shape, dtype));
        }
      });
  }
}

BOOST_AUTO_TEST_CASE(randn_looks_standard_normal) {
  Tensor t = Tensor::randn({100000}, DType::Float64, 7);
  double sum = 0, sq = 0;
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    double v = t.data_as<double>()[i];
    sum += v;
    sq += v * v;
  }
  const double mean = sum / t.numel(), var = sq / t.numel() - mean * mean;
  BOOST_TEST(std::abs(mean) < 0.02);
  BOOST_TEST(std::abs(var - 1) < 0.02);
  BOOST_TEST(!equal(Tensor::randn({8}, DType::Float64, 7), Tensor::randn({8}, DType::Float64, 8)));
}

BOOST_AUTO_TEST_SUITE_END()
