// Samples for the einsum ops (tests/op_cases.h), and known-answer tests of
// the einsum rule: what it computes, which layouts it picks, and the
// collectives it issues (none for matmul of S(1) by S(0) and for the
// column-then-row linear pair; exactly one all_reduce to replicate the
// result).
#include <boost/test/unit_test.hpp>

#include <algorithm>

#include "op_cases.h"
#include "support.h"

using namespace dtensor;
using dtensor::testing::OpSample;
using dtensor::testing::RegisterSamples;
using dtensor::testing::uniform;

namespace {

OpSample sample(std::vector<Tensor> inputs, std::string equation = {}) {
  OpSample s;
  s.inputs = std::move(inputs);
  if (!equation.empty()) s.attrs = EinsumAttrs{.equation = std::move(equation)};
  // f32 products of Partial addends (integers up to 512, tests/support.h)
  // lose more digits than the f64 samples.
  const bool f32 =
      std::any_of(s.inputs.begin(), s.inputs.end(), [](const Tensor& t) { return t.dtype() == DType::Float32; });
  s.rtol = s.atol = f32 ? 2e-3 : 1e-9;
  return s;
}

Tensor u(const Shape& shape, std::uint64_t seed, DType dtype = DType::Float64) { return uniform(shape, dtype, seed); }

const RegisterSamples einsum_samples("einsum", [](std::mt19937_64&) {
  std::vector<OpSample> s;
  s.push_back(sample({u({5, 7}, 1, DType::Float32), u({7, 3}, 2, DType::Float32)}, "ij,jk->ik"));
  s.push_back(sample({u({3, 5, 2}, 3), u({3, 2, 5}, 4)}, "bij,bjk->bik"));
  s.push_back(sample({u({3, 5, 2}, 5, DType::Float64), u({2, 7}, 6, DType::Float64)}, "bij,jk->kbi"));
  s.push_back(sample({u({5, 5}, 7)}, "ii->i"));
  s.push_back(sample({u({5, 3}, 8)}, "ij->"));
  s.push_back(sample({u({5, 3}, 9)}, "ij->ji"));
  s.push_back(sample({u({7}, 10), u({7}, 11)}, "i,i->"));
  s.push_back(sample({u({5}, 12), u({3}, 13)}, "i,j"));  // implicit output: outer product "ij"
  s.push_back(sample({u({2, 1, 3, 4}, 14), u({5, 4, 2}, 15)}, "...ij,...jk->...ik"));
  s.push_back(sample({u({1, 3, 4}, 16), u({5, 4, 3}, 17)}, "bij,bjk->bik"));  // size-1 batch broadcasts
  s.push_back(sample({u({3, 5}, 18), u({5, 2}, 19), u({2, 3}, 20)}, "ij,jk,kl->il"));
  OpSample ints = sample({Tensor::rand({5, 3}, DType::Int64, 21), Tensor::rand({3, 4}, DType::Int64, 22)}, "ij,jk->ik");
  ints.rtol = 0;
  ints.atol = 0;
  s.push_back(ints);
  return s;
});

const RegisterSamples matmul_samples("matmul", [](std::mt19937_64&) {
  std::vector<OpSample> s;
  s.push_back(sample({u({5, 7}, 31, DType::Float32), u({7, 3}, 32, DType::Float32)}));
  s.push_back(sample({u({7}, 33), u({7, 3}, 34)}));
  s.push_back(sample({u({5, 7}, 35), u({7}, 36)}));
  s.push_back(sample({u({7}, 37), u({7}, 38)}));
  s.push_back(sample({u({2, 1, 3, 4}, 39), u({3, 4, 5}, 40)}));  // batch [2,1] x [3] -> [2,3]
  s.push_back(sample({u({3, 5, 4}, 41, DType::Float64), u({4, 2}, 42, DType::Float64)}));
  s.push_back(sample({u({5}, 43), u({3, 5, 2}, 44)}));
  return s;
});

const RegisterSamples bmm_samples("bmm", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({3, 5, 4}, 51, DType::Float32), u({3, 4, 2}, 52, DType::Float32)}),
                               sample({u({5, 2, 3}, 53, DType::Float64), u({5, 3, 3}, 54, DType::Float64)})};
});

const RegisterSamples linear_samples("linear", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({5, 7}, 61, DType::Float32), u({3, 7}, 62, DType::Float32)}),
                               sample({u({2, 3, 4}, 63), u({5, 4}, 64)}), sample({u({4}, 65), u({3, 4}, 66)})};
});

const RegisterSamples linear_bias_samples("linear_bias", [](std::mt19937_64&) {
  return std::vector<OpSample>{sample({u({5, 7}, 71, DType::Float32), u({3, 7}, 72, DType::Float32),
                                       u({3}, 73, DType::Float32)}),
                               sample({u({2, 5, 4}, 74), u({6, 4}, 75), u({6}, 76)})};
});

/// The naive product of row-major matrices, for known answers.
Tensor naive_matmul(const Tensor& a, const Tensor& b) {
  const std::int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  Tensor c = Tensor::zeros({m, n}, DType::Float64);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (std::int64_t l = 0; l < k; ++l) acc += a.get({i, l}) * b.get({l, j});
      c.set({i, j}, acc);
    }
  return c;
}

Tensor as_f64(const Tensor& t) {
  Tensor out = Tensor::empty(t.shape(), DType::Float64);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    Shape idx = unravel_index(i, t.shape());
    out.set(idx, t.get(idx));
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(einsum_family)

BOOST_AUTO_TEST_CASE(known_values) {
  Tensor a = Tensor::arange({2, 3}, DType::Float32);  // [[0,1,2],[3,4,5]]
  Tensor b = Tensor::arange({3, 2}, DType::Float32);  // [[0,1],[2,3],[4,5]]
  BOOST_TEST(equal(matmul(a, b), Tensor::from_vector<float>({10, 13, 28, 40}, {2, 2})));
  BOOST_TEST(equal(linear(a, a), Tensor::from_vector<float>({5, 14, 14, 50}, {2, 2})));
  BOOST_TEST(equal(linear(a, a, Tensor::from_vector<float>({1, -1}, {2})),
                   Tensor::from_vector<float>({6, 13, 15, 49}, {2, 2})));
  BOOST_TEST(equal(einsum("ij->ji", {a}), Tensor::from_vector<float>({0, 3, 1, 4, 2, 5}, {3, 2})));
  BOOST_TEST(equal(einsum("ij->", {a}), Tensor::from_vector<float>({15}, {})));
  BOOST_TEST(
      equal(einsum("ii->i", {Tensor::arange({3, 3}, DType::Float32)}), Tensor::from_vector<float>({0, 4, 8}, {3})));
  BOOST_TEST(equal(einsum("ii", {Tensor::arange({3, 3}, DType::Float32)}), Tensor::from_vector<float>({12}, {})));
  Tensor ai = Tensor::arange({2, 3}, DType::Int64);
  BOOST_TEST(equal(matmul(ai, Tensor::arange({3, 2}, DType::Int64)),
                   Tensor::from_vector<std::int64_t>({10, 13, 28, 40}, {2, 2})));
  // 1-D cases of torch.matmul.
  Tensor v = Tensor::from_vector<float>({1, 2, 3}, {3});
  BOOST_TEST(equal(matmul(a, v), Tensor::from_vector<float>({8, 26}, {2})));
  BOOST_TEST(equal(matmul(v, b), Tensor::from_vector<float>({16, 22}, {2})));
  BOOST_TEST(equal(matmul(v, v), Tensor::from_vector<float>({14}, {})));
  // Empty contracted dim: zeros.
  BOOST_TEST(equal(matmul(Tensor::zeros({2, 0}), Tensor::zeros({0, 3})), Tensor::zeros({2, 3})));
}

BOOST_AUTO_TEST_CASE(large_products_match_a_naive_loop) {
  // Big enough for the BLAS kernels; shapes that are not multiples of any block.
  for (DType dt : {DType::Float32, DType::Float64}) {
    Tensor a = uniform({67, 131}, dt, 1);
    Tensor b = uniform({131, 45}, dt, 2);
    BOOST_TEST(allclose(as_f64(matmul(a, b)), naive_matmul(as_f64(a), as_f64(b)), 1e-4, 1e-4));
    // Transposed operands go through the transposition flags, not copies.
    Tensor bt = einsum("ij->ji", {b});
    BOOST_TEST(allclose(as_f64(linear(a, bt)), naive_matmul(as_f64(a), as_f64(b)), 1e-4, 1e-4));
    Tensor at = einsum("ij->ji", {a});
    BOOST_TEST(allclose(as_f64(einsum("ki,kj->ij", {at, b})), naive_matmul(as_f64(a), as_f64(b)), 1e-4, 1e-4));
  }
}

BOOST_AUTO_TEST_CASE(ranks_run_their_products_concurrently) {
  // Every rank thread calls the BLAS at once (the library pins OpenBLAS to
  // the caller's thread); each must get exactly the single-thread result.
  Tensor a = uniform({150, 230}, DType::Float32, 3), b = uniform({230, 170}, DType::Float32, 4);
  const Tensor expected = matmul(a, b);
  testing::FailureLog log;
  run_threads(4, [&](Communicator& world) {
    for (int i = 0; i < 5; ++i)
      if (!equal(matmul(a, b), expected)) log.add(fmt::format("rank {} call {}: values differ", world.rank(), i));
  });
  testing::check_no_failures(log.failures);
  BOOST_TEST(log.failures.empty());
}

BOOST_AUTO_TEST_CASE(shape_errors_name_the_op_and_the_shapes) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const ShapeError& e) {
      return std::string(e.what());
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  BOOST_TEST(message([] {
               matmul(Tensor::zeros({3, 4}), Tensor::zeros({5, 6}));
             }) == "[matmul] shapes 3x4 and 5x6: the contracted dims differ (4 vs 5)");
  BOOST_TEST(message([] { linear(Tensor::zeros({3, 4}), Tensor::zeros({5, 6})); }).starts_with("[linear] expects x"));
  BOOST_TEST(message([] {
               linear(Tensor::zeros({3, 4}), Tensor::zeros({5, 4}), Tensor::zeros({4}));
             }).starts_with("[linear_bias] bias of shape 4"));
  BOOST_TEST(message([] {
               einsum("ij,jk->ik", {Tensor::zeros({3, 4}), Tensor::zeros({5, 6})});
             }).starts_with("[einsum] dim 'j' has sizes 4 and 5"));
  BOOST_TEST(message([] {
               einsum("ij,jk->iz", {Tensor::zeros({3, 4}), Tensor::zeros({4, 6})});
             }) == "[einsum] equation 'ij,jk->iz': output label 'z' is in no operand");
  BOOST_TEST(message([] { bmm(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 4, 5})); }).starts_with("[bmm] expects"));
}

BOOST_AUTO_TEST_CASE(matmul_of_column_and_row_shards_is_partial_without_communication) {
  Tensor a = uniform({8, 10}, DType::Float64, 3);
  Tensor b = uniform({10, 6}, DType::Float64, 4);
  const Tensor expected = matmul(a, b);
  testing::FailureLog log;
  run_threads(4, [&](Communicator& world) {
    DeviceMesh mesh(world, {4});
    DTensor x = distribute_tensor(a, mesh, Layout::parse("S(1)"));
    DTensor y = distribute_tensor(b, mesh, Layout::parse("S(0)"));
    CommCounter counter(mesh);
    DTensor z = matmul(x, y);
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("matmul issued {}", counter.counts()));
    if (z.placements() != Layout::parse("P(sum)")) log.add(fmt::format("matmul gave {}", z.placements()));
    Tensor full = z.full_tensor();
    if (world.rank() == 0 && !allclose(full, expected, 1e-12, 1e-12)) log.add("matmul values differ");
  });
  testing::check_no_failures(log.failures);
  BOOST_TEST(log.failures.empty());
}

BOOST_AUTO_TEST_CASE(column_then_row_parallel_linear_needs_one_all_reduce) {
  // Megatron MLP: x R; W1 [h, d] S(0), b1 S(0) -> y S(-1); W2 [d, h] S(1),
  // b2 R -> P(sum) with no collective; replicating it is one all_reduce.
  const std::int64_t tokens = 5, d = 6, h = 10;
  Tensor x = uniform({tokens, d}, DType::Float64, 5);
  Tensor w1 = uniform({h, d}, DType::Float64, 6), b1 = uniform({h}, DType::Float64, 7);
  Tensor w2 = uniform({d, h}, DType::Float64, 8), b2 = uniform({d}, DType::Float64, 9);
  const Tensor expected = linear(linear(x, w1, b1), w2, b2);
  const Tensor expected_nobias = linear(linear(x, w1), w2);
  testing::FailureLog log;
  for (const Shape& mesh_shape : {Shape{4}, Shape{3}}) {
    run_threads(static_cast<int>(mesh_shape[0]), [&](Communicator& world) {
      DeviceMesh mesh(world, mesh_shape);
      DTensor xd = distribute_tensor(x, mesh, Layout::parse("R"));
      DTensor w1d = distribute_tensor(w1, mesh, Layout::parse("S(0)"));
      DTensor b1d = distribute_tensor(b1, mesh, Layout::parse("S(0)"));
      DTensor w2d = distribute_tensor(w2, mesh, Layout::parse("S(1)"));
      DTensor b2d = distribute_tensor(b2, mesh, Layout::parse("R"));
      for (bool with_bias : {false, true}) {
        CommCounter counter(mesh);
        DTensor y = with_bias ? linear(xd, w1d, b1d) : linear(xd, w1d);
        if (y.placements() != Layout::parse("S(1)")) log.add(fmt::format("column parallel gave {}", y.placements()));
        DTensor z = with_bias ? linear(y, w2d, b2d) : linear(y, w2d);
        if (z.placements() != Layout::parse("P(sum)")) log.add(fmt::format("row parallel gave {}", z.placements()));
        if (counter.counts().data_collectives() != 0) log.add(fmt::format("the pair issued {}", counter.counts()));
        CommCounter reduce(mesh);
        DTensor r = z.redistribute(Layout::parse("R"));
        if (reduce.counts().data_collectives() != 1 || reduce.count(CollectiveKind::AllReduce) != 1)
          log.add(fmt::format("P(sum) -> R issued {}", reduce.counts()));
        if (world.rank() == 0 && !allclose(r.to_local(), with_bias ? expected : expected_nobias, 1e-12, 1e-12))
          log.add(fmt::format("mesh {} bias {}: values differ", mesh_shape[0], with_bias));
      }
    });
  }
  testing::check_no_failures(log.failures);
  BOOST_TEST(log.failures.empty());
}

BOOST_AUTO_TEST_CASE(batch_and_free_dims_stay_sharded) {
  // bmm with the batch dim sharded on both: no communication, S(0) out; a
  // free dim of one operand sharded: the other stays replicated.
  Tensor a = uniform({5, 3, 4}, DType::Float64, 10), b = uniform({5, 4, 2}, DType::Float64, 11);
  const Tensor expected = bmm(a, b);
  testing::FailureLog log;
  run_threads(4, [&](Communicator& world) {
    DeviceMesh mesh(world, {2, 2});
    DTensor x = distribute_tensor(a, mesh, Layout::parse("S(0),S(1)"));
    DTensor y = distribute_tensor(b, mesh, Layout::parse("S(0),R"));
    CommCounter counter(mesh);
    DTensor z = bmm(x, y);
    if (counter.counts().data_collectives() != 0) log.add(fmt::format("bmm issued {}", counter.counts()));
    if (z.placements() != Layout::parse("S(0),S(1)")) log.add(fmt::format("bmm gave {}", z.placements()));
    Tensor full = z.full_tensor();
    if (world.rank() == 0 && !allclose(full, expected, 1e-12, 1e-12)) log.add("bmm values differ");
  });
  testing::check_no_failures(log.failures);
  BOOST_TEST(log.failures.empty());
}

BOOST_AUTO_TEST_SUITE_END()
