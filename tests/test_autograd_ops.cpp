// Gradient check of every registered op, driven by the op suite's samples
// (op_cases.h): every op has a backward rule or the not-differentiable
// mark; for each op with a rule and each sample with floating inputs (cast
// to f64), central finite differences on plain Tensors agree with the
// backward; and over the op suite's input-layout combinations on meshes 4,
// 2x2 and 2x3, the DTensor gradients' full tensors equal the unsharded
// ones. The loss is sum(y * w) with a fixed random w, so every output
// element matters.
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "dtensor/core/hash.h"
#include "op_cases.h"
#include "support.h"

using namespace dtensor;

namespace autograd_ops {

// Layout combinations per sample and mesh (sampled, seeded, past this),
// fewer than the forward suite's 160: each runs a forward and a backward.
constexpr std::size_t kMaxCombos = 12;
// Elements per input perturbed by the finite differences (sampled past this).
constexpr std::size_t kMaxElements = 200;

const std::vector<Shape> kMeshes = testing::backend_meshes({{4}, {2, 2}, {2, 3}});

std::vector<std::string> registered_ops() { return OpRegistry::global().names(); }

std::vector<std::string> ops_with_rules() {
  std::vector<std::string> out;
  for (const std::string& name : registered_ops()) {
    const OpDef& def = Op::find(name).def();
    if (backward_rule(def) && !is_not_differentiable(def)) out.push_back(name);
  }
  return out;
}

// Ops that are piecewise linear with kinks (ties, zero): an element whose
// one-sided differences disagree sits on a kink, where only a subgradient
// exists; it is skipped and counted.
const std::set<std::string> kPiecewise = {"abs", "relu", "maximum", "minimum", "max", "min"};

/// Whether input i of `op` has a gradient: a floating input, except where's
/// condition (a selector, not a value).
bool differentiable_input(const std::string& op, std::size_t i, const Tensor& t) {
  return is_floating(t.dtype()) && !(op == "where" && i == 0);
}

/// The sample with its floating inputs in f64.
testing::OpSample in_f64(const testing::OpSample& s) {
  testing::OpSample out = s;
  for (Tensor& t : out.inputs)
    if (is_floating(t.dtype()) && t.dtype() != DType::Float64) t = to(t, DType::Float64);
  return out;
}

std::uint64_t seed_of(const std::string& op) { return fnv1a(op) % 100000; }

Tensor loss_weight(const Shape& shape, std::uint64_t seed) {
  return testing::uniform(shape, DType::Float64, seed ^ 0x5eed, -1, 1);
}

/// sum(y * w), in f64 whatever y's dtype.
template <class X>
X weighted_sum(const X& y, const X& w) {
  return sum(mul(y.dtype() == DType::Float64 ? y : to(y, DType::Float64), w));
}

/// The gradients of sum(op(inputs) * w) by backward on plain Tensors (zeros
/// where an input gets none).
std::vector<Tensor> backward_grads(const std::string& op, const testing::OpSample& s, std::uint64_t seed) {
  std::vector<Tensor> in = s.inputs;
  for (std::size_t i = 0; i < in.size(); ++i)
    if (differentiable_input(op, i, in[i])) in[i].requires_grad_();
  const Tensor y = call_op(op, std::span<const Tensor>(in), s.attrs);
  weighted_sum(y, loss_weight(y.shape(), seed)).backward();
  std::vector<Tensor> out;
  for (const Tensor& x : in) out.push_back(x.grad() ? *x.grad() : Tensor::zeros(x.shape(), x.dtype()));
  return out;
}

/// The samples of `op` that the checks use, and why the others are left out.
struct Usable {
  std::vector<std::size_t> index;
  std::vector<testing::OpSample> samples;  // in f64
  std::map<std::string, int> skipped;      // reason -> count
};

Usable usable_samples(const std::string& op, std::mt19937_64& rng) {
  Usable u;
  auto found = testing::op_samples().find(op);
  if (found == testing::op_samples().end()) return u;  // test_ops reports it
  const std::vector<testing::OpSample> all = found->second(rng);
  for (std::size_t si = 0; si < all.size(); ++si) {
    const testing::OpSample s = in_f64(all[si]);
    bool any = false;
    for (std::size_t i = 0; i < s.inputs.size(); ++i) any = any || differentiable_input(op, i, s.inputs[i]);
    if (!any) {
      ++u.skipped["no floating input"];
      continue;
    }
    DType out_dtype;
    {
      NoGradGuard no_grad;
      out_dtype = call_op(op, std::span<const Tensor>(s.inputs), s.attrs).dtype();
    }
    if (!is_floating(out_dtype)) {
      ++u.skipped["integer output"];
      continue;
    }
    // A rule may refuse a form it does not handle with a typed error saying
    // so (einsum's repeated subscripts): counted and named, not a pass.
    try {
      backward_grads(op, s, 0);
    } catch (const AutogradError& e) {
      if (std::string(e.what()).find("not supported") == std::string::npos) throw;
      ++u.skipped[fmt::format("the rule refuses it ({})", e.what())];
      continue;
    }
    u.index.push_back(si);
    u.samples.push_back(s);
  }
  return u;
}

std::string describe(const Tensor& t) { return fmt::format("{} {}", t.dtype(), fmt::join(t.shape(), "x")); }

}  // namespace autograd_ops
using namespace autograd_ops;

BOOST_AUTO_TEST_SUITE(autograd_ops)

// A missing rule would otherwise surface only when a user's gradient first
// passes through the op.
BOOST_AUTO_TEST_CASE(every_registered_op_has_a_backward_or_the_not_differentiable_mark) {
  std::vector<std::string> missing;
  for (const std::string& name : registered_ops()) {
    const OpDef& def = Op::find(name).def();
    const bool rule = backward_rule(def) != nullptr;
    const bool marked = is_not_differentiable(def);
    if (!rule && !marked) missing.push_back(name);
    BOOST_TEST(!(rule && marked),
               "op '" << name << "' has a backward rule and the not-differentiable mark; expected one");
    // No higher-order gradients: the backward ops are not differentiated.
    if (name.ends_with("_backward"))
      BOOST_TEST(marked, "backward op '" << name << "' is not marked not differentiable");
  }
  BOOST_TEST(missing.empty(), "ops with neither a backward rule nor the not-differentiable mark: "
                                  << fmt::format("{}", fmt::join(missing, ", ")));
}

// An integer output has no gradient (its derivative is zero almost
// everywhere), so it never requires one: the cast back of a truncated
// gradient would otherwise reach its inputs.
BOOST_AUTO_TEST_CASE(integer_outputs_never_require_a_gradient) {
  std::size_t checked = 0;
  for (const std::string& op : registered_ops()) {
    auto found = testing::op_samples().find(op);
    if (found == testing::op_samples().end()) continue;
    std::mt19937_64 rng(seed_of(op));
    for (const testing::OpSample& sample : found->second(rng)) {
      testing::OpSample s = in_f64(sample);
      bool any = false;
      for (std::size_t i = 0; i < s.inputs.size(); ++i)
        if (differentiable_input(op, i, s.inputs[i])) {
          s.inputs[i].requires_grad_();
          any = true;
        }
      if (!any) continue;
      const Tensor y = call_op(op, std::span<const Tensor>(s.inputs), s.attrs);
      if (is_floating(y.dtype())) continue;
      BOOST_TEST(!y.requires_grad(),
                 "op " << op << ": its " << fmt::format("{}", y.dtype()) << " output requires a gradient");
      ++checked;
    }
  }
  BOOST_TEST(checked > 0u);  // to(x, Int64) and argmax at least
}

BOOST_DATA_TEST_CASE(finite_differences_agree_with_backward, boost::unit_test::data::make(ops_with_rules()), op) {
  const std::uint64_t seed = testing::seeded(seed_of(op));
  std::mt19937_64 rng(seed);
  const Usable u = usable_samples(op, rng);
  std::size_t checked = 0, kinks = 0;
  for (std::size_t n = 0; n < u.samples.size(); ++n) {
    const testing::OpSample& s = u.samples[n];
    const std::vector<Tensor> got = backward_grads(op, s, seed);
    NoGradGuard no_grad;
    const Tensor y0 = call_op(op, std::span<const Tensor>(s.inputs), s.attrs);
    const Tensor w = loss_weight(y0.shape(), seed);
    auto loss = [&](const std::vector<Tensor>& xs) {
      return weighted_sum(call_op(op, std::span<const Tensor>(xs), s.attrs), w).get({});
    };
    const double f0 = loss(s.inputs);
    // Through a lower-precision output: a step its rounding does not swamp.
    const bool lowp = y0.dtype() != DType::Float64;
    const double eps = lowp ? 1e-2 : 1e-6;
    const double tol = lowp ? 1e-3 : 1e-6;
    for (std::size_t i = 0; i < s.inputs.size(); ++i) {
      if (!differentiable_input(op, i, s.inputs[i])) continue;
      const auto numel_i = static_cast<std::size_t>(s.inputs[i].numel());
      std::vector<std::int64_t> elements(numel_i);
      for (std::size_t k = 0; k < numel_i; ++k) elements[k] = static_cast<std::int64_t>(k);
      const std::size_t keep = testing::scaled_cases(std::min(numel_i, kMaxElements), 8);
      if (numel_i > keep) {
        std::shuffle(elements.begin(), elements.end(), rng);
        elements.resize(keep);
      }
      std::vector<Tensor> plus = s.inputs, minus = s.inputs;
      plus[i] = s.inputs[i].clone();
      minus[i] = s.inputs[i].clone();
      std::size_t bad = 0;
      double worst = 0, worst_numeric = 0, worst_analytic = 0;
      std::int64_t worst_k = -1;
      for (std::int64_t k : elements) {
        const double x = s.inputs[i].data_as<double>()[k];
        plus[i].data_as<double>()[k] = x + eps;
        minus[i].data_as<double>()[k] = x - eps;
        const double fp = loss(plus), fm = loss(minus);
        plus[i].data_as<double>()[k] = x;
        minus[i].data_as<double>()[k] = x;
        if (kPiecewise.count(op) && std::abs(fp - 2 * f0 + fm) > 1e-9 * (1 + std::abs(f0))) {
          ++kinks;
          continue;
        }
        const double numeric = (fp - fm) / (2 * eps);
        const double analytic = got[i].data_as<double>()[k];
        const double err = std::abs(numeric - analytic) / (1 + std::abs(numeric));
        if (!testing::within(err, tol)) ++bad;
        if (err >= worst) {
          worst = err;
          worst_k = k;
          worst_numeric = numeric;
          worst_analytic = analytic;
        }
        ++checked;
      }
      BOOST_TEST(bad == 0u, "op " << op << " sample " << u.index[n] << " input " << i << " (" << describe(s.inputs[i])
                                  << ") seed " << seed << ": " << bad << " of " << elements.size()
                                  << " elements off by more than " << tol << "; worst element " << worst_k
                                  << ": backward " << worst_analytic << ", finite differences " << worst_numeric);
    }
  }
  for (const auto& [reason, count] : u.skipped)
    BOOST_TEST_MESSAGE("op " << op << ": " << count << " sample(s) skipped: " << reason);
  if (kinks) BOOST_TEST_MESSAGE("op " << op << ": " << kinks << " element(s) skipped at a kink (tie or zero)");
  BOOST_TEST(checked > 0u, "op " << op << " has a backward rule but no sample with a floating input to check it on");
  BOOST_TEST_MESSAGE("op " << op << ": " << checked << " elements checked by finite differences");
}

BOOST_DATA_TEST_CASE(dtensor_gradients_equal_the_unsharded_ones, boost::unit_test::data::make(ops_with_rules()), op) {
  const std::uint64_t seed = testing::seeded(seed_of(op));
  std::mt19937_64 rng(seed);
  const Usable u = usable_samples(op, rng);
  std::size_t runs = 0;
  for (const Shape& mesh_shape : kMeshes) {
    for (std::size_t n = 0; n < u.samples.size(); ++n) {
      const testing::OpSample& s = u.samples[n];
      const std::vector<Tensor> expected = backward_grads(op, s, seed);
      Tensor w;
      {
        NoGradGuard no_grad;
        w = loss_weight(call_op(op, std::span<const Tensor>(s.inputs), s.attrs).shape(), seed);
      }
      std::vector<std::vector<Layout>> combos = testing::input_layout_combos(mesh_shape, s);
      const std::size_t max_combos = testing::scaled_cases(std::min(combos.size(), kMaxCombos), 4);
      if (combos.size() > max_combos) {
        std::shuffle(combos.begin(), combos.end(), rng);
        combos.resize(max_combos);
      }
      std::string current;
      std::vector<std::string> failures;
      try {
        testing::run_ranks(static_cast<int>(numel(mesh_shape)), [&](Communicator& comm) {
          DeviceMesh mesh(comm, mesh_shape);
          const DTensor dw = distribute_tensor(w, mesh, Layout::replicated(mesh.ndim()));
          for (const auto& combo : combos) {
            if (testing::reports_results(comm))
              current = fmt::format("op {} sample {} mesh {} inputs {} seed {}", op, u.index[n],
                                    fmt::join(mesh_shape, "x"), fmt::join(combo, " | "), seed);
            std::vector<DTensor> args;
            for (std::size_t i = 0; i < combo.size(); ++i) {
              const Layout l = validate_layout(combo[i], mesh_shape, s.inputs[i].shape());
              args.push_back(
                  DTensor::from_local(testing::source_shard(s.inputs[i], mesh_shape, l, mesh.coordinate(), seed + i),
                                      mesh, l, s.inputs[i].shape()));
              if (differentiable_input(op, i, s.inputs[i])) args.back().requires_grad_();
            }
            weighted_sum(call_op(op, std::span<const DTensor>(args), s.attrs), dw).backward();
            for (std::size_t i = 0; i < args.size(); ++i) {
              if (!differentiable_input(op, i, s.inputs[i])) continue;
              const std::optional<DTensor> g = args[i].grad();
              const std::string layout = g ? fmt::format("{}", g->placements()) : std::string("none");
              const Tensor got = g ? g->full_tensor() : Tensor::zeros(s.inputs[i].shape(), DType::Float64);
              if (testing::reports_results(comm) && !allclose(got, expected[i], 1e-9, 1e-9))
                failures.push_back(
                    fmt::format("{}: the gradient of input {} ({}) differs from the unsharded one by {}"
                                " (gradient layout {})",
                                current, i, describe(s.inputs[i]), max_abs_diff(got, expected[i]), layout));
            }
          }
        });
      } catch (const std::exception& e) {
        failures.push_back(fmt::format("{}: {}", current, e.what()));
      }
      runs += combos.size();
      testing::check_no_failures(failures);
    }
  }
  BOOST_TEST_MESSAGE("op " << op << ": " << runs << " layout combinations checked");
}

BOOST_AUTO_TEST_SUITE_END()
