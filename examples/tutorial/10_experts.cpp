// Tutorial step 10: expert parallelism. A mixture-of-experts layer of 8
// expert MLPs on a mesh dim "ep" of 4 ranks: the experts' weights are S(0)
// over ep (two whole experts per rank), the tokens are S(0) as under data
// parallelism, and each rank routes its own tokens. The rows travel to
// their experts by one all_to_allv and back by another, after one small
// all_to_all of the counts; the backward runs the two the other way. The
// output and the experts' gradient equal one rank's.
//   build/examples/tutorial/tutorial_10_experts
#include "tutorial.h"

#include <numeric>

#include <dtensor/nn/moe.h>

using namespace dtensor;

namespace {

constexpr std::int64_t kExperts = 8, kDim = 16, kHidden = 4 * kDim;

// The layer's five weights, seeded, either whole or laid out on a mesh.
template <class X>
nn::MoE<X> make_layer(const std::function<X(const Tensor&, const Layout&)>& place) {
  const Layout replicated = Layout::parse("R"), by_expert = Layout::parse("S(0)");
  auto weight = [&](Shape shape, std::uint64_t seed, const Layout& layout) {
    X w = place(mul(Tensor::randn(std::move(shape), DType::Float64, seed), 0.3), layout);
    w.requires_grad_();
    return w;
  };
  return {weight({kExperts, kDim}, 1, replicated),
          weight({kExperts, kHidden, kDim}, 2, by_expert),
          weight({kExperts, kHidden}, 3, by_expert),
          weight({kExperts, kDim, kHidden}, 4, by_expert),
          weight({kExperts, kDim}, 5, by_expert),
          {.experts = kExperts, .top_k = 2, .aux_loss = 0.01}};
}

}  // namespace

int main(int argc, char** argv) {
  return launch(argc, argv,
                [](Communicator& world) {
                  DeviceMesh mesh(world, {4}, {"ep"});
                  const Tensor x_full = Tensor::randn({8, 4, kDim}, DType::Float64, 6);  // 8 sequences of 4 tokens
                  const Tensor dy_full = Tensor::randn({8, 4, kDim}, DType::Float64, 7);
                  const nn::MoE<DTensor> layer = make_layer<DTensor>(
                      [&](const Tensor& full, const Layout& layout) { return distribute_tensor(full, mesh, layout); });
                  const DTensor x = distribute_tensor(x_full, mesh, Layout::parse("S(0)"));  // 2 sequences per rank
                  const DTensor dy = distribute_tensor(dy_full, mesh, Layout::parse("S(0)"));

                  CommTree tree(mesh);
                  const DTensor y = [&] {
                    CommScope forward("forward");
                    return layer(x);
                  }();
                  y.backward(dy);  // counted under "backward"
                  const std::string tree_text = tree.text();

                  // The same layer on one rank.
                  const nn::MoE<Tensor> one = make_layer<Tensor>([](const Tensor& full, const Layout&) { return full.clone(); });
                  const Tensor y_one = one(x_full);
                  y_one.backward(dy_full);

                  const nn::MoEState<DTensor>& s = *layer.state;
                  tutorial::print_in_rank_order(world, fmt::format("rank {}: holds experts {} and {}; sends rows {} to ranks 0-3, receives {}\n",
                                                   world.rank(), 2 * world.rank(), 2 * world.rank() + 1,
                                                   fmt::join(s.sent_rows, " "), fmt::join(s.received_rows, " ")));
                  const Tensor y_got = y.full_tensor();
                  const Tensor grad_got = layer.fc_weight.grad()->full_tensor();
                  if (world.rank() == 0) {
                    const std::int64_t routed = std::accumulate(s.last_load.begin(), s.last_load.end(), std::int64_t{0});
                    fmt::print("the batch's load per expert: {} ({} tokens x 2 choices = {})\n",
                               fmt::join(s.last_load, " "), 8 * 4, routed);
                    fmt::print("experts.fc.weight is {} of shape [{}]; each rank holds [{}]\n",
                               layer.fc_weight.placements(), fmt::join(layer.fc_weight.shape(), ", "),
                               fmt::join(layer.fc_weight.to_local().shape(), ", "));
                    fmt::print("collectives by scope:\n{}", tree_text);
                    fmt::print("output equals one rank's (to 1e-12): {}\n", max_abs_diff(y_got, y_one) < 1e-12);
                    fmt::print("experts' gradient equals one rank's (to 1e-12): {}\n",
                               max_abs_diff(grad_got, *one.fc_weight.grad()) < 1e-12);
                  }
                },
                {.default_ranks = 4});
}
