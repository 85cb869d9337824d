// Autograd's rules over the fused backward ops (max, min, norm, layer_norm,
// rms_norm, embedding, pick, cross_entropy, gelu, silu, the softmaxes) and
// einsum's '...' and repeated subscripts: finite differences on plain
// Tensors (f64), the same gradients on DTensors over several random layouts
// on meshes 4, 2x2 and 2x3 with non-dividing shapes, ties of max/min, and
// what the row-sharded embedding and the vocab-parallel cross entropy
// communicate.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <random>

#include "support.h"

using namespace dtensor;

namespace autograd_rules_suite {

Tensor uniform(const Shape& shape, std::uint64_t seed, double lo = -1, double hi = 1) {
  Tensor t = Tensor::rand(shape, DType::Float64, seed);
  double* p = t.data_as<double>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * p[i];
  return t;
}

Tensor indices(const Shape& shape, std::int64_t bound, std::uint64_t seed) {
  Tensor t = Tensor::zeros(shape, DType::Int64);
  std::mt19937_64 rng(seed);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<std::int64_t>()[i] = static_cast<std::int64_t>(rng() % bound);
  return t;
}

template <class X>
using Fn = std::function<X(const std::vector<X>&, const std::vector<X>&)>;

/// One rule under test: the floating inputs (which get gradients), the i64
/// inputs (indices, targets: value bound per input), and the program.
struct Case {
  std::string name;
  std::vector<Shape> shapes;
  std::vector<std::pair<Shape, std::int64_t>> ints;
  Fn<Tensor> on_tensor;
  Fn<DTensor> on_dtensor;
};

#define CASE(NAME, SHAPES, INTS, BODY)                                                                     \
  Case {                                                                                                   \
    NAME, SHAPES, INTS, [](const std::vector<Tensor>& in, const std::vector<Tensor>& ix) { return BODY; }, \
        [](const std::vector<DTensor>& in, const std::vector<DTensor>& ix) { return BODY; }                \
  }

template <class X>
X weighted_sum(const X& y, const X& w) {
  return sum(mul(y, w));
}

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<Case> cases() {
  using S = std::vector<Shape>;
  using I = std::vector<std::pair<Shape, std::int64_t>>;
  return {
      CASE("max_dim", (S{{5, 3, 4}}), I{}, max(in[0], {1})),
      CASE("max_keepdim", (S{{5, 3, 4}}), I{}, max(in[0], {0, 2}, true)),
      CASE("max_all", (S{{5, 3}}), I{}, max(in[0])),
      CASE("min_dim", (S{{5, 3, 4}}), I{}, min(in[0], {-1})),
      CASE("min_all", (S{{5, 3}}), I{}, min(in[0])),
      CASE("norm2_dim", (S{{5, 3, 4}}), I{}, norm(in[0], 2, {1})),
      CASE("norm2_all", (S{{5, 3}}), I{}, norm(in[0])),
      CASE("norm1", (S{{5, 3}}), I{}, norm(in[0], 1, {0})),
      CASE("norm3_keepdim", (S{{5, 3}}), I{}, norm(in[0], 3, {1}, true)),
      CASE("norm_inf", (S{{5, 3}}), I{}, norm(in[0], kInf, {1})),
      CASE("norm_neg_inf", (S{{5, 3}}), I{}, norm(in[0], -kInf, {0})),
      CASE("layer_norm", (S{{5, 6}}), I{}, layer_norm(in[0], 1)),
      CASE("layer_norm_weight_bias", (S{{5, 6}, {6}, {6}}), I{}, layer_norm(in[0], 1, in[1], in[2])),
      CASE("layer_norm_2d_weight", (S{{2, 3, 4}, {3, 4}}), I{}, layer_norm(in[0], 2, in[1])),
      CASE("rms_norm", (S{{5, 6}}), I{}, rms_norm(in[0], 1)),
      CASE("rms_norm_weight", (S{{2, 5, 6}, {6}}), I{}, rms_norm(in[0], 1, in[1])),
      CASE("embedding", (S{{10, 4}}), (I{{{3, 5}, 10}}), embedding(ix[0], in[0])),
      CASE("pick", (S{{6, 10}}), (I{{{6}, 10}}), pick(in[0], ix[0])),
      CASE("cross_entropy", (S{{6, 10}}), (I{{{6}, 10}}), cross_entropy(in[0], ix[0])),
      CASE("cross_entropy_chain", (S{{6, 4}, {4, 10}}), (I{{{6}, 10}}), cross_entropy(matmul(in[0], in[1]), ix[0])),
      CASE("gelu", (S{{5, 7}}), I{}, gelu(in[0])),
      CASE("silu", (S{{5, 7}}), I{}, silu(in[0])),
      CASE("softmax", (S{{5, 7}}), I{}, softmax(in[0], 0)),
      CASE("log_softmax", (S{{5, 7}}), I{}, log_softmax(in[0], -1)),
      CASE("einsum_ellipsis", (S{{2, 5, 3}, {3, 4}}), I{}, einsum("...ij,...jk->...ik", {in[0], in[1]})),
      CASE("einsum_ellipsis_implicit", (S{{2, 5, 3}, {3, 4}}), I{}, einsum("...ij,jk", {in[0], in[1]})),
      CASE("einsum_ellipsis_summed", (S{{2, 5, 3}}), I{}, einsum("...j->j", {in[0]})),
      CASE("einsum_diagonal", (S{{4, 4}}), I{}, einsum("ii->i", {in[0]})),
      CASE("einsum_trace", (S{{4, 4}}), I{}, einsum("ii->", {in[0]})),
      CASE("einsum_diagonal_mixed", (S{{3, 3, 5}, {5}}), I{}, einsum("iij,j->ij", {in[0], in[1]})),
      CASE("einsum_broadcast_dim", (S{{5, 1}, {5, 3}}), I{}, einsum("ij,ij->ij", {in[0], in[1]})),
      CASE("einsum_elementwise", (S{{5, 3}, {5, 3}}), I{}, einsum("ij,ij->ij", {in[0], in[1]})),
  };
}

struct Inputs {
  std::vector<Tensor> floats, ints;
};

Inputs inputs_of(const Case& c, std::uint64_t seed) {
  Inputs in;
  for (std::size_t i = 0; i < c.shapes.size(); ++i) in.floats.push_back(uniform(c.shapes[i], seed + 17 * i));
  for (std::size_t i = 0; i < c.ints.size(); ++i)
    in.ints.push_back(indices(c.ints[i].first, c.ints[i].second, seed + 31 * i));
  return in;
}

Tensor loss_weight(const Tensor& y, std::uint64_t seed) { return uniform(y.shape(), seed ^ 0x5eed, -1, 1); }

/// The gradients of sum(f(in) * w) by backward.
std::vector<Tensor> backward_grads(const Case& c, const Inputs& given, std::uint64_t seed) {
  std::vector<Tensor> in;
  for (const Tensor& x : given.floats) in.push_back(x.detach().requires_grad_());
  Tensor y = c.on_tensor(in, given.ints);
  Tensor w = loss_weight(y.detach(), seed);
  weighted_sum(y, w).backward();
  std::vector<Tensor> out;
  for (auto& x : in) out.push_back(x.grad() ? *x.grad() : Tensor::zeros(x.shape(), x.dtype()));
  return out;
}

BOOST_AUTO_TEST_SUITE(autograd_rules)

BOOST_AUTO_TEST_CASE(finite_differences_agree_with_backward) {
  const std::uint64_t seed = testing::seeded(4321);
  int checked = 0;
  for (const Case& c : cases()) {
    const Inputs in = inputs_of(c, seed);
    const std::vector<Tensor> got = backward_grads(c, in, seed);
    NoGradGuard no_grad;
    const Tensor w = loss_weight(c.on_tensor(in.floats, in.ints), seed);
    auto loss = [&](const std::vector<Tensor>& xs) { return weighted_sum(c.on_tensor(xs, in.ints), w).get({}); };
    for (std::size_t i = 0; i < in.floats.size(); ++i) {
      const double eps = 1e-6;
      double worst = 0;
      for (std::int64_t k = 0; k < in.floats[i].numel(); ++k) {
        std::vector<Tensor> plus = in.floats, minus = in.floats;
        plus[i] = in.floats[i].clone();
        minus[i] = in.floats[i].clone();
        plus[i].data_as<double>()[k] += eps;
        minus[i].data_as<double>()[k] -= eps;
        const double numeric = (loss(plus) - loss(minus)) / (2 * eps);
        const double analytic = got[i].data_as<double>()[k];
        worst = testing::worse(worst, std::abs(numeric - analytic) / (1e-6 + std::abs(numeric)));
      }
      BOOST_TEST(worst < 1e-5,
                 "case " << c.name << " input " << i << " seed " << seed << ": worst relative error " << worst);
      ++checked;
    }
  }
  BOOST_TEST(checked >= 40);
}

// Each case on DTensors in seeded random layouts (no Partial), three draws
// per mesh, agrees with the plain gradient once gathered.
BOOST_AUTO_TEST_CASE(dtensor_gradients_equal_the_unsharded_ones) {
  const std::vector<Shape> meshes = testing::backend_meshes({{4}, {2, 2}, {2, 3}});
  const std::uint64_t seed = testing::seeded(77);
  const auto all = cases();
  std::vector<Inputs> inputs;
  std::vector<std::vector<Tensor>> expected;
  std::vector<Tensor> weights;
  for (const Case& c : all) {
    inputs.push_back(inputs_of(c, seed));
    expected.push_back(backward_grads(c, inputs.back(), seed));
    NoGradGuard no_grad;
    weights.push_back(loss_weight(c.on_tensor(inputs.back().floats, inputs.back().ints), seed));
  }
  for (const Shape& mesh_shape : meshes) {
    std::vector<std::string> failures;
    std::mutex mu;
    testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
      DeviceMesh mesh(comm, mesh_shape);
      std::mt19937_64 rng(seed);
      for (std::size_t ci = 0; ci < all.size(); ++ci) {
        const Case& c = all[ci];
        for (int draw = 0; draw < 3; ++draw) {
          std::vector<DTensor> din, dix;
          std::vector<Layout> layouts;
          for (const Tensor& x : inputs[ci].floats) {
            layouts.push_back(testing::random_layout(rng, mesh.ndim(), x.dim(), ReduceOp::Sum, 0));
            din.push_back(distribute_tensor(x, mesh, layouts.back()));
            din.back().requires_grad_();
          }
          for (const Tensor& x : inputs[ci].ints)
            dix.push_back(
                distribute_tensor(x, mesh, testing::random_layout(rng, mesh.ndim(), x.dim(), ReduceOp::Sum, 0)));
          DTensor y = c.on_dtensor(din, dix);
          weighted_sum(y, distribute_tensor(weights[ci], mesh, Layout::replicated(mesh.ndim()))).backward();
          for (std::size_t i = 0; i < din.size(); ++i) {
            const Tensor& want = expected[ci][i];
            Tensor got = din[i].grad() ? din[i].grad()->full_tensor() : Tensor::zeros(want.shape(), want.dtype());
            if (!allclose(got, want, 1e-9, 1e-9)) {
              std::lock_guard lock(mu);
              failures.push_back(fmt::format("mesh {} case {} input {} layout {} draw {} seed {}: off by {}",
                                             fmt::join(mesh_shape, "x"), c.name, i, layouts[i], draw, seed,
                                             max_abs_diff(got, want)));
            }
          }
        }
      }
    });
    testing::check_no_failures(failures);
  }
}

// ---- max and min with ties: the first extreme of each group gets it ----------------

/// The gradient of sum(max or min over `dims` of x * w) for a 2-D x: w's
/// entry at the first extreme (row-major within the group), zeros elsewhere.
Tensor first_extreme_grad(const Tensor& x, const std::vector<std::int64_t>& dims, const Tensor& w, bool max) {
  const auto rows = x.shape()[0], cols = x.shape()[1];
  const bool r0 = dims.empty() || std::count(dims.begin(), dims.end(), 0),
             r1 = dims.empty() || std::count(dims.begin(), dims.end(), 1);
  Tensor g = Tensor::zeros(x.shape(), DType::Float64);
  const double* px = x.data_as<double>();
  const double* pw = w.data_as<double>();
  for (std::int64_t gi = 0; gi < (r0 ? 1 : rows); ++gi)
    for (std::int64_t gj = 0; gj < (r1 ? 1 : cols); ++gj) {
      std::int64_t best = -1;
      for (std::int64_t i = r0 ? 0 : gi; i < (r0 ? rows : gi + 1); ++i)
        for (std::int64_t j = r1 ? 0 : gj; j < (r1 ? cols : gj + 1); ++j) {
          const double v = px[i * cols + j];
          if (best < 0 || (max ? v > px[best] : v < px[best])) best = i * cols + j;
        }
      const std::int64_t out = r0 ? (r1 ? 0 : gj) : (r1 ? gi : gi * cols + gj);
      g.data_as<double>()[best] = pw[out];
    }
  return g;
}

BOOST_AUTO_TEST_CASE(max_and_min_ties_go_to_the_first_element_on_every_layout) {
  Tensor x = Tensor::zeros({3, 5}, DType::Float64);
  const double values[] = {1, 3, 3, 0, 3, 2, 2, 0, -1, 2, 5, 5, 5, 5, 5};
  std::copy(std::begin(values), std::end(values), x.data_as<double>());
  const std::vector<std::vector<std::int64_t>> reductions{{1}, {0}, {}};
  const std::vector<std::pair<Shape, std::vector<const char*>>> meshes{{{4}, {"R", "S(0)", "S(1)"}},
                                                                       {{2, 2},
                                                                        {"S(0),S(1)", "S(1),S(1)", "R,S(1)", "S(1),R"}},
                                                                       {{2, 3}, {"S(1),S(0)", "S(0),S(1)"}}};
  for (bool is_max : {true, false})
    for (const auto& dims : reductions) {
      Tensor probe = is_max ? max(x, dims) : min(x, dims);
      const Tensor w = uniform(probe.shape(), 5, 1, 2);
      const Tensor want = first_extreme_grad(x, dims, w, is_max);
      Tensor plain = x.detach().requires_grad_();
      weighted_sum(is_max ? max(plain, dims) : min(plain, dims), w).backward();
      BOOST_TEST(allclose(*plain.grad(), want, 0, 0),
                 (is_max ? "max" : "min") << " over " << fmt::format("{}", fmt::join(dims, ",")) << " on a Tensor");
      for (const auto& [mesh_shape, layouts] : meshes) {
        if (!testing::can_run(numel(mesh_shape))) continue;
        std::vector<std::string> failures;
        std::mutex mu;
        testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
          DeviceMesh mesh(comm, mesh_shape);
          for (const char* layout : layouts) {
            DTensor dx = distribute_tensor(x, mesh, Layout::parse(layout));
            dx.requires_grad_();
            weighted_sum(is_max ? max(dx, dims) : min(dx, dims),
                         distribute_tensor(w, mesh, Layout::replicated(mesh.ndim())))
                .backward();
            if (!allclose(dx.grad()->full_tensor(), want, 0, 0)) {
              std::lock_guard lock(mu);
              failures.push_back(fmt::format("{} over {} on mesh {} from {}: the tie went elsewhere",
                                             is_max ? "max" : "min", fmt::join(dims, ","), fmt::join(mesh_shape, "x"),
                                             layout));
            }
          }
        });
        testing::check_no_failures(failures);
      }
    }
}

// ---- Communication ---------------------------------------------------------------

// A row-sharded table's gradient fills its own rows only: S(0), and the
// table is never gathered.
BOOST_AUTO_TEST_CASE(row_sharded_embedding_gradient_stays_sharded) {
  if (!testing::can_run(4)) return;
  const Tensor table = uniform({10, 4}, 3);
  const Tensor idx = indices({3, 5}, 10, 4);
  const Tensor w = uniform({3, 5, 4}, 6);
  Tensor plain = table.detach().requires_grad_();
  weighted_sum(embedding(idx, plain), w).backward();
  const Tensor want = *plain.grad();
  std::vector<std::string> failures;
  std::mutex mu;
  testing::run_ranks(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {4});
    DTensor t = distribute_tensor(table, mesh, Layout::parse("S(0)"));
    t.requires_grad_();
    const DTensor di = distribute_tensor(idx, mesh, Layout::parse("R"));
    DTensor loss = weighted_sum(embedding(di, t), distribute_tensor(w, mesh, Layout::parse("R")));
    CommCounter counter(mesh);
    loss.backward();
    const CommStats c = counter.counts();
    std::string why;
    if (c.count(CollectiveKind::AllGather) != 0 || c.data_collectives() != 0)
      why += fmt::format(" backward issued {} (expected nothing)", c);
    if (t.grad()->placements() != Layout::parse("S(0)"))
      why += fmt::format(" gradient in {} (expected S(0))", t.grad()->placements());
    if (!allclose(t.grad()->full_tensor(), want, 1e-12, 1e-12)) why += " wrong values";
    if (!why.empty()) {
      std::lock_guard lock(mu);
      failures.push_back("embedding with the table S(0) on mesh 4:" + why);
    }
  });
  testing::check_no_failures(failures);
}

// Vocab-parallel cross entropy: the logits' gradient comes out class-sharded
// and no collective of the backward moves logits-sized data.
BOOST_AUTO_TEST_CASE(vocab_parallel_cross_entropy_backward_moves_no_logits) {
  if (!testing::can_run(4)) return;
  const std::int64_t n = 6, classes = 50;
  const Tensor logits = uniform({n, classes}, 8, -3, 3);
  const Tensor targets = indices({n}, classes, 9);
  Tensor plain = logits.detach().requires_grad_();
  cross_entropy(plain, targets).backward();
  const Tensor want = *plain.grad();
  const std::uint64_t logits_bytes = static_cast<std::uint64_t>(n * classes) * sizeof(double);
  std::vector<std::string> failures;
  std::mutex mu;
  testing::run_ranks(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {4});
    DTensor z = distribute_tensor(logits, mesh, Layout::parse("S(1)"));
    z.requires_grad_();
    const DTensor t = distribute_tensor(targets, mesh, Layout::parse("R"));
    CommCounter whole(mesh);
    DTensor loss = cross_entropy(z, t);
    CommCounter counter(mesh);
    loss.backward();
    const CommStats back = counter.counts(), all = whole.counts();
    std::string why;
    // A gather of the logits would bring each rank 3/4 of them; the rows'
    // values (the max, the sum of exps, the log-sum-exp) are n doubles a
    // collective.
    if (back.recv_bytes >= logits_bytes / 8 || all.recv_bytes >= logits_bytes / 4)
      why += fmt::format(" forward and backward issued {}, the backward {} ({} bytes in; the logits are {} bytes)", all,
                         back, back.recv_bytes, logits_bytes);
    if (z.grad()->placements() != Layout::parse("S(1)"))
      why += fmt::format(" gradient in {} (expected S(1))", z.grad()->placements());
    if (!allclose(z.grad()->full_tensor(), want, 1e-12, 1e-12)) why += " wrong values";
    if (!why.empty()) {
      std::lock_guard lock(mu);
      failures.push_back("cross_entropy with the logits S(1) on mesh 4:" + why);
    }
  });
  testing::check_no_failures(failures);
}

// ---- Errors ------------------------------------------------------------------------

// An op whose rule is taken away fails at backward, naming it, and not at
// forward time.
BOOST_AUTO_TEST_CASE(an_op_without_a_rule_fails_at_backward_naming_it) {
  const Op op = Op::find("max");
  const auto rule = backward_rule(op.def());
  BOOST_REQUIRE(rule);
  set_backward(op, nullptr);
  Tensor x = uniform({4, 3}, 1).requires_grad_();
  Tensor m = sum(max(x, {1}));  // forward is fine
  try {
    m.backward();
    set_backward(op, rule);
    BOOST_FAIL("expected AutogradError");
  } catch (const AutogradError& e) {
    set_backward(op, rule);
    BOOST_TEST(std::string(e.what()).find("'max'") != std::string::npos, e.what());
  }
  Tensor again = x.detach().requires_grad_();
  sum(max(again, {1})).backward();
  BOOST_TEST(again.grad().has_value());
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace autograd_rules_suite
