// Tutorial step 6: data parallelism and Partial gradients. The weight is
// replicated over dp and the batch split, so each rank's backward sees only
// its quarter of the batch: W.grad() comes out Partial(sum), four addends
// of the true gradient, and nothing is sent during backward. The optimizer
// step reduces it to W's layout with one all_reduce (DDP's), then updates.
// A CommTree shows where each collective happened.
//   build/examples/tutorial/tutorial_06_data_parallel
#include "tutorial.h"

#include <dtensor/nn/optim.h>

using namespace dtensor;

int main(int argc, char** argv) {
  return launch(argc, argv,
                [](Communicator& world) {
                  DeviceMesh mesh(world, {4}, {"dp"});
                  const Tensor x_full = Tensor::randn({16, 8}, DType::Float64, 1);
                  const Tensor w_full = Tensor::randn({4, 8}, DType::Float64, 2);

                  const DTensor x = distribute_tensor(x_full, mesh, Layout::parse("S(0)"));  // 4 samples per rank
                  DTensor w = distribute_tensor(w_full, mesh, Layout::parse("R"));
                  w.requires_grad_();
                  nn::SGDOptions plain_sgd;
                  plain_sgd.lr = 0.1;
                  nn::SGD<DTensor> optimizer({w}, plain_sgd);

                  CommTree tree(mesh);
                  const DTensor loss = [&] {
                    CommScope forward("forward");  // counted under "forward" until it closes
                    const DTensor y = linear(x, w);
                    return sum(mul(y, y));
                  }();
                  loss.backward();  // counted under "backward"
                  const DTensor partial_grad = *w.grad();
                  optimizer.step();  // counted under "optimizer"
                  const std::string tree_text = tree.text();

                  // The same step on one rank, for comparison.
                  Tensor w_one = w_full.clone();
                  w_one.requires_grad_();
                  sum(mul(linear(x_full, w_one), linear(x_full, w_one))).backward();
                  const Tensor w_want = sub(w_full, mul(*w_one.grad(), 0.1));

                  const Tensor w_got = w.full_tensor();
                  if (world.rank() == 0) {
                    fmt::print("loss is {}; W.grad() after backward is {}\n", loss.placements(),
                               partial_grad.placements());
                    fmt::print("collectives by scope:\n{}", tree_text);
                    fmt::print("W after one SGD step equals the single-rank step (to 1e-12): {}\n",
                               max_abs_diff(w_got, w_want) < 1e-12);
                  }
                },
                {.default_ranks = 4});
}
