// The backward in two halves (backward_input, DeferredGradients): the input
// gradient first, the weights' later, together the gradients of one backward,
// with each half computing only its own part (part of test_autograd).
#include <boost/test/unit_test.hpp>

#include <mutex>
#include <optional>

#include <dtensor/api/split_backward.h>

#include "checks.h"
#include "support.h"

using namespace dtensor;

namespace autograd_split_suite {
namespace {

Tensor uniform(const Shape& shape, std::uint64_t seed) {
  Tensor t = Tensor::rand(shape, DType::Float64, seed);
  double* p = t.data_as<double>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = 2 * p[i] - 1;
  return t;
}

// A stage of a pipeline: x -> tanh(x W1^T + b1) W2^T, plus x again (a
// residual, so that x's gradient arrives by two routes).
template <class X>
X stage(const X& x, const X& w1, const X& b1, const X& w2) {
  return add(linear(tanh(linear(x, w1, b1)), w2), x);
}

struct Leaves {
  Tensor x, w1, b1, w2;
  std::vector<Tensor*> all() { return {&x, &w1, &b1, &w2}; }
};

Leaves fresh_leaves() {
  Leaves l{uniform({5, 6}, 1), uniform({4, 6}, 2), uniform({4}, 3), uniform({6, 4}, 4)};
  for (Tensor* t : l.all()) *t = t->detach().requires_grad_();
  return l;
}

bool same_grad(const Tensor& a, const Tensor& b) {
  return a.grad() && b.grad() && allclose(*a.grad(), *b.grad(), 1e-13, 1e-13);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(autograd_split)

BOOST_AUTO_TEST_CASE(the_two_halves_give_the_gradients_of_one_backward) {
  const Tensor g = uniform({5, 6}, 9);
  Leaves whole = fresh_leaves();
  stage(whole.x, whole.w1, whole.b1, whole.w2).backward(g);

  Leaves split = fresh_leaves();
  const Tensor y = stage(split.x, split.w1, split.b1, split.w2);
  const Tensor inputs[] = {split.x};
  DeferredGradients weights = backward_input(y, g, inputs);
  // The first half: the input's gradient only.
  BOOST_TEST(same_grad(split.x, whole.x));
  BOOST_TEST(!split.w1.grad().has_value());
  BOOST_TEST(!split.b1.grad().has_value());
  BOOST_TEST(!split.w2.grad().has_value());
  BOOST_TEST(weights.pending());
  // The second half: the weights', as one backward gave them; x's is unchanged.
  weights.run();
  BOOST_TEST(!weights.pending());
  BOOST_TEST(same_grad(split.w1, whole.w1));
  BOOST_TEST(same_grad(split.b1, whole.b1));
  BOOST_TEST(same_grad(split.w2, whole.w2));
  BOOST_TEST(same_grad(split.x, whole.x));
  testing::check_throws<AutogradError>([&] { weights.run(); }, "twice");
}

// Microbatches accumulate: two split backwards, their W's run late and in
// the other order (as a zero-bubble schedule defers them), sum like two
// backwards.
BOOST_AUTO_TEST_CASE(deferred_halves_accumulate_in_any_order) {
  const Tensor g0 = uniform({5, 6}, 11), g1 = uniform({5, 6}, 12);
  Leaves whole = fresh_leaves();
  stage(whole.x, whole.w1, whole.b1, whole.w2).backward(g0);
  stage(whole.x, whole.w1, whole.b1, whole.w2).backward(g1);

  Leaves split = fresh_leaves();
  const Tensor inputs[] = {split.x};
  DeferredGradients first = backward_input(stage(split.x, split.w1, split.b1, split.w2), g0, inputs);
  DeferredGradients second = backward_input(stage(split.x, split.w1, split.b1, split.w2), g1, inputs);
  BOOST_TEST(!split.w1.grad().has_value());
  second.run();
  first.run();
  for (auto [a, b] :
       {std::pair{&split.w1, &whole.w1}, {&split.b1, &whole.b1}, {&split.w2, &whole.w2}, {&split.x, &whole.x}})
    BOOST_TEST(same_grad(*a, *b));
}

// A tensor-parallel MLP: the weights wait for the second half, and the two
// halves together issue the collectives one backward issues, with the same
// gradients.
BOOST_AUTO_TEST_CASE(tensor_parallel_halves_issue_one_backwards_collectives) {
  if (!testing::can_run(4)) return;
  const Tensor x = uniform({6, 8}, 21), w1 = uniform({12, 8}, 22), w2 = uniform({8, 12}, 23), g = uniform({6, 8}, 24);
  std::vector<std::string> failures;
  std::mutex mu;
  testing::run_ranks(4, [&](Communicator& comm) {
    DeviceMesh mesh(comm, {4}, {"tp"});
    auto leaves = [&] {
      std::vector<DTensor> l{distribute_tensor(x, mesh, Layout::parse("R")),
                             distribute_tensor(w1, mesh, Layout::parse("S(0)")),
                             distribute_tensor(w2, mesh, Layout::parse("S(1)"))};
      for (DTensor& t : l) t.requires_grad_();
      return l;
    };
    const DTensor grad = distribute_tensor(g, mesh, Layout::parse("R"));
    auto mlp = [](const std::vector<DTensor>& l) {
      return linear(gelu(linear(l[0], l[1])), l[2]).redistribute(Layout::parse("R"));
    };
    std::vector<DTensor> whole = leaves();
    const DTensor y_whole = mlp(whole);
    CommCounter one(mesh);
    y_whole.backward(grad);
    const CommStats one_backward = one.counts();

    std::vector<DTensor> split = leaves();
    const DTensor y = mlp(split);
    CommCounter halves(mesh);
    const DTensor inputs[] = {split[0]};
    DeferredGradients weights = backward_input(y, grad, inputs);
    const bool weights_waited = !split[1].grad() && !split[2].grad();
    weights.run();
    const CommStats both = halves.counts();
    std::string why;
    if (!weights_waited) why += " a weight got its gradient in the first half;";
    if (both.data_collectives() != one_backward.data_collectives() ||
        both.count(CollectiveKind::AllReduce) != one_backward.count(CollectiveKind::AllReduce))
      why += fmt::format(" the halves issued {}, one backward {};", both, one_backward);
    for (std::size_t i = 0; i < 3; ++i)
      if (!allclose(split[i].grad()->full_tensor(), whole[i].grad()->full_tensor(), 1e-12, 1e-12))
        why += fmt::format(" leaf {}'s gradient differs;", i);
    if (!why.empty()) {
      std::lock_guard lock(mu);
      failures.push_back("tensor-parallel split backward:" + why);
    }
  });
  testing::check_no_failures(failures);
}

BOOST_AUTO_TEST_CASE(bad_inputs_are_named) {
  Leaves l = fresh_leaves();
  const Tensor g = uniform({5, 6}, 31);
  const Tensor hidden = tanh(l.x);
  const Tensor out = stage(l.x, l.w1, l.b1, l.w2);
  const Tensor not_leaf[] = {hidden};
  testing::check_throws<AutogradError>([&] { backward_input(out, g, not_leaf); }, "input 0 is not a leaf");
  Tensor other = uniform({5, 6}, 32).requires_grad_();
  const Tensor unreached[] = {other};
  testing::check_throws<AutogradError>([&] { backward_input(out, g, unreached); }, "none of the inputs");
  const Tensor self[] = {l.x};
  testing::check_throws<AutogradError>([&] { backward_input(l.x, g, self); }, "nothing to split");
  testing::check_throws<ShapeError>([&] { backward_input(out, uniform({6, 5}, 33), self); }, "grad_output");
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace autograd_split_suite
