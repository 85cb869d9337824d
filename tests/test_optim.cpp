// The optimizers and gradient utilities (nn/optim.h): SGD and AdamW against
// their formulas written out here, the same steps on DTensors in random
// layouts (gradients Partial or laid out otherwise) against plain tensors,
// clip_grad_norm's one all_reduce and its norm against the unsharded one,
// the coalesced gradient moves of DDP and ZeRO-1 steps (their collective
// counts, values and state layouts), the schedule, and the errors.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <mutex>
#include <random>

#include <dtensor/nn/optim.h>
#include <dtensor/nn/overlap.h>

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

// The largest relative difference of two f64 tensors: NaN if any element is
// NaN, infinity if their shapes differ, so a comparison with a tolerance
// (testing::within) fails on either.
double max_rel_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  const double* x = a.data_as<double>();
  const double* y = b.data_as<double>();
  for (std::int64_t i = 0; i < a.numel(); ++i)
    worst = testing::worse(worst, std::abs(x[i] - y[i]) / std::max(1.0, std::abs(y[i])));
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

// state_dict / load_state_dict: a second optimizer given the first's state
// after 2 steps takes the same third step; a missing entry or a moment of
// the wrong shape is refused before anything changes.
BOOST_AUTO_TEST_CASE(adamw_state_round_trips) {
  const nn::AdamWOptions o{.lr = 0.01, .weight_decay = 0.1};
  Tensor a = leaf(Tensor::full({3}, 0.5, DType::Float64)), b = leaf(Tensor::full({2, 2}, -1.0, DType::Float64));
  nn::AdamW<Tensor> first({a, b}, o);
  auto step = [](nn::AdamW<Tensor>& opt, Tensor& x, Tensor& y, double g) {
    x.set_grad(Tensor::full({3}, g, DType::Float64));
    y.set_grad(Tensor::full({2, 2}, -g, DType::Float64));
    opt.step();
  };
  step(first, a, b, 0.25);
  step(first, a, b, -1.5);
  const std::vector<std::string> names{"a", "b"};
  const auto state = first.state_dict(names);
  BOOST_TEST(state.size() == 4u);
  Tensor a2 = leaf(a.detach().clone()), b2 = leaf(b.detach().clone());
  nn::AdamW<Tensor> second({a2, b2}, o);
  auto missing = state;
  missing.erase("exp_avg_sq.b");
  BOOST_CHECK_THROW(second.load_state_dict(missing, names, 2), ValueError);
  auto wrong = state;
  wrong["exp_avg.b"] = Tensor::zeros({4}, DType::Float64);
  BOOST_CHECK_THROW(second.load_state_dict(wrong, names, 2), ShapeError);
  BOOST_TEST(!second.exp_avg(0).has_value());  // nothing was changed
  second.load_state_dict(state, names, 2);
  BOOST_TEST(second.updates(1) == 2);
  step(first, a, b, 0.75);
  step(second, a2, b2, 0.75);
  BOOST_TEST(equal(a.detach(), a2.detach()));
  BOOST_TEST(equal(b.detach(), b2.detach()));
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
  const std::uint64_t seed = testing::seeded(20261202);
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
  const std::uint64_t seed = testing::seeded(777);
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
    if (!testing::close(got, want, 1e-12 * want) || !testing::close(plain, want, 1e-12 * want))
      log.add(fmt::format("{}: norm {} (plain {}), expected {}", where, got, plain, want));
    if (used.count(CollectiveKind::AllReduce) != 1 || used.data_collectives() != 1)
      log.add(fmt::format("{}: {} collectives, {} all_reduce; expected exactly one all_reduce", where,
                          used.data_collectives(), used.count(CollectiveKind::AllReduce)));
    const double coef = max_norm / (want + 1e-6);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Tensor scaled = grads[i] * coef;
      if (!testing::within(max_rel_diff(params[i].grad()->full_tensor(), scaled), 1e-12) ||
          !testing::within(max_rel_diff(*full_params[i].grad(), scaled), 1e-12))
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
    if (!testing::close(got, want, 1e-12 * want)) log.add(fmt::format("norm {}, expected {}", got, want));
    if (p.grad()->placements() != param_layout)
      log.add(fmt::format("gradient left in {}, expected {}", p.grad()->placements(), param_layout));
    if (!testing::within(max_rel_diff(p.grad()->full_tensor(), g * (1.0 / (want + 1e-6))), 1e-12))
      log.add("gradient not clipped");
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

BOOST_AUTO_TEST_SUITE(coalesced_steps_and_zero)

// A data-parallel model on the suite's meshes: parameters Replicate over dp
// (mesh dim 0) and, on 2-D meshes, Replicate or sharded over the other dim;
// gradients P(sum) over dp with integer values, so every reduction order
// gives the same f64 sums and DTensor steps equal plain ones bit for bit.
struct Model {
  std::vector<Tensor> full;
  std::vector<DTensor> sharded;
  std::vector<Shape> shapes;
};

Layout dp_param_layout(const DeviceMesh& mesh, std::size_t i) {
  if (mesh.ndim() == 1) return Layout::parse("R");
  return std::array{Layout::parse("R,R"), Layout::parse("R,S(0)"), Layout::parse("R,S(1)")}[i % 3];
}

Model dp_model(const DeviceMesh& mesh, std::mt19937_64& rng, std::size_t count, std::uint64_t seed) {
  Model m;
  for (std::size_t i = 0; i < count; ++i) {
    Shape shape = random_shape(rng, 3, 9);
    if (shape.size() < 2) shape.push_back(1 + static_cast<std::int64_t>(rng() % 5));  // S(1) needs a dim 1
    m.shapes.push_back(shape);
    m.full.push_back(leaf(values(shape, seed + i)));
    m.sharded.push_back(distribute_tensor(m.full.back().detach(), mesh, dp_param_layout(mesh, i)));
    m.sharded.back().requires_grad_();
  }
  return m;
}

// Integer gradients: the plain model gets the sum, the DTensor model its
// P(sum)-over-dp addends in the parameter's layout elsewhere.
void set_gradients(Model& m, const DeviceMesh& mesh, std::uint64_t seed) {
  for (std::size_t i = 0; i < m.full.size(); ++i) {
    const Tensor g = testing::integer_tensor(m.shapes[i], DType::Float64, seed + i);
    m.full[i].set_grad(g);
    const Layout grad_layout = dp_param_layout(mesh, i).with(0, Partial{});
    m.sharded[i].set_grad(DTensor::from_local(
        testing::source_shard(g, mesh.shape(), grad_layout, mesh.coordinate(), seed + 7), mesh, grad_layout,
        m.shapes[i], FromLocalCheck::Trust));
  }
}

// Three steps of SGD (momentum, maybe nesterov) or AdamW, DDP-style (states
// in the parameters' layouts) or ZeRO-1 (states S(0) over dp): every step is
// exactly one all_reduce (DDP), or one reduce_scatter and one all_gather
// (ZeRO), for 6 parameters in one bucket; the parameters and states equal the
// plain optimizer's bit for bit; ZeRO's states live in the state layouts
// with the local sizes those give.
BOOST_AUTO_TEST_CASE(ddp_and_zero1_steps_take_one_collective_each_way) {
  const std::uint64_t seed = testing::seeded(20261204);
  on_every_mesh(testing::scaled_cases(8, 4), [&](const DeviceMesh& mesh, std::size_t c, testing::FailureLog& log) {
    std::mt19937_64 rng(seed + c);
    const bool adam = c % 2 == 1, zero = c % 4 >= 2;
    Model m = dp_model(mesh, rng, 6, seed + 100 * c);
    const nn::ShardingOptions sharding{.state_layouts = zero ? nn::zero_state_layouts(m.sharded, 0)
                                                             : std::vector<Layout>{}};
    const nn::SGDOptions so{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = rng() % 2 == 0};
    const nn::AdamWOptions ao{.lr = 0.01, .weight_decay = 0.05};
    nn::SGDOptions sharded_so = so;
    nn::AdamWOptions sharded_ao = ao;
    sharded_so.sharding = sharded_ao.sharding = sharding;
    nn::SGD<Tensor> sgd_full(m.full, so);
    nn::SGD<DTensor> sgd_sharded(m.sharded, sharded_so);
    nn::AdamW<Tensor> adam_full(m.full, ao);
    nn::AdamW<DTensor> adam_sharded(m.sharded, sharded_ao);
    const std::string where = fmt::format("seed {} case {} ({}, {}) mesh {}", seed, c, adam ? "AdamW" : "SGD",
                                          zero ? "ZeRO-1" : "DDP", fmt::join(mesh.shape(), "x"));
    for (int step = 0; step < 3; ++step) {
      set_gradients(m, mesh, seed + 1000 * (step + 1) + 10 * c);
      const CommCounter counter(mesh);
      adam ? adam_sharded.step() : sgd_sharded.step();
      const CommStats used = counter.counts();
      adam ? adam_full.step() : sgd_full.step();
      const bool ok = zero ? used.count(CollectiveKind::ReduceScatter) == 1 &&
                                 used.count(CollectiveKind::AllGather) == 1 && used.data_collectives() == 2
                           : used.count(CollectiveKind::AllReduce) == 1 && used.data_collectives() == 1;
      if (!ok) log.add(fmt::format("{} step {}: {}", where, step, used));
    }
    for (std::size_t i = 0; i < m.full.size(); ++i) {
      const std::string what = fmt::format("{} param {} shape {} layout {}", where, i, fmt::join(m.shapes[i], "x"),
                                           m.sharded[i].placements());
      if (!equal(m.sharded[i].full_tensor(), m.full[i])) log.add(fmt::format("{}: parameter differs", what));
      const std::optional<DTensor>& state = adam ? adam_sharded.exp_avg(i) : sgd_sharded.momentum_buffer(i);
      const std::optional<Tensor>& want = adam ? adam_full.exp_avg(i) : sgd_full.momentum_buffer(i);
      const Layout& layout = zero ? sharding.state_layouts[i] : m.sharded[i].placements();
      const Shape local = local_box(mesh.shape(), m.shapes[i], layout, mesh.coordinate()).size;
      if (!state || state->placements() != layout || state->to_local().shape() != local ||
          (adam ? adam_sharded : static_cast<const nn::Optimizer<DTensor>&>(sgd_sharded)).state_layout(i) != layout)
        log.add(fmt::format("{}: state missing or not in {} (local {})", what, layout, fmt::join(local, "x")));
      else if (!equal(state->full_tensor(), *want))
        log.add(fmt::format("{}: state differs", what));
    }
  });
}

// A bucket smaller than every gradient sends each alone: one all_reduce per
// parameter; clip_grad_norm reduces its Partial gradients in one all_reduce
// (and then one for the norm).
BOOST_AUTO_TEST_CASE(bucket_size_sets_the_number_of_calls) {
  on_every_mesh(1, [&](const DeviceMesh& mesh, std::size_t, testing::FailureLog& log) {
    std::mt19937_64 rng(5);
    Model m = dp_model(mesh, rng, 4, 50);
    nn::SGD<DTensor> opt(m.sharded, {.lr = 0.1, .sharding = {.buckets = {.bucket_mib = 1e-9}}});
    set_gradients(m, mesh, 60);
    const CommCounter counter(mesh);
    opt.step();
    if (counter.count(CollectiveKind::AllReduce) != 4)
      log.add(fmt::format("mesh {}: {}; expected 4 all_reduce", fmt::join(mesh.shape(), "x"), counter.counts()));
    set_gradients(m, mesh, 70);
    const CommCounter clip(mesh);
    nn::clip_grad_norm<DTensor>(m.sharded, 1.0);
    if (clip.count(CollectiveKind::AllReduce) != 2 || clip.counts().data_collectives() != 2)
      log.add(fmt::format("mesh {} clip: {}; expected 2 all_reduce", fmt::join(mesh.shape(), "x"), clip.counts()));
  });
}

// DDP with its gradient all_reduces started during the backward: the same
// parameters bit for bit as the blocking path after every step (f32 and
// f64, one bucket and one per gradient), the same collectives with the same
// bytes, no bucket started in the first step (it learns them) and every
// bucket started inside the backward from the second; with two
// micro-batches, only the last backward starts them.
BOOST_AUTO_TEST_CASE(overlapped_ddp_equals_the_blocking_path) {
  const std::uint64_t seed = testing::seeded(20261207);
  for (const Shape& mesh_shape : testing::backend_meshes({{2}, {4}, {3}})) {
    testing::FailureLog log;
    testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
      DeviceMesh mesh(comm, mesh_shape);
      for (int c = 0; c < 4; ++c) {
        const DType dtype = c % 2 == 0 ? DType::Float32 : DType::Float64;
        const double bucket_mib = c < 2 ? 25.0 : 1e-9;
        const int micro_batches = c == 3 ? 2 : 1;
        const Shape shapes[] = {{6, 5}, {5}, {5, 3}, {3}};
        std::vector<DTensor> params[2];
        for (int run = 0; run < 2; ++run)
          for (std::size_t i = 0; i < 4; ++i) {
            params[run].push_back(distribute_tensor(values(shapes[i], seed + 7 * i).to(dtype), mesh,
                                                    Layout::replicated(mesh.ndim())));
            params[run].back().requires_grad_();
          }
        auto loss_of = [&](const std::vector<DTensor>& p, int step, int micro) {
          const DTensor x = distribute_tensor(values({12, 6}, seed + 100 * step + micro).to(dtype), mesh,
                                              Layout::parse("S(0)"));
          const DTensor h = tanh(add(matmul(x, p[0]), p[1]));
          const DTensor y = add(matmul(h, p[2]), p[3]);
          return sum(mul(y, y));
        };
        nn::OverlappedGradientReduction overlap(params[0], {}, {.bucket_mib = bucket_mib});
        const nn::SGDOptions sgd{.lr = 0.05, .momentum = 0.9, .sharding = {.buckets = {.bucket_mib = bucket_mib}}};
        nn::SGD<DTensor> overlapped(params[0], sgd);
        nn::SGD<DTensor> blocking(params[1], sgd);
        const std::string where =
            fmt::format("mesh {} case {} ({}, bucket_mib {}, {} micro-batches)", fmt::join(mesh_shape, "x"), c, dtype,
                        bucket_mib, micro_batches);
        for (int step = 0; step < 3; ++step) {
          const CommCounter with(mesh);
          std::size_t started_in_backward = 0;
          for (int micro = 0; micro < micro_batches; ++micro) {
            overlap.set_enabled(micro == micro_batches - 1);
            loss_of(params[0], step, micro).backward();
            started_in_backward = overlap.started_last_step();  // before finish() waits for any
            if (micro < micro_batches - 1 && started_in_backward != 0)
              log.add(fmt::format("{} step {}: a bucket started in a micro-batch with no_sync", where, step));
          }
          overlap.finish();
          overlapped.step();
          overlapped.zero_grad();
          const CommStats used = with.counts();
          const CommCounter without(mesh);
          for (int micro = 0; micro < micro_batches; ++micro) loss_of(params[1], step, micro).backward();
          blocking.step();
          blocking.zero_grad();
          const CommStats want = without.counts();
          if (used.calls != want.calls || used.bytes_by_kind != want.bytes_by_kind)
            log.add(fmt::format("{} step {}: overlapped {}, blocking {}", where, step, used, want));
          const std::size_t buckets = bucket_mib > 1 ? 1 : 4;
          if (started_in_backward != (step == 0 ? 0 : buckets))
            log.add(fmt::format("{} step {}: {} buckets started in the backward", where, step, started_in_backward));
          for (std::size_t i = 0; i < 4; ++i)
            if (!equal(params[0][i].to_local(), params[1][i].to_local()))
              log.add(fmt::format("{} step {}: parameter {} differs from the blocking path's", where, step, i));
        }
      }
    });
    testing::check_no_failures(log.failures);
  }
}

BOOST_AUTO_TEST_CASE(bad_sharding_options_are_typed_errors) {
  const Shape mesh_shape = testing::backend_meshes({{4}}).front();
  testing::FailureLog log;
  testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
    DeviceMesh mesh(comm, mesh_shape);
    const Layout rows = Layout::replicated(mesh.ndim()).with(0, Shard{0});
    DTensor p = distribute_tensor(values({6, 2}, 1), mesh, rows);
    p.requires_grad_();
    auto expect = [&](auto&& make, const std::string& needle, const char* what) {
      try {
        make();
        log.add(fmt::format("{}: no error", what));
      } catch (const ValueError& e) {
        if (std::string(e.what()).find(needle) == std::string::npos)
          log.add(fmt::format("{}: '{}' lacks '{}'", what, e.what(), needle));
      }
    };
    const std::vector<DTensor> ps{p};
    expect([&] { nn::SGD<DTensor>(ps, {.sharding = {.state_layouts = {rows, rows}}}); }, "2 state layouts for 1",
           "count");
    expect([&] { nn::SGD<DTensor>(ps, {.sharding = {.state_layouts = {Layout::replicated(mesh.ndim())}}}); },
           "rank 0 would update rows it does not hold", "not nested");
    expect([&] { nn::AdamW<DTensor>(ps, {.sharding = {.state_layouts = {rows.with(0, Partial{})}}}); },
           "holds a Partial", "Partial");
    expect([&] { nn::AdamW<DTensor>(ps, {.sharding = {.buckets = {.bucket_mib = 0}}}); }, "bucket_mib = 0", "bucket");
    expect([&] { nn::SGD<Tensor>({leaf(values({2}, 3))}, {.sharding = {.state_layouts = {rows}}}); },
           "layouts are for DTensors", "Tensor");
  });
  testing::check_no_failures(log.failures);
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
