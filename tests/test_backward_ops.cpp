// The backward family against the forward ops it differentiates: for a
// fixed random weight W, the gradient of L = sum(W * forward(inputs)) with
// respect to one input, by central differences in f64, equals the backward
// op given W as the output's gradient. (The op suite, test_ops, checks the
// same ops on every layout against their unsharded results.)
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <random>

#include <dtensor/dtensor.h>

#include "support.h"

using namespace dtensor;

namespace {

using Forward = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor uniform(const Shape& shape, std::uint64_t seed, double lo = -2, double hi = 2) {
  return call_op("add_scalar",
                 {call_op("mul_scalar", {Tensor::rand(shape, DType::Float64, seed)}, ScalarAttrs{hi - lo})},
                 ScalarAttrs{lo});
}

double weighted_sum(const Tensor& y, const Tensor& w) {
  double s = 0;
  const double* py = y.data_as<double>();
  const double* pw = w.data_as<double>();
  for (std::int64_t i = 0; i < y.numel(); ++i) s += py[i] * pw[i];
  return s;
}

// d/d inputs[which] of sum(w * f(inputs)) by central differences.
Tensor numeric_gradient(const Forward& f, std::vector<Tensor> inputs, std::size_t which, const Tensor& w) {
  constexpr double h = 1e-6;
  Tensor x = inputs[which];
  Tensor grad = Tensor::zeros(x.shape(), DType::Float64);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    Tensor moved = Tensor::empty(x.shape(), DType::Float64);
    std::copy(x.data_as<double>(), x.data_as<double>() + x.numel(), moved.data_as<double>());
    inputs[which] = moved;
    const double at = x.data_as<double>()[i];
    moved.data_as<double>()[i] = at + h;
    const double up = weighted_sum(f(inputs), w);
    moved.data_as<double>()[i] = at - h;
    const double down = weighted_sum(f(inputs), w);
    grad.data_as<double>()[i] = (up - down) / (2 * h);
  }
  return grad;
}

// Checks `analytic` against the finite differences of f at `inputs`.
void check_gradient(const std::string& what, const Forward& f, const std::vector<Tensor>& inputs, std::size_t which,
                    const Tensor& w, const Tensor& analytic) {
  const Tensor numeric = numeric_gradient(f, inputs, which, w);
  BOOST_TEST(allclose(analytic, numeric, 1e-6, 1e-7),
             fmt::format("{}: backward op {}\nfinite differences {}\nmax |diff| {}", what, analytic, numeric,
                         max_abs_diff(analytic, numeric)));
}

Forward op(std::string name, OpAttrs attrs = {}) {
  return [name, attrs](const std::vector<Tensor>& in) { return call_op(name, std::span<const Tensor>(in), attrs); };
}

Tensor indices(const Shape& shape, std::int64_t bound, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int64_t> v(static_cast<std::size_t>(numel(shape)));
  for (auto& x : v) x = static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(bound));
  return Tensor::from_vector<std::int64_t>(v, shape);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(backward_ops_gradients)

BOOST_AUTO_TEST_CASE(activations) {
  const Tensor x = uniform({4, 5}, 1, -4, 4), w = uniform({4, 5}, 2);
  for (const char* f : {"gelu", "silu"}) {
    BOOST_TEST_CONTEXT("op " << f << ", seeds 1, 2") {
      check_gradient(f, op(f), {x}, 0, w, call_op(std::string(f) + "_backward", {x, w}));
    }
  }
}

BOOST_AUTO_TEST_CASE(softmax_and_log_softmax) {
  const Tensor x = uniform({3, 4, 5}, 3, -3, 3), w = uniform({3, 4, 5}, 4);
  for (const char* f : {"softmax", "log_softmax"})
    for (std::int64_t dim : {0, 1, -1}) {
      BOOST_TEST_CONTEXT("op " << f << " dim " << dim << ", seeds 3, 4") {
        const DimAttrs attrs{.dim = dim};
        const Tensor y = call_op(f, {x}, attrs);
        check_gradient(f, op(f, attrs), {x}, 0, w, call_op(std::string(f) + "_backward", {y, w}, attrs));
      }
    }
}

BOOST_AUTO_TEST_CASE(layer_norm_and_rms_norm) {
  const Tensor x = uniform({3, 4, 5}, 5), w = uniform({3, 4, 5}, 6);
  for (bool rms : {false, true})
    for (int k : {1, 2}) {
      const std::string f = rms ? "rms_norm" : "layer_norm";
      BOOST_TEST_CONTEXT("op " << f << " normalized_ndim " << k << ", seeds 5..8") {
        const Shape trailing(x.shape().end() - k, x.shape().end());
        const Tensor weight = uniform(trailing, 7, 0.5, 1.5);
        const NormAttrs with_weight{.normalized_ndim = k, .weight = true, .bias = !rms, .eps = 1e-5};
        std::vector<Tensor> in{x, weight};
        if (!rms) in.push_back(uniform(trailing, 8));
        check_gradient(f + " dx", op(f, with_weight), in, 0, w, call_op(f + "_backward", {x, w, weight}, with_weight));
        check_gradient(f + " dweight", op(f, with_weight), in, 1, w,
                       call_op(f + "_weight_backward", {x, w}, with_weight));
        const NormAttrs plain{.normalized_ndim = k, .eps = 1e-5};
        check_gradient(f + " dx without weight", op(f, plain), {x}, 0, w, call_op(f + "_backward", {x, w}, plain));
        if (!rms) {  // the bias gradient is the existing sum over the leading dims
          std::vector<std::int64_t> lead;
          for (int d = 0; d < x.dim() - k; ++d) lead.push_back(d);
          check_gradient("layer_norm dbias", op(f, with_weight), in, 2, w,
                         call_op("sum", {w}, ReduceAttrs{.dims = lead}));
        }
      }
    }
}

BOOST_AUTO_TEST_CASE(embedding) {
  const Tensor idx = indices({3, 4}, 5, 9), table = uniform({5, 3}, 10), w = uniform({3, 4, 3}, 11);
  const Forward f = [&](const std::vector<Tensor>& in) { return call_op("embedding", {idx, in[0]}); };
  check_gradient("embedding", f, {table}, 0, w, call_op("embedding_backward", {idx, w, table}));
}

BOOST_AUTO_TEST_CASE(cross_entropy_rows) {
  const Tensor z = uniform({4, 6}, 12, -3, 3), t = indices({4}, 6, 13), w = uniform({4}, 14);
  auto lse = [](const Tensor& z) {
    return call_op("log", {call_op("sum", {call_op("exp", {z})}, ReduceAttrs{.dims = {1}})});
  };
  // The per-row loss: lse(z) - z[target].
  const Forward f = [&](const std::vector<Tensor>& in) {
    return call_op("sub", {lse(in[0]), call_op("pick", {in[0], t})});
  };
  check_gradient("cross_entropy", f, {z}, 0, w, call_op("cross_entropy_backward", {z, t, lse(z), w}));
}

BOOST_AUTO_TEST_CASE(max_and_min) {
  const Tensor x = uniform({3, 4, 5}, 15);
  const std::vector<std::vector<std::int64_t>> dims{{1}, {0, 2}, {}};
  for (const char* f : {"max", "min"})
    for (const auto& d : dims)
      for (bool keepdim : {false, true}) {
        BOOST_TEST_CONTEXT("op " << f << " dims (" << fmt::format("{}", fmt::join(d, ",")) << ") keepdim " << keepdim
                                 << ", seeds 15, 16") {
          const ReduceAttrs attrs{.dims = d, .keepdim = keepdim};
          const Tensor w = uniform(call_op(f, {x}, attrs).shape(), 16);
          check_gradient(f, op(f, attrs), {x}, 0, w, call_op(std::string(f) + "_backward", {x, w}, attrs));
        }
      }
}

BOOST_AUTO_TEST_CASE(sum_to_shape_undoes_broadcasting) {
  const Tensor zeros = Tensor::zeros({3, 5, 6}, DType::Float64), w = uniform({3, 5, 6}, 17);
  for (const Shape& s : {Shape{5, 1}, Shape{6}, Shape{1, 1, 1}, Shape{3, 5, 6}, Shape{}}) {
    BOOST_TEST_CONTEXT("shape (" << fmt::format("{}", fmt::join(s, ",")) << "), seed 17") {
      const Forward f = [&](const std::vector<Tensor>& in) { return call_op("add", {in[0], zeros}); };
      check_gradient("sum_to_shape", f, {uniform(s, 18)}, 0, w, call_op("sum_to_shape", {w}, ShapeAttrs{.shape = s}));
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
