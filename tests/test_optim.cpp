// The optimizers and gradient utilities (nn/optim.h): SGD and AdamW against
// their formulas written out here, the same steps on DTensors in random
// layouts (gradients Partial or laid out otherwise) against plain tensors,
// clip_grad_norm's one all_reduce and its norm against the unsharded one,
// the schedule, and the errors.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <mutex>
#include <random>

#include <dtensor/nn/optim.h>

#include "support.h"

using namespace dtensor;

namespace optim_suite {

Tensor values(const Shape& shape, std::uint64_t seed) {
  Tensor t = Tensor::randn(shape, DType::Float64, seed);
  return t;
}

Tensor leaf(const Tensor& t) {
  Tensor x = t.clone();
  x.requires_grad_();
  return x;
}

double max_rel_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  const double* x = a.data_as<double>();
  const double* y = b.data_as<double>();
  for (std::int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(x[i] - y[i]) / std::max(1.0, std::abs(y[i])));
  return worst;
}

// A shape of 1 to max_dims dims, each of size 1 to max_size.
Shape random_shape(std::mt19937_64& rng, int max_dims, int max_size) {
  Shape shape(1 + rng() % static_cast<std::uint64_t>(max_dims));
  for (auto& s : shape) s = static_cast<std::int64_t>(1 + rng() % static_cast<std::uint64_t>(max_size));
  return shape;
}

// Runs body(mesh, case, log) for `cases` seeded cases on each of the suite's
// meshes (4, 2x2, 2x3; the job's own under MPI), then reports what the
// ranks logged.
template <class Body>
void on_every_mesh(std::size_t cases, Body&& body) {
  for (const Shape& mesh_shape : testing::backend_meshes({{4}, {2, 2}, {2, 3}})) {
    testing::FailureLog log;
    testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
      DeviceMesh mesh(comm, mesh_shape);
      for (std::size_t c = 0; c < cases; ++c) body(mesh, c, log);
    });
    testing::check_no_failures(log.failures);
  }
}

BOOST_AUTO_TEST_SUITE(optimizers)

// One element, two steps, each formula written out (torch.optim's docs).
BOOST_AUTO_TEST_CASE(sgd_and_adamw_follow_their_formulas) {
  const double p0 = 0.5, g1 = 0.25, g2 = -1.5;
  {
    Tensor p = leaf(Tensor::full({1}, p0, DType::Float64));
    nn::SGD<Tensor> opt({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.2, .weight_decay = 0.01});
    p.set_grad(Tensor::full({1}, g1, DType::Float64));
    opt.step();
    double d = g1 + 0.01 * p0, buf = d, want = p0 - 0.1 * buf;  // first step: buf = d
    BOOST_TEST(p.get({0}) == want, boost::test_tools::tolerance(1e-15));
    p.set_grad(Tensor::full({1}, g2, DType::Float64));
    opt.step();
    d = g2 + 0.01 * want;
    buf = 0.9 * buf + 0.8 * d;
    want -= 0.1 * buf;
    BOOST_TEST(p.get({0}) == want, boost::test_tools::tolerance(1e-15));
    BOOST_TEST(opt.momentum_buffer(0)->get({0}) == buf, boost::test_tools::tolerance(1e-15));
  }
  {
    Tensor p = leaf(Tensor::full({1}, p0, DType::Float64));
    nn::SGD<Tensor> opt({p}, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
    p.set_grad(Tensor::full({1}, g1, DType::Float64));
    opt.step();
    BOOST_TEST(p.get({0}) == p0 - 0.1 * (g1 + 0.9 * g1), boost::test_tools::tolerance(1e-15));
  }
  {
    Tensor p = leaf(Tensor::full({1}, p0, DType::Float64));
    const nn::AdamWOptions o{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
    nn::AdamW<Tensor> opt({p}, o);
    double want = p0, m = 0, v = 0;
    int t = 0;
    for (double g : {g1, g2}) {
      p.set_grad(Tensor::full({1}, g, DType::Float64));
      opt.step();
      ++t;
      want *= 1 - o.lr * o.weight_decay;
      m = o.beta1 * m + (1 - o.beta1) * g;
      v = o.beta2 * v + (1 - o.beta2) * g * g;
      const double m_hat = m / (1 - std::pow(o.beta1, t)), v_hat = v / (1 - std::pow(o.beta2, t));
      want -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
      BOOST_TEST_CONTEXT("AdamW step " << t) {
        BOOST_TEST(p.get({0}) == want, boost::test_tools::tolerance(1e-13));
        BOOST_TEST(opt.exp_avg(0)->get({0}) == m, boost::test_tools::tolerance(1e-15));
        BOOST_TEST(opt.exp_avg_sq(0)->get({0}) == v, boost::test_tools::tolerance(1e-15));
      }
    }
    BOOST_TEST(opt.steps() == 2);
  }
}

// A parameter without a gradient is left alone (and gets no state).
BOOST_AUTO_TEST_CASE(a_parameter_without_a_gradient_is_skipped) {
  Tensor a = leaf(values({3}, 1)), b = leaf(values({2}, 2));
  const Tensor b0 = b.clone();
  nn::AdamW<Tensor> opt({a, b});
  a.set_grad(values({3}, 3));
  opt.step();
  BOOST_TEST(equal(b, b0));
  BOOST_TEST(!opt.exp_avg(1).has_value());
  BOOST_TEST(opt.exp_avg(0).has_value());
}

struct Spec {
  Shape shape;
  Layout param_layout, grad_layout;
};

// Three steps of SGD (momentum, maybe nesterov, weight decay) and of AdamW on
// DTensors: parameters in random layouts, gradients given in other random
// layouts (Partial(sum) included), against the same optimizer on the full
// tensors. The states are compared too, and each state keeps its
// parameter's layout.
BOOST_AUTO_TEST_CASE(dtensor_steps_equal_the_unsharded_steps) {
  const std::uint64_t seed = 20261202;
  on_every_mesh(testing::scaled_cases(12, 3), [&](const DeviceMesh& mesh, std::size_t c, testing::FailureLog& log) {
    const Shape& mesh_shape = mesh.shape();
    std::mt19937_64 rng(seed + c);
    std::vector<Spec> specs;
    for (int i = 0; i < 3; ++i) {
      const Shape shape = random_shape(rng, 3, 7);
      specs.push_back({shape,
                       testing::random_layout(rng, mesh.ndim(), static_cast<int>(shape.size()), ReduceOp::Sum, 0),
                       testing::random_layout(rng, mesh.ndim(), static_cast<int>(shape.size()), ReduceOp::Sum, 3)});
    }
    const bool adam = c % 2 == 1;
    const bool nesterov = rng() % 2 == 0;
    std::vector<Tensor> full;
    std::vector<DTensor> sharded;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      full.push_back(leaf(values(specs[i].shape, seed + 100 * c + i)));
      sharded.push_back(distribute_tensor(full[i].detach(), mesh, specs[i].param_layout));
      sharded.back().requires_grad_();
    }
    const nn::SGDOptions so{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov};
    const nn::AdamWOptions ao{.lr = 0.01, .weight_decay = 0.05};
    nn::SGD<Tensor> sgd_full(full, so);
    nn::SGD<DTensor> sgd_sharded(sharded, so);
    nn::AdamW<Tensor> adam_full(full, ao);
    nn::AdamW<DTensor> adam_sharded(sharded, ao);
    for (int step = 0; step < 3; ++step) {
      for (std::size_t i = 0; i < specs.size(); ++i) {
        const Tensor g = values(specs[i].shape, seed + 1000 * (step + 1) + 100 * c + i);
        full[i].set_grad(g);
        sharded[i].set_grad(distribute_tensor(g, mesh, specs[i].grad_layout));
      }
      if (adam) {
        adam_full.step();
        adam_sharded.step();
      } else {
        sgd_full.step();
        sgd_sharded.step();
      }
    }
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const std::string where =
          fmt::format("seed {} case {} ({}) mesh {} param {} shape {} layout {} grads {}", seed, c,
                      adam ? "AdamW" : (nesterov ? "SGD nesterov" : "SGD"), fmt::join(mesh_shape, "x"), i,
                      fmt::join(specs[i].shape, "x"), specs[i].param_layout, specs[i].grad_layout);
      const double off = max_rel_diff(sharded[i].full_tensor(), full[i]);
      if (!(off <= 1e-12)) log.add(fmt::format("{}: parameter off by {}", where, off));
      const std::optional<DTensor>& state = adam ? adam_sharded.exp_avg_sq(i) : sgd_sharded.momentum_buffer(i);
      const std::optional<Tensor>& want = adam ? adam_full.exp_avg_sq(i) : sgd_full.momentum_buffer(i);
      if (!state || !want || state->placements() != sharded[i].placements())
        log.add(fmt::format("{}: the state is missing or not in the parameter's layout", where));
      else if (const double d = max_rel_diff(state->full_tensor(), *want); !(d <= 1e-12))
        log.add(fmt::format("{}: state off by {}", where, d));
    }
  });
}

BOOST_AUTO_TEST_CASE(bad_options_and_parameters_are_typed_errors) {
  Tensor p = leaf(values({2}, 1));
  BOOST_CHECK_THROW(nn::SGD<Tensor>({p}, {.lr = -1}), ValueError);
  BOOST_CHECK_THROW(nn::SGD<Tensor>({p}, {.momentum = 0, .nesterov = true}), ValueError);
  BOOST_CHECK_THROW(nn::AdamW<Tensor>({p}, {.beta1 = 1.0}), ValueError);
  BOOST_CHECK_THROW(nn::AdamW<Tensor>({p}, {.eps = std::numeric_limits<double>::quiet_NaN()}), ValueError);
  BOOST_CHECK_THROW(nn::SGD<Tensor>({values({2}, 2)}), AutogradError);  // does not require a gradient
  nn::SGD<Tensor> opt({p});
  BOOST_CHECK_THROW(opt.set_lr(std::numeric_limits<double>::infinity()), ValueError);
  // set_grad: shape, dtype, non-leaf.
  BOOST_CHECK_THROW(p.set_grad(values({3}, 3)), ShapeError);
  BOOST_CHECK_THROW(p.set_grad(values({2}, 3).to(DType::Float32)), DTypeError);
  const Tensor made = p * 2.0;
  BOOST_CHECK_THROW(Tensor(made).set_grad(values({2}, 3)), AutogradError);
  try {
    p.set_grad(values({3}, 3));
  } catch (const ShapeError& e) {
    BOOST_TEST(std::string(e.what()).find("shape 3 for a tensor of shape 2") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(gradient_clipping)

// On random layouts (parameters and their gradients in one layout, Replicate
// mesh dims among them) the norm is the unsharded one, it takes exactly one
// collective (an all_reduce), and the clipped gradients are the unsharded
// ones scaled; for the 2-norm, the inf-norm and a 3-norm.
BOOST_AUTO_TEST_CASE(one_all_reduce_gives_the_unsharded_norm) {
  const std::uint64_t seed = 777;
  on_every_mesh(testing::scaled_cases(9, 3), [&](const DeviceMesh& mesh, std::size_t c, testing::FailureLog& log) {
    const Shape& mesh_shape = mesh.shape();
    std::mt19937_64 rng(seed + c);
    const double norm_type = std::array{2.0, std::numeric_limits<double>::infinity(), 3.0}[c % 3];
    std::vector<Tensor> full_params, grads;
    std::vector<DTensor> params;
    std::vector<Layout> layouts;
    double want_part = 0;
    for (int i = 0; i < 4; ++i) {
      const Shape shape = random_shape(rng, 2, 6);
      layouts.push_back(testing::random_layout(rng, mesh.ndim(), static_cast<int>(shape.size()), ReduceOp::Sum, 0));
      full_params.push_back(leaf(values(shape, seed + 10 * c + i)));
      grads.push_back(values(shape, seed + 10 * c + i + 5));
      full_params.back().set_grad(grads.back());
      params.push_back(distribute_tensor(full_params.back().detach(), mesh, layouts.back()));
      params.back().requires_grad_();
      params.back().set_grad(distribute_tensor(grads.back(), mesh, layouts.back()));
      const double* g = grads.back().data_as<double>();
      for (std::int64_t k = 0; k < grads.back().numel(); ++k)
        want_part = std::isinf(norm_type) ? std::max(want_part, std::abs(g[k]))
                                          : want_part + std::pow(std::abs(g[k]), norm_type);
    }
    const double want = std::isinf(norm_type) ? want_part : std::pow(want_part, 1 / norm_type);
    const double max_norm = want / 2;
    const CommCounter counter(mesh);
    const double got = nn::clip_grad_norm<DTensor>(params, max_norm, norm_type);
    const CommStats used = counter.counts();
    const double plain = nn::clip_grad_norm<Tensor>(full_params, max_norm, norm_type);
    const std::string where = fmt::format("seed {} case {} mesh {} norm_type {} layouts {}", seed, c,
                                          fmt::join(mesh_shape, "x"), norm_type, fmt::join(layouts, " "));
    if (std::abs(got - want) > 1e-12 * want || std::abs(plain - want) > 1e-12 * want)
      log.add(fmt::format("{}: norm {} (plain {}), expected {}", where, got, plain, want));
    if (used.count(CollectiveKind::AllReduce) != 1 || used.data_collectives() != 1)
      log.add(fmt::format("{}: {} collectives, {} all_reduce; expected exactly one all_reduce", where,
                          used.data_collectives(), used.count(CollectiveKind::AllReduce)));
    const double coef = max_norm / (want + 1e-6);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Tensor scaled = grads[i] * coef;
      if (max_rel_diff(params[i].grad()->full_tensor(), scaled) > 1e-12 ||
          max_rel_diff(*full_params[i].grad(), scaled) > 1e-12)
        log.add(fmt::format("{}: gradient {} not scaled by {}", where, i, coef));
    }
  });
}

// A gradient still Partial is reduced first: the norm is still right, and
// the gradient is replaced by its clipped value in the parameter's layout.
BOOST_AUTO_TEST_CASE(partial_gradients_are_reduced_first) {
  const Shape mesh_shape = testing::backend_meshes({{4}}).front();
  testing::FailureLog log;
  const Tensor g = values({5, 3}, 11);
  double want = 0;
  for (std::int64_t k = 0; k < g.numel(); ++k) want += g.data_as<double>()[k] * g.data_as<double>()[k];
  want = std::sqrt(want);
  testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape);
    const Layout param_layout = Layout::parse(mesh.ndim() == 1 ? "S(0)" : "S(0),R");
    DTensor p = distribute_tensor(values({5, 3}, 12), mesh, param_layout);
    p.requires_grad_();
    p.set_grad(distribute_tensor(g, mesh, Layout::replicated(mesh.ndim()).with(0, Partial{})));
    const double got = nn::clip_grad_norm<DTensor>(std::span<const DTensor>(&p, 1), 1.0);
    if (std::abs(got - want) > 1e-12 * want) log.add(fmt::format("norm {}, expected {}", got, want));
    if (p.grad()->placements() != param_layout)
      log.add(fmt::format("gradient left in {}, expected {}", p.grad()->placements(), param_layout));
    if (max_rel_diff(p.grad()->full_tensor(), g * (1.0 / (want + 1e-6))) > 1e-12) log.add("gradient not clipped");
  });
  testing::check_no_failures(log.failures);
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_value_errors) {
  Tensor p = leaf(values({2}, 1));
  p.set_grad(values({2}, 2));
  const std::vector<Tensor> ps{p};
  BOOST_CHECK_THROW(nn::clip_grad_norm<Tensor>(ps, -1.0), ValueError);
  BOOST_CHECK_THROW(nn::clip_grad_norm<Tensor>(ps, 1.0, 0.0), ValueError);
  // Below max_norm nothing changes (the same gradient).
  const Tensor before = *p.grad();
  BOOST_TEST(nn::clip_grad_norm<Tensor>(ps, 1e9) > 0);
  BOOST_TEST(equal(*p.grad(), before));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(schedule)

BOOST_AUTO_TEST_CASE(warmup_then_cosine) {
  // Warmup over 10 steps to 1.0, cosine to 0.1 at step 110.
  BOOST_TEST(nn::warmup_cosine_lr(0, 10, 110, 1.0, 0.1) == 0.1, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(nn::warmup_cosine_lr(9, 10, 110, 1.0, 0.1) == 1.0, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(nn::warmup_cosine_lr(10, 10, 110, 1.0, 0.1) == 1.0, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(nn::warmup_cosine_lr(60, 10, 110, 1.0, 0.1) == 0.55, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(nn::warmup_cosine_lr(110, 10, 110, 1.0, 0.1) == 0.1, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(nn::warmup_cosine_lr(500, 10, 110, 1.0, 0.1) == 0.1, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(nn::warmup_cosine_lr(5, 0, 10, 2.0) == 1.0, boost::test_tools::tolerance(1e-15));
  BOOST_CHECK_THROW(nn::warmup_cosine_lr(0, 20, 10, 1.0), ValueError);
  BOOST_CHECK_THROW(nn::warmup_cosine_lr(-1, 0, 10, 1.0), ValueError);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace optim_suite
