// Autograd: finite-difference gradient checks on plain Tensors (f64), the
// same gradients on DTensors over meshes 4, 2x2 and 2x3 with non-dividing
// shapes, recomputation, and the errors. The layout changes' backward
// collectives and the Megatron and data-parallel communication counts are in
// test_autograd_comm.cpp (the same suite).
#include <boost/test/unit_test.hpp>

#include <functional>
#include <mutex>
#include <random>
#include <tuple>

#include "support.h"

using namespace dtensor;

namespace autograd_suite {

Tensor uniform(const Shape& shape, std::uint64_t seed, double lo = -1, double hi = 1) {
  Tensor t = Tensor::rand(shape, DType::Float64, seed);
  double* p = t.data_as<double>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * p[i];
  return t;
}

template <class X>
using Fn = std::function<X(const std::vector<X>&)>;

/// One op under test: its input shapes (and value range), and the program
/// on Tensor and DTensor alike.
struct Case {
  std::string name;
  std::vector<Shape> shapes;
  Fn<Tensor> on_tensor;
  Fn<DTensor> on_dtensor;
  double lo = -1, hi = 1;
  bool sharded = true;  // also in the DTensor sweep
};

#define CASE(NAME, SHAPES, BODY, ...)                                      \
  Case {                                                                   \
    NAME, SHAPES, [](const std::vector<Tensor>& in) { return BODY; },      \
        [](const std::vector<DTensor>& in) { return BODY; }, ##__VA_ARGS__ \
  }

template <class X>
X weighted_sum(const X& y, const X& w) {
  return sum(mul(y, w));
}

// split's pieces: one unused (its gradient is zeros), one used twice (its
// gradients summed before the split's one cat).
template <class X>
X split_some(const X& x) {
  const std::vector<X> p = split(x, 1, std::vector<std::int64_t>{1, 3, 2});
  return cat({p[2], mul(p[0], p[0]), p[2]}, 1);
}

std::vector<Case> cases() {
  using S = std::vector<Shape>;
  return {
      CASE("neg", (S{{5, 3}}), neg(in[0])),
      CASE("abs", (S{{5, 3}}), abs(in[0])),
      CASE("exp", (S{{5, 3}}), exp(in[0])),
      CASE("log", (S{{5, 3}}), log(in[0]), 0.5, 2.0),
      CASE("sqrt", (S{{5, 3}}), sqrt(in[0]), 0.5, 2.0),
      CASE("rsqrt", (S{{5, 3}}), rsqrt(in[0]), 0.5, 2.0),
      CASE("tanh", (S{{5, 3}}), tanh(in[0])),
      CASE("sigmoid", (S{{5, 3}}), sigmoid(in[0])),
      CASE("relu", (S{{5, 3}}), relu(in[0])),
      CASE("gelu", (S{{5, 3}}), gelu(in[0])),
      CASE("silu", (S{{5, 3}}), silu(in[0])),
      CASE("add_scalar", (S{{5, 3}}), add(in[0], 1.5)),
      CASE("mul_scalar", (S{{5, 3}}), mul(in[0], -2.5)),
      CASE("div_scalar", (S{{5, 3}}), div(in[0], 4.0)),
      CASE("pow_scalar", (S{{5, 3}}), pow(in[0], 3.0)),
      CASE("add_broadcast", (S{{5, 3}, {3}}), add(in[0], in[1])),
      CASE("sub_broadcast", (S{{5, 1}, {5, 3}}), sub(in[0], in[1])),
      CASE("mul_broadcast", (S{{2, 5, 3}, {5, 1}}), mul(in[0], in[1])),
      CASE("div", (S{{5, 3}, {5, 3}}), div(in[0], in[1]), 0.5, 2.0),
      CASE("pow", (S{{5, 3}, {5, 3}}), pow(in[0], in[1]), 0.5, 2.0),
      CASE("maximum", (S{{5, 3}, {5, 3}}), maximum(in[0], in[1])),
      CASE("minimum", (S{{5, 3}, {3}}), minimum(in[0], in[1])),
      CASE("where", (S{{5, 3}, {5, 3}, {3}}), where(gt(in[0], mul(in[0], 0.0)), in[1], in[2])),
      CASE("matmul", (S{{5, 3}, {3, 7}}), matmul(in[0], in[1])),
      CASE("matmul_batched", (S{{2, 5, 3}, {3, 4}}), matmul(in[0], in[1]), -1, 1, false),
      CASE("matmul_vector", (S{{5, 3}, {3}}), matmul(in[0], in[1]), -1, 1, false),
      CASE("bmm", (S{{2, 5, 3}, {2, 3, 4}}), bmm(in[0], in[1])),
      CASE("linear", (S{{5, 3}, {7, 3}}), linear(in[0], in[1])),
      CASE("linear_bias", (S{{2, 5, 3}, {7, 3}, {7}}), linear(in[0], in[1], in[2])),
      CASE("einsum", (S{{5, 3}, {3, 7}}), einsum("ij,jk->ki", std::vector{in[0], in[1]})),
      CASE("einsum_summed_label", (S{{5, 3}, {5}}), einsum("ij,i->i", std::vector{in[0], in[1]})),
      CASE("sum_dims", (S{{5, 3, 2}}), sum(in[0], {1})),
      CASE("sum_keepdim", (S{{5, 3, 2}}), sum(in[0], {0, 2}, true)),
      CASE("mean", (S{{5, 3}}), mean(in[0], {0})),
      CASE("mean_all", (S{{5, 3}}), mean(in[0])),
      CASE("softmax", (S{{5, 3}}), softmax(in[0], 1)),
      CASE("log_softmax", (S{{5, 3}}), log_softmax(in[0], 0)),
      CASE("transpose", (S{{5, 3}}), transpose(in[0], 0, 1)),
      CASE("permute", (S{{5, 3, 2}}), permute(in[0], {2, 0, 1})),
      CASE("reshape", (S{{5, 3}}), reshape(in[0], {3, 5})),
      CASE("view", (S{{5, 3}}), view(in[0], {15})),
      CASE("flatten", (S{{5, 3, 2}}), flatten(in[0], 1, 2)),
      CASE("unflatten", (S{{5, 6}}), unflatten(in[0], 1, {2, 3})),
      CASE("squeeze", (S{{5, 1, 3}}), squeeze(in[0], 1)),
      CASE("unsqueeze", (S{{5, 3}}), unsqueeze(in[0], 1)),
      CASE("expand", (S{{5, 1}}), expand(in[0], {5, 3})),
      CASE("narrow", (S{{5, 3}}), narrow(in[0], 0, 1, 3)),
      CASE("split", (S{{5, 6}}), split_some(in[0])),
      CASE("cat", (S{{5, 3}, {2, 3}}), cat({in[0], in[1]}, 0)),
      CASE("stack", (S{{5, 3}, {5, 3}}), stack({in[0], in[1]}, 1)),
      CASE("to", (S{{5, 3}}), to(to(in[0], DType::Float32), DType::Float64), -1, 1, false),
      CASE("chain", (S{{5, 3}, {3, 4}}), softmax(tanh(matmul(in[0], in[1])), 1)),
  };
}

std::vector<Tensor> inputs_of(const Case& c, std::uint64_t seed) {
  std::vector<Tensor> in;
  for (std::size_t i = 0; i < c.shapes.size(); ++i) in.push_back(uniform(c.shapes[i], seed + 17 * i, c.lo, c.hi));
  return in;
}

// The loss's weights: fixed random, so every output element matters.
Tensor loss_weight(const Tensor& y, std::uint64_t seed) { return uniform(y.shape(), seed ^ 0x5eed, -1, 1); }

/// The gradients of sum(f(in) * w) by backward.
std::vector<Tensor> backward_grads(const Case& c, std::vector<Tensor> in, std::uint64_t seed) {
  for (auto& x : in) x.requires_grad_();
  Tensor y = c.on_tensor(in);
  Tensor w = loss_weight(y, seed);
  weighted_sum(y, w).backward();
  std::vector<Tensor> out;
  for (auto& x : in) out.push_back(x.grad() ? *x.grad() : Tensor::zeros(x.shape(), x.dtype()));
  return out;
}

BOOST_AUTO_TEST_SUITE(autograd)

BOOST_AUTO_TEST_CASE(finite_differences_agree_with_backward) {
  const std::uint64_t seed = testing::seeded(1234);
  int checked = 0;
  for (const Case& c : cases()) {
    const std::vector<Tensor> in = inputs_of(c, seed);
    const std::vector<Tensor> got = backward_grads(c, in, seed);
    NoGradGuard no_grad;
    const Tensor w = loss_weight(c.on_tensor(in), seed);
    auto loss = [&](const std::vector<Tensor>& xs) { return weighted_sum(c.on_tensor(xs), w).get({}); };
    for (std::size_t i = 0; i < in.size(); ++i) {
      const double eps = c.name == "to" ? 1e-2 : 1e-6;  // through f32: a step its rounding does not swamp
      double worst = 0;
      for (std::int64_t k = 0; k < in[i].numel(); ++k) {
        std::vector<Tensor> plus = in, minus = in;
        plus[i] = in[i].clone();
        minus[i] = in[i].clone();
        plus[i].data_as<double>()[k] += eps;
        minus[i].data_as<double>()[k] -= eps;
        const double numeric = (loss(plus) - loss(minus)) / (2 * eps);
        const double analytic = got[i].data_as<double>()[k];
        worst = testing::worse(worst, std::abs(numeric - analytic) / (1e-6 + std::abs(numeric)));
      }
      const double tol = c.name == "to" ? 1e-3 : 1e-5;
      BOOST_TEST(worst < tol,
                 "case " << c.name << " input " << i << " seed " << seed << ": worst relative error " << worst);
      ++checked;
    }
  }
  BOOST_TEST(checked > 50);
}

// Each case on DTensors in seeded random layouts (no Partial) agrees with
// the plain gradient once gathered.
BOOST_AUTO_TEST_CASE(dtensor_gradients_equal_the_unsharded_ones) {
  const std::vector<Shape> meshes = testing::backend_meshes({{4}, {2, 2}, {2, 3}});
  const std::uint64_t seed = testing::seeded(99);
  for (const Shape& mesh_shape : meshes) {
    std::vector<std::string> failures;
    std::mutex mu;
    const auto all = cases();
    testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
      DeviceMesh mesh(comm, mesh_shape);
      std::mt19937_64 rng(seed);
      for (const Case& c : all) {
        if (!c.sharded) continue;
        const std::vector<Tensor> in = inputs_of(c, seed);
        const std::vector<Tensor> expected = backward_grads(c, in, seed);
        std::vector<DTensor> din;
        std::vector<Layout> layouts;
        for (const Tensor& x : in) {
          layouts.push_back(testing::random_layout(rng, mesh.ndim(), x.dim(), ReduceOp::Sum, 0));
          din.push_back(distribute_tensor(x, mesh, layouts.back()));
          din.back().requires_grad_();
        }
        DTensor y = c.on_dtensor(din);
        Tensor w;
        {
          NoGradGuard no_grad;
          w = loss_weight(c.on_tensor(in), seed);
        }
        weighted_sum(y, distribute_tensor(w, mesh, Layout::replicated(mesh.ndim()))).backward();
        for (std::size_t i = 0; i < din.size(); ++i) {
          // No gradient reads as zeros, as in backward_grads (where's condition).
          Tensor got = din[i].grad() ? din[i].grad()->full_tensor() : Tensor::zeros(in[i].shape(), in[i].dtype());
          if (!allclose(got, expected[i], 1e-9, 1e-9)) {
            std::lock_guard lock(mu);
            failures.push_back(fmt::format("mesh {} case {} input {} layout {} seed {}: gradient {}",
                                           fmt::join(mesh_shape, "x"), c.name, i, layouts[i], seed,
                                           fmt::format("off by {}", max_abs_diff(got, expected[i]))));
          }
        }
      }
    });
    testing::check_no_failures(failures);
  }
}

// recompute(): the same gradients as the function recorded whole, on
// Tensors and on DTensors; the function runs once in the forward and once
// more in the backward, so its collectives run twice (FSDP's re-gather).
BOOST_AUTO_TEST_CASE(recompute_gives_the_same_gradients) {
  const Tensor w = uniform({4, 6}, 21), x = uniform({5, 6}, 22);
  auto block = [](const auto& in) { return tanh(linear(in[0], in[1])); };
  Tensor rw = w.detach().requires_grad_(), rx = x.detach().requires_grad_();
  sum(block(std::vector<Tensor>{rx, rw})).backward();
  Tensor cw = w.detach().requires_grad_(), cx = x.detach().requires_grad_();
  int calls = 0;
  const Tensor in[] = {cx, cw};
  sum(recompute(
          [&](std::span<const Tensor> v) {
            ++calls;
            return block(v);
          },
          in))
      .backward();
  BOOST_TEST(calls == 2);
  BOOST_TEST(allclose(*cw.grad(), *rw.grad(), 1e-12, 1e-12));
  BOOST_TEST(allclose(*cx.grad(), *rx.grad(), 1e-12, 1e-12));

  const Shape mesh_shape = testing::backend_meshes({{2}}).front();
  std::vector<std::string> failures;
  std::mutex mu;
  testing::run_ranks(static_cast<int>(mesh_shape[0]), [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape, {"dp"});
    // The weight sharded, gathered inside the function: one all_gather in
    // the forward, one again in the backward, and its gradient (Partial
    // over the batch's shards) reduce_scattered back to S(0).
    DTensor W = distribute_tensor(w, mesh, Layout::parse("S(0)"));
    W.requires_grad_();
    const DTensor X = distribute_tensor(x, mesh, Layout::parse("S(0)"));
    auto gathered_block = [](std::span<const DTensor> v) {
      return tanh(linear(v[0], v[1].redistribute(Layout::parse("R"))));
    };
    const DTensor inputs[] = {X, W};
    CommCounter forward(mesh);
    const DTensor loss = sum(recompute(gathered_block, inputs));
    const CommStats f = forward.counts();
    CommCounter backward(mesh);
    loss.backward();
    const CommStats b = backward.counts();
    std::string why;
    if (f.count(CollectiveKind::AllGather) != 1 || f.data_collectives() != 1) why += fmt::format(" forward {}", f);
    if (b.count(CollectiveKind::AllGather) != 1 || b.count(CollectiveKind::ReduceScatter) != 1 ||
        b.data_collectives() != 2)
      why += fmt::format(" backward {}", b);
    if (W.grad()->placements() != Layout::parse("S(0)")) why += fmt::format(" W.grad {}", W.grad()->placements());
    if (!allclose(W.grad()->full_tensor(), *rw.grad(), 1e-12, 1e-12)) why += " wrong values";
    if (!why.empty()) {
      std::lock_guard lock(mu);
      failures.push_back("recompute:" + why);
    }
  });
  testing::check_no_failures(failures);
}

// recompute_gathered(): two sharded weights gathered by one all_gather in
// the forward and one again in the backward, their gradients sent back by
// one reduce_scatter, equal to the unsharded gradients.
BOOST_AUTO_TEST_CASE(recompute_gathered_moves_a_unit_in_one_call_each_way) {
  const Tensor w1 = uniform({4, 6}, 31), w2 = uniform({3, 4}, 32), x = uniform({5, 6}, 33);
  Tensor r1 = w1.detach().requires_grad_(), r2 = w2.detach().requires_grad_();
  sum(tanh(linear(tanh(linear(x, r1)), r2))).backward();
  const Shape mesh_shape = testing::backend_meshes({{2}}).front();
  std::vector<std::string> failures;
  std::mutex mu;
  testing::run_ranks(static_cast<int>(mesh_shape[0]), [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape, {"dp"});
    DTensor W1 = distribute_tensor(w1, mesh, Layout::parse("S(0)")),
            W2 = distribute_tensor(w2, mesh, Layout::parse("S(0)"));
    W1.requires_grad_();
    W2.requires_grad_();
    const DTensor X = distribute_tensor(x, mesh, Layout::parse("S(0)"));
    auto f = [](std::span<const DTensor> in, std::span<const DTensor> w) {
      return tanh(linear(tanh(linear(in[0], w[0])), w[1]));
    };
    const DTensor inputs[] = {X}, params[] = {W1, W2};
    const Layout whole[] = {Layout::parse("R"), Layout::parse("R")};
    CommCounter forward(mesh);
    const DTensor loss = sum(recompute_gathered(f, inputs, params, whole));
    const CommStats fc = forward.counts();
    CommCounter backward(mesh);
    loss.backward();
    const CommStats bc = backward.counts();
    std::string why;
    if (fc.count(CollectiveKind::AllGather) != 1 || fc.data_collectives() != 1) why += fmt::format(" forward {}", fc);
    if (bc.count(CollectiveKind::AllGather) != 1 || bc.count(CollectiveKind::ReduceScatter) != 1 ||
        bc.data_collectives() != 2)
      why += fmt::format(" backward {}", bc);
    if (!allclose(W1.grad()->full_tensor(), *r1.grad(), 1e-12, 1e-12) ||
        !allclose(W2.grad()->full_tensor(), *r2.grad(), 1e-12, 1e-12))
      why += " wrong values";
    if (!why.empty()) {
      std::lock_guard lock(mu);
      failures.push_back("recompute_gathered:" + why);
    }
  });
  testing::check_no_failures(failures);
}

BOOST_AUTO_TEST_CASE(backward_ops_are_explained_as_backward) {
  if (!testing::can_run(4)) return;
  std::vector<std::string> lines;
  std::mutex mu;
  testing::run_ranks(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {4});
    DTensor x = distribute_tensor(uniform({6, 5}, 1), mesh, Layout::parse("S(0)"));
    DTensor w = distribute_tensor(uniform({3, 5}, 2), mesh, Layout::parse("R"));
    w.requires_grad_();
    DTensor loss = sum(linear(x, w));
    std::vector<std::string> mine;
    {
      ExplainScope scope([&](const std::string& line) { mine.push_back(line); });
      loss.backward();
    }
    // Under MPI this process runs one rank only: keep the lines of any rank
    // it ran (every rank explains the same decisions).
    std::lock_guard lock(mu);
    if (lines.empty()) lines = mine;
  });
  bool tagged = false;
  for (const auto& l : lines) tagged = tagged || l.find("[backward of linear] einsum") != std::string::npos;
  BOOST_TEST(tagged, fmt::format("{}", fmt::join(lines, "\n")));
}

// ---- Semantics and errors -----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(gradients_accumulate_and_zero_grad_empties_them) {
  Tensor x = uniform({4}, 1).requires_grad_();
  BOOST_TEST(!x.grad().has_value());
  sum(mul(x, 2.0)).backward();
  sum(mul(x, 3.0)).backward();
  BOOST_TEST(allclose(*x.grad(), Tensor::full({4}, 5.0, DType::Float64)));
  x.zero_grad();
  BOOST_TEST(!x.grad().has_value());
}

// on_gradient_ready: once per backward, after the leaf's last contribution
// (a leaf used three times gets its hook with the whole gradient), leaves in
// the order the backward completes them, a removed hook never runs, and
// only leaves take hooks.
BOOST_AUTO_TEST_CASE(gradient_ready_hooks_run_once_the_gradient_is_whole) {
  Tensor x = uniform({4}, 1).requires_grad_();
  Tensor w = uniform({4}, 2).requires_grad_();
  std::vector<std::string> order;
  std::vector<Tensor> seen;
  GradientReadyHook on_x = on_gradient_ready(x, [&] {
    order.push_back("x");
    seen.push_back(x.grad()->clone());
  });
  GradientReadyHook on_w = on_gradient_ready(w, [&] { order.push_back("w"); });
  // w meets x late in the forward, so the backward completes w first; x is
  // used three times.
  const Tensor h = add(mul(x, x), x);
  sum(mul(h, w)).backward();
  BOOST_TEST(order == (std::vector<std::string>{"w", "x"}));
  BOOST_REQUIRE(seen.size() == 1u);
  BOOST_TEST(allclose(seen[0], *x.grad(), 0, 0));  // the hook saw the final gradient
  Tensor expected = mul(add(mul(x.detach(), 2.0), 1.0), w.detach());
  BOOST_TEST(allclose(*x.grad(), expected, 1e-12, 1e-12));
  // A second backward: once more each; a removed hook is gone.
  on_w.remove();
  sum(mul(add(mul(x, x), x), w)).backward();
  BOOST_TEST(order == (std::vector<std::string>{"w", "x", "x"}));
  {
    GradientReadyHook scoped = on_gradient_ready(w, [&] { order.push_back("scoped"); });
  }
  sum(mul(x, w)).backward();
  BOOST_TEST(order.size() == 4u);
  // A backward that gives the leaf no gradient runs none of its hooks.
  Tensor unused = uniform({4}, 3).requires_grad_();
  int runs = 0;
  GradientReadyHook never = on_gradient_ready(unused, [&] { ++runs; });
  sum(mul(x, 2.0)).backward();
  BOOST_TEST(runs == 0);
  // A leaf as the root runs its hook too.
  Tensor root = Tensor::ones({}, DType::Float64).requires_grad_();
  GradientReadyHook on_root = on_gradient_ready(root, [&] { ++runs; });
  root.backward();
  BOOST_TEST(runs == 1);
  testing::check_throws<AutogradError>([&] { (void)on_gradient_ready(h, [] {}); }, "not a leaf");
  testing::check_throws<AutogradError>([&] { (void)on_gradient_ready(uniform({2}, 4), [] {}); },
                                       "requires_grad() is false");
}

// The same on DTensor parameters of a mesh: each rank's hook sees its
// parameter's whole gradient (Partial where the backward leaves it so).
BOOST_AUTO_TEST_CASE(gradient_ready_hooks_on_dtensors) {
  const std::vector<Shape> meshes = testing::backend_meshes({{2}, {2, 2}});
  for (const Shape& mesh_shape : meshes) {
    testing::FailureLog log;
    testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
      DeviceMesh mesh(comm, mesh_shape);
      DTensor weight = distribute_tensor(uniform({4, 4}, 5), mesh, Layout::replicated(mesh.ndim())).requires_grad_();
      DTensor x = distribute_tensor(uniform({8, 4}, 6), mesh, Layout::parse(mesh.ndim() == 1 ? "S(0)" : "S(0),R"));
      std::optional<DTensor> seen;
      int runs = 0;
      GradientReadyHook hook = on_gradient_ready(weight, [&] {
        ++runs;
        seen = *weight.grad();
      });
      sum(matmul(x, weight)).backward();
      if (runs != 1 || !seen || seen->placements() != weight.grad()->placements() ||
          !allclose(seen->full_tensor(), weight.grad()->full_tensor(), 0, 0))
        log.add(fmt::format("mesh {}: {} runs; the hook saw {}, the gradient is {}", fmt::join(mesh_shape, "x"), runs,
                            seen ? fmt::format("{}", seen->placements()) : "nothing",
                            weight.grad()->placements()));
    });
    testing::check_no_failures(log.failures);
  }
}

// on_next_read: the hook runs once, before the first op (or redistribute)
// that reads the leaf, on the reading thread, and not for a bare
// to_local(); a second hook replaces the first, an empty one clears it;
// only leaves that require a gradient take one.
BOOST_AUTO_TEST_CASE(next_read_hooks_run_once_before_a_read) {
  const Shape mesh_shape = testing::backend_meshes({{2}}).front();
  testing::FailureLog log;
  testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape);
    const Layout replicated = Layout::replicated(mesh.ndim());
    std::vector<Placement> split = replicated.placements();
    split[0] = Shard(0);
    const Layout rows(split);
    DTensor weight = distribute_tensor(uniform({4, 4}, 5), mesh, replicated).requires_grad_();
    const DTensor x = distribute_tensor(uniform({8, 4}, 6), mesh, rows);
    int runs = 0;
    // The hook writes the value the op must see (as ZeRO's gather does).
    on_next_read(weight, [&] {
      ++runs;
      Tensor local = weight.to_local();
      copy_into(Tensor::full({4, 4}, 2.0, DType::Float64), local);
    });
    (void)weight.to_local();
    const int after_to_local = runs;
    const DTensor y = matmul(x, weight);  // reads it: the hook first
    const Tensor twos = Tensor::full({4, 4}, 2.0, DType::Float64);
    const bool saw_written = allclose(y.full_tensor(), matmul(x.full_tensor(), twos), 1e-12, 1e-12);
    (void)matmul(x, weight);
    const int after_two_ops = runs;
    on_next_read(weight, [&] { runs += 10; });
    on_next_read(weight, [&] { runs += 100; });  // replaces
    (void)weight.redistribute(rows);
    const int after_redistribute = runs;
    on_next_read(weight, [&] { runs += 1000; });
    on_next_read(weight, {});  // clears
    (void)matmul(x, weight);
    if (after_to_local != 0 || !saw_written || after_two_ops != 1 || after_redistribute != 101 || runs != 101)
      log.add(fmt::format("rank {}: runs {} after to_local, saw the written value {}, {} after two ops, {} after "
                          "a redistribute, {} at the end (expected 0, true, 1, 101, 101)",
                          comm.rank(), after_to_local, saw_written, after_two_ops, after_redistribute, runs));
    for (const auto& [what, t, message] : {std::tuple{"a plain DTensor", &x, "requires_grad() is false"},
                                           std::tuple{"an op's output", &y, "an op made it"}})
      try {
        on_next_read(*t, [] {});
        log.add(fmt::format("rank {}: {} took a read hook", comm.rank(), what));
      } catch (const AutogradError& e) {
        if (std::string(e.what()).find(message) == std::string::npos)
          log.add(fmt::format("rank {}: {}: {}", comm.rank(), what, e.what()));
      }
  });
  testing::check_no_failures(log.failures);
}

// start_redistribute() on Megatron's tensor-parallel pair, each started
// and waited for around other work: the identity before a column-parallel
// linear (nothing moves forward; its gradient arrives Partial and is
// all_reduced) and the all_reduce of a row-parallel sum. Values and
// gradients are the unstarted path's (f64), and bit for bit those of
// started = false; every collective is counted in its pass, the same
// either way. Where each runs: the forward's all_reduce is counted at
// wait(), after the work recorded between; in the backward, the nodes
// recorded between start and wait run after the input gradient's
// all_reduce starts and before it is waited for (so they see it
// uncounted), and the nodes recorded before start run after it.
BOOST_AUTO_TEST_CASE(started_redistribute_runs_what_was_recorded_between_under_both_collectives) {
  const Tensor x = uniform({6, 4}, 41), w1 = uniform({8, 4}, 42), w2 = uniform({4, 8}, 43), z = uniform({6, 4}, 44);
  const Shape mesh_shape = testing::backend_meshes({{2}}).front();
  testing::FailureLog log;
  testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape, {"tp"});
    const Layout R = Layout::parse("R"), rows = Layout::parse("S(0)"), columns = Layout::parse("S(1)");
    struct Run {
      Tensor loss, dx, dw1, dw2, dz;
      CommStats forward, backward;
      std::uint64_t forward_between = 0, backward_between = 0, backward_before = 0;
    };
    // mode 0: unstarted (plain redistribute where a layout changes); 1:
    // started; 2: started = false.
    auto run = [&](int mode) {
      DTensor X = distribute_tensor(x, mesh, R).requires_grad_();
      DTensor W1 = distribute_tensor(w1, mesh, rows).requires_grad_();     // column-parallel
      DTensor W2 = distribute_tensor(w2, mesh, columns).requires_grad_();  // row-parallel
      DTensor Z = distribute_tensor(z, mesh, R).requires_grad_();
      Run out;
      std::optional<CommCounter> forward(std::in_place, mesh), backward;
      // Each note's backward reads the all_reduces the backward has counted
      // when it runs.
      auto note = [&](const DTensor& t, std::uint64_t* seen) {
        return record_custom("note", std::span(&t, 1), t.detach(), [seen, &backward](const DTensor& g) {
          *seen = backward->count(CollectiveKind::AllReduce);
          return std::vector<std::optional<DTensor>>{g};
        });
      };
      const DTensor input = note(X, &out.backward_before);
      std::optional<DTensor> y;
      if (mode == 0) {
        const DTensor other = mul(tanh(Z), 2.0);
        y = add(linear(tanh(linear(input, W1)), W2).redistribute(R), other);
      } else {
        StartedRedistribute identity = start_redistribute(input, R, mode == 1);
        const DTensor between = note(tanh(Z), &out.backward_between);
        const DTensor h = tanh(linear(identity.wait(), W1));
        StartedRedistribute reduce = start_redistribute(linear(h, W2), R, mode == 1);
        const DTensor other = mul(between, 2.0);
        out.forward_between = forward->count(CollectiveKind::AllReduce);
        y = add(reduce.wait(), other);
      }
      const DTensor loss = sum(mul(*y, *y));
      out.forward = forward->counts();
      backward.emplace(mesh);
      loss.backward();
      out.backward = backward->counts();
      out.loss = loss.full_tensor();
      out.dx = X.grad()->full_tensor();
      out.dw1 = W1.grad()->full_tensor();
      out.dw2 = W2.grad()->full_tensor();
      out.dz = Z.grad()->full_tensor();
      return out;
    };
    const Run plain = run(0), started = run(1), blocking = run(2);
    std::string why;
    for (const auto& [name, a, b] :
         {std::tuple{"loss", &plain.loss, &started.loss}, std::tuple{"dx", &plain.dx, &started.dx},
          std::tuple{"dw1", &plain.dw1, &started.dw1}, std::tuple{"dw2", &plain.dw2, &started.dw2},
          std::tuple{"dz", &plain.dz, &started.dz}})
      if (!allclose(*a, *b, 1e-12, 1e-12)) why += fmt::format(" {} differs from the unstarted path's;", name);
    for (const auto& [name, a, b] :
         {std::tuple{"loss", &started.loss, &blocking.loss}, std::tuple{"dx", &started.dx, &blocking.dx},
          std::tuple{"dw1", &started.dw1, &blocking.dw1}, std::tuple{"dw2", &started.dw2, &blocking.dw2},
          std::tuple{"dz", &started.dz, &blocking.dz}})
      if (!equal(*a, *b)) why += fmt::format(" {} of started differs from started = false's in bits;", name);
    for (const Run* r : {&started, &blocking}) {
      const char* which = r == &started ? "started" : "started = false";
      if (r->forward.count(CollectiveKind::AllReduce) != 1 || r->forward.data_collectives() != 1)
        why += fmt::format(" {}: forward {} (expected one all_reduce);", which, r->forward);
      if (r->backward.count(CollectiveKind::AllReduce) != 1 || r->backward.data_collectives() != 1)
        why += fmt::format(" {}: backward {} (expected one all_reduce);", which, r->backward);
      if (r->backward_before != 1)
        why += fmt::format(" {}: {} backward all_reduces counted before start's node ran (expected 1);", which,
                           r->backward_before);
    }
    if (started.forward_between != 0 || started.backward_between != 0)
      why += fmt::format(" started: {} all_reduces counted under the forward's work between, {} under the backward's "
                         "(expected 0 and 0: waited for after it);",
                         started.forward_between, started.backward_between);
    if (blocking.forward_between != 1 || blocking.backward_between != 1)
      why += fmt::format(" started = false: {} and {} all_reduces counted under the work between (expected 1 and 1);",
                         blocking.forward_between, blocking.backward_between);
    if (!why.empty()) log.add(fmt::format("rank {}:{}", comm.rank(), why));
  });
  log.report("start_redistribute");
}

BOOST_AUTO_TEST_CASE(no_grad_and_detach_stop_recording) {
  Tensor x = uniform({4}, 1).requires_grad_();
  BOOST_TEST(x.requires_grad());
  {
    NoGradGuard no_grad;
    BOOST_TEST(!exp(x).requires_grad());
  }
  BOOST_TEST(exp(x).requires_grad());
  BOOST_TEST(!exp(x.detach()).requires_grad());
  BOOST_TEST(!gt(x, x).requires_grad());  // not differentiable
}

BOOST_AUTO_TEST_CASE(retain_graph_allows_a_second_backward_and_a_freed_graph_says_so) {
  Tensor x = uniform({4}, 1).requires_grad_();
  Tensor loss = sum(exp(x));
  loss.backward(true);
  loss.backward();
  BOOST_TEST(allclose(*x.grad(), mul(exp(x.detach()), 2.0)));
  try {
    loss.backward();
    BOOST_FAIL("expected AutogradError");
  } catch (const AutogradError& e) {
    BOOST_TEST(std::string(e.what()).find("freed") != std::string::npos, e.what());
    BOOST_TEST(std::string(e.what()).find("'sum'") != std::string::npos, e.what());
  }
}

// A group node (split's) collects afresh for a second backward through a
// retained graph.
BOOST_AUTO_TEST_CASE(a_split_retained_gives_its_gradient_twice) {
  Tensor x = uniform({6}, 3).requires_grad_();
  const std::vector<Tensor> p = split(x, 0, std::vector<std::int64_t>{2, 3, 1});
  const Tensor loss = add(sum(p[0]), sum(mul(p[1], 2.0)));
  loss.backward(true);
  loss.backward();
  const double want[] = {2, 2, 4, 4, 4, 0};
  BOOST_TEST(equal(*x.grad(), Tensor::from_vector(std::vector<double>(want, want + 6), {6})));
}

BOOST_AUTO_TEST_CASE(errors_are_typed_and_name_the_value) {
  Tensor x = uniform({4, 3}, 1).requires_grad_();
  try {
    exp(x).backward();
    BOOST_FAIL("expected ValueError");
  } catch (const ValueError& e) {
    BOOST_TEST(std::string(e.what()).find("4x3") != std::string::npos, e.what());
  }
  Tensor i = Tensor::zeros({3}, DType::Int64);
  try {
    i.requires_grad_();
    BOOST_FAIL("expected DTypeError");
  } catch (const DTypeError& e) {
    BOOST_TEST(std::string(e.what()).find(fmt::format("{}", DType::Int64)) != std::string::npos, e.what());
  }
  // Through a not-differentiable op: the result does not require a gradient.
  Tensor through = sum(gt(x, mul(x, 0.0)));
  BOOST_CHECK_THROW(through.backward(), AutogradError);
  // Through an op without a rule (max's, taken away for the test): the
  // error names it, at backward only.
  const Op max_op = Op::find("max");
  const auto max_rule = backward_rule(max_op.def());
  set_backward(max_op, nullptr);
  Tensor m = sum(max(x, {1}));
  try {
    m.backward();
    BOOST_ERROR("expected AutogradError");
  } catch (const AutogradError& e) {
    BOOST_TEST(std::string(e.what()).find("'max'") != std::string::npos, e.what());
  }
  set_backward(max_op, max_rule);
  BOOST_CHECK_THROW(exp(x).backward(Tensor::ones({3, 4}, DType::Float64)), ShapeError);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace autograd_suite
